#!/usr/bin/env bash
# The one run command: a local control plane, a handful of sample Nodes, and netcm in the foreground.
#
#   hack/local-up.sh            (Ctrl-C stops netcm; the control plane keeps running: hack/controlplane.sh down)
#
# The route-controller is left off here: it programs kernel routes and needs NET_ADMIN on a gateway host
# (see README); the e2e suite runs it inside network namespaces.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

bash hack/install-prereqs.sh >/dev/null
kubeconfig_line=$(bash hack/controlplane.sh up | tail -1)
export KUBECONFIG=${kubeconfig_line#KUBECONFIG=}
kubectl=$(bash hack/controlplane.sh bin kubectl)

echo "installing the chart's CRDs (PodCIDRClaim)"
"$kubectl" apply --server-side --field-manager=netcm-local-up -f charts/netcm/crds/ >/dev/null
"$kubectl" wait --for=condition=Established --timeout=60s -f charts/netcm/crds/ >/dev/null

echo "registering sample Nodes"
for i in 1 2 3 4 5; do
  cat <<YAML | "$kubectl" apply -f - >/dev/null
apiVersion: v1
kind: Node
metadata:
  name: sample-node-$i
  labels: {netcm.io/sample: "true"}
YAML
  "$kubectl" patch node "sample-node-$i" --subresource=status --type=merge \
    -p "{\"status\":{\"addresses\":[{\"type\":\"InternalIP\",\"address\":\"192.0.2.1$i\"},{\"type\":\"InternalIP\",\"address\":\"2001:db8::1$i\"}]}}" >/dev/null
done

cargo build --quiet -p netcm
port=${NETCM_PORT:-10271}
cat <<INFO

netcm is starting against the local control plane. In another terminal:

  export KUBECONFIG=$KUBECONFIG
  alias kubectl=$kubectl
  kubectl get nodes -o custom-columns=NAME:.metadata.name,POD-CIDRS:.spec.podCIDRs
  kubectl get podcidrclaims
  kubectl get node sample-node-1 -o jsonpath='{.metadata.annotations}'; echo
  kubectl get events.events.k8s.io -A
  curl -s localhost:$port/metrics | grep -E '^(node_ipam|workqueue_depth|leader_election)'
  curl -s localhost:$port/readyz?verbose

Ctrl-C stops netcm (it releases its lease); 'hack/controlplane.sh down' stops the control plane.

INFO
exec ./target/debug/netcm \
  --kubeconfig="$KUBECONFIG" \
  --bind-address=127.0.0.1 --port="$port" \
  --leader-elect-resource-namespace=kube-system \
  --controllers='*,-route-controller' \
  --cluster-cidr=10.244.0.0/16,fd00:10:244::/56 \
  --service-cluster-ip-range=10.0.0.0/24 \
  "$@"
