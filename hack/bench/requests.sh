#!/usr/bin/env bash
# API requests per Node, by verb and resource, from kube-apiserver's audit log: netcm with the chart's
# default controllers (`--controllers=*,-route-controller`: the subnet-allocator and the
# node-annotation-syncer; the chart's routeController is off, and on this host its gateway mode would
# program the routing table) working off a backlog of Nodes that have an InternalIP and no pod CIDR, until each holds its CIDR and its flannel lease. One fresh control plane
# per contender; prints a markdown table with one column per contender.
#
#   hack/bench.sh requests                                   # NODES=2000, this checkout's release build
#   CONTENDERS="before=/tmp/netcm-main after=target/release/netcm" NODES=50000 hack/bench.sh requests
#
# Knobs: NODES (2000), CONTROLLERS (*,-route-controller), CONTENDERS (label=binary …; default: now=<release build>), CLUSTER_CIDR
# (10.0.0.0/8), SETTLE_SECONDS (5: requests after the last lease still count), TIMEOUT_SECONDS (1800),
# NETCM_CONTROLPLANE_DIR (default /tmp/netcm-bench-requests; wiped for each contender).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
tag=bench
# shellcheck source=hack/lib.sh
source "$root/hack/lib.sh"
nodes=${NODES:-2000}
controllers=${CONTROLLERS:-*,-route-controller}
cidr=${CLUSTER_CIDR:-10.0.0.0/8}
export NETCM_CONTROLPLANE_DIR=${NETCM_CONTROLPLANE_DIR:-/tmp/netcm-bench-requests}
py="python3 $root/hack/bench_requests/bench_requests.py"
out=$(mktemp -d)
netcm_pid=

cleanup() {
  [ -z "$netcm_pid" ] || kill "$netcm_pid" 2>/dev/null || true
  bash hack/controlplane.sh down >/dev/null 2>&1 || true
}
trap cleanup EXIT

if [ -z "${CONTENDERS:-}" ]; then
  cargo build --release --locked -p netcm --bin netcm
  CONTENDERS="now=$root/target/release/netcm"
fi
bash hack/install-prereqs.sh >/dev/null
kubectl=$(bash hack/controlplane.sh bin kubectl)

columns=()
for contender in $CONTENDERS; do
  label=${contender%%=*}
  bin=${contender#*=}
  # A fresh control plane; again if a port it picked was taken meanwhile (other runs share the host).
  for attempt in 1 2 3; do
    bash hack/controlplane.sh down >/dev/null 2>&1 || true
    rm -rf "$NETCM_CONTROLPLANE_DIR"
    kubeconfig_line=$(bash hack/controlplane.sh up | tail -1) && break
    [ "$attempt" -lt 3 ] || exit 1
  done
  export KUBECONFIG=${kubeconfig_line#KUBECONFIG=}
  "$kubectl" apply --server-side -f charts/netcm/crds/ >/dev/null
  log "$label: creating $nodes Nodes"
  for ((first = 0; first < nodes; first += 500)); do
    echo "$first $((nodes - first < 500 ? nodes - first : 500))"
  done | xargs -P 4 -n 2 sh -c "$py nodes \$0 \$1 | '$kubectl' create -f - >/dev/null"
  audit=$(bash hack/controlplane.sh audit)
  offset=$(stat -c %s "$audit")
  log "$label: $bin --controllers=$controllers on $nodes Nodes"
  "$bin" --kubeconfig="$KUBECONFIG" --controllers="$controllers" --cluster-cidr="$cidr" \
    --leader-elect-resource-namespace=kube-system --port=0 >"$out/$label.log" 2>&1 &
  netcm_pid=$!
  seconds=$($py wait "$kubectl" "$nodes" flannel.alpha.coreos.com "${TIMEOUT_SECONDS:-1800}")
  sleep "${SETTLE_SECONDS:-5}"
  kill "$netcm_pid"
  wait "$netcm_pid" || true
  netcm_pid=
  log "$label: every Node held its CIDR and lease ${seconds} s after netcm started"
  $py count "$audit" "$offset" netcm/ "$nodes" "$label" >"$out/$label.json"
  columns+=("$out/$label.json")
done

echo "Requests per Node by netcm (user agent netcm/…), $nodes Nodes, --controllers=$controllers, $(nproc) cores, $(date -u +%F):"
$py table "${columns[@]}"
