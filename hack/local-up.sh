#!/usr/bin/env bash
# The one run command: a local control plane, a handful of sample Nodes, and netcm in the foreground.
#
#   hack/local-up.sh            (Ctrl-C stops netcm; the control plane keeps running: hack/controlplane.sh down)
#   hack/local-up.sh --chart [HELM ARGS…]
#                               netcm as it runs in a cluster: the real nodes of hack/cluster.sh (NODES,
#                               default 2: each a network namespace with kubelet, containerd, kube-proxy),
#                               the image built by hack/image.sh and `helm upgrade --install` of
#                               charts/netcm into kube-system as README's "netcm as the source of your pod
#                               network" says (HELM ARGS are added, e.g. --set logging.format=json); then
#                               follows the leader's log (Ctrl-C stops following; netcm keeps running:
#                               hack/cluster.sh down stops all)
#   NODES=3 hack/local-up.sh    the same cluster and chart, then a probe pod on every node: a pod network
#                               on netcm alone (hack/cluster.sh down stops all)
#
# Without a cluster the route-controller is left off: it programs kernel routes and needs NET_ADMIN (see
# README); in the cluster it runs as the chart's DaemonSet, inside each node's namespace.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
tag=local-up
# shellcheck source=hack/lib.sh
source "$root/hack/lib.sh"

logs=$root/_out/local-up
mkdir -p "$logs"

# background_build NAME WHAT COMMAND...: COMMAND in the background, its output in $logs/NAME.log, while the
# Go binaries build: on two cores the two builds take about as long together as apart, one after the other.
background_build() {
  local name=$1 what=$2
  shift 2
  log "$what (log: $logs/$name.log)"
  "$@" >"$logs/$name.log" 2>&1 &
  background_pid=$!
}
# finish_background NAME: waits for background_build's command; a failure dies with its log's tail.
finish_background() {
  wait "$background_pid" || die "$1 failed; the last lines of $logs/$1.log: $(tail -15 "$logs/$1.log")"
}

chart=0
if [ "${1:-}" = --chart ]; then chart=1; shift; fi
if [ "$chart" = 1 ] || [ -n "${NODES:-}" ]; then
  log "checking the Debian packages real nodes need (containerd, runc, the CNI plugins, iptables)"
  bash hack/install-prereqs.sh nodes >/dev/null
  nodes=${NODES:-2}
  background_build image "building netcm's image (cargo build --release, then umoci; cold ~6 min on 2 cores)" \
    bash hack/image.sh build
  bash hack/controlplane.sh build etcd kube-apiserver kubectl kube-controller-manager kube-scheduler kubelet kube-proxy
  log "starting the control plane and $nodes real nodes (hack/cluster.sh up; ~1 min)"
  cluster_line=$(NODES=$nodes bash hack/cluster.sh up 2>"$logs/cluster.log" | tail -1) ||
    die "hack/cluster.sh up failed; the last lines of $logs/cluster.log: $(tail -15 "$logs/cluster.log")"
  export KUBECONFIG=${cluster_line#KUBECONFIG=}
  eval "$(bash hack/cluster.sh env | grep -E '^(CLUSTER_CIDR|SERVICE_CIDR)=')"
  kubectl=$(bash hack/controlplane.sh bin kubectl)
  log "building helm (its Go module; cold ~2 min)"
  helm=$(bash hack/verify-chart.sh helm 2>"$logs/helm.log") ||
    die "building helm failed; the last lines of $logs/helm.log: $(tail -15 "$logs/helm.log")"
  finish_background image
  built=$(cat "$logs/image.log")
  image=$(sed -n 's/^IMAGE=//p' <<<"$built")
  bash hack/cluster.sh load "$(sed -n 's/^TAR=//p' <<<"$built")" "$image"
  echo "the Nodes before netcm (no pod CIDRs, no CNI config: NotReady):"
  "$kubectl" get nodes -o wide
  # On the host network two replicas need two Nodes (the same ports).
  replicas=2
  [ "$nodes" -ge 2 ] || replicas=1
  "$helm" upgrade --install netcm charts/netcm -n kube-system --wait --timeout 180s \
    --set image.repository="${image%:*}" --set image.tag="${image##*:}" --set image.pullPolicy=Never \
    --set hostNetwork=true --set daemonSet.enabled=true --set replicaCount="$replicas" \
    --set allocator.clusterCIDR="${CLUSTER_CIDR/,/\\,}" \
    --set allocator.nodeCIDRMaskSizeIPv4=24 --set allocator.nodeCIDRMaskSizeIPv6=64 \
    --set allocator.serviceClusterIPRange="$SERVICE_CIDR" "$@"
  kubectl_wait 120 "$kubectl" --for=condition=Ready nodes --all
  "$kubectl" get nodes -o custom-columns=NAME:.metadata.name,READY:.status.conditions[-1].status,POD-CIDRS:.spec.podCIDRs
  if [ "$chart" = 1 ]; then
    # The leader is the pod whose gauge says so: on the host network the Lease names the machine's
    # hostname, which every node here shares.
    leader=""
    for _ in $(seq 1 150); do
      for pod in $("$kubectl" -n kube-system get pods -l app.kubernetes.io/component=controller-manager \
        -o jsonpath='{range .items[*]}{.metadata.name}={.status.podIP}{"\n"}{end}'); do
        if curl -s --max-time 2 "http://${pod#*=}:10271/metrics" | grep -q '^leader_election_master_status{name="netcm"} 1'; then
          leader=${pod%%=*}
        fi
      done
      [ -z "$leader" ] || break
      sleep 0.2
    done
    [ -n "$leader" ] || { echo "error: no pod of the release reported leading within 30 s" >&2; exit 1; }
    "$kubectl" -n kube-system get pods -l app.kubernetes.io/instance=netcm -o wide
    cat <<INFO

netcm runs on $nodes real nodes through its chart and gave them their pod CIDRs; the leader is $leader.
In another terminal:

  export KUBECONFIG=$KUBECONFIG
  alias kubectl=$kubectl helm=$helm
  kubectl get nodes -o custom-columns=NAME:.metadata.name,POD-CIDRS:.spec.podCIDRs
  kubectl -n kube-system get lease netcm -o jsonpath='{.spec.holderIdentity}'; echo
  kubectl -n kube-system delete pod $leader          # fail over to the standby
  helm upgrade netcm charts/netcm -n kube-system --reuse-values --set logging.verbosity=2

'hack/cluster.sh down' stops the cluster and restores the machine. Following the leader's log:

INFO
    exec "$kubectl" -n kube-system logs -f "$leader"
  fi
  probe=$(bash hack/image.sh probe)
  probe_image=$(sed -n 's/^IMAGE=//p' <<<"$probe")
  bash hack/cluster.sh load "$(sed -n 's/^TAR=//p' <<<"$probe")" "$probe_image"
  cat <<YAML | "$kubectl" apply -f - >/dev/null
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: probe, namespace: default}
spec:
  selector: {matchLabels: {app: probe}}
  template:
    metadata: {labels: {app: probe}}
    spec:
      containers: [{name: probe, image: $probe_image, imagePullPolicy: Never, args: [serve, "8080"]}]
YAML
  "$kubectl" rollout status --timeout=120s daemonset/probe
  "$kubectl" get pods -A -o wide
  cat <<INFO

A pod network on netcm alone. In another terminal:

  export KUBECONFIG=$KUBECONFIG
  alias kubectl=$kubectl helm=$helm
  nsenter --net=/run/netns/ncm-n1 ip route show proto 199      # netcm's routes to the other nodes
  kubectl exec ds/probe -- /probe ping <a pod IP on another node>
  kubectl exec ds/probe -- /probe get <pod IP>:8080
  hack/cluster.sh add-node                                    # one more node; it joins the network

'hack/cluster.sh down' stops the cluster and restores the machine.
INFO
  exit 0
fi

log "checking the Debian packages a local control plane needs (openssl, curl, python3)"
bash hack/install-prereqs.sh run >/dev/null
background_build netcm "building netcm (cargo build, debug; cold ~4 min on 2 cores, warm seconds)" \
  cargo build --quiet -p netcm
bash hack/controlplane.sh build etcd kube-apiserver kubectl
log "starting etcd and kube-apiserver (a few seconds)"
kubeconfig_line=$(bash hack/controlplane.sh up 2>"$logs/controlplane.log" | tail -1) ||
  die "hack/controlplane.sh up failed; the last lines of $logs/controlplane.log: $(tail -15 "$logs/controlplane.log")"
export KUBECONFIG=${kubeconfig_line#KUBECONFIG=}
kubectl=$(bash hack/controlplane.sh bin kubectl)

echo "installing the chart's CRDs (PodCIDRClaim)"
"$kubectl" apply --server-side --field-manager=netcm-local-up -f charts/netcm/crds/ >/dev/null
kubectl_wait 60 "$kubectl" --for=condition=Established -f charts/netcm/crds/

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

finish_background netcm
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
