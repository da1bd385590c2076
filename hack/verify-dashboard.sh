#!/usr/bin/env bash
# Every query of the Grafana dashboard (charts/netcm/files/dashboard.json) returns series against a live
# netcm: starts netcm (every controller) on 127.0.0.1 against the control plane of hack/controlplane.sh,
# with a few Nodes, and Debian's Prometheus scraping it every second, then runs each panel's query through
# Prometheus's HTTP API. A query without series fails the script. The route controller runs against a
# table and protocol nobody uses (213) and the Nodes have no addresses, so it programs nothing.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
tag=verify-dashboard
source "$root/hack/lib.sh"

command -v prometheus >/dev/null || die "prometheus not found (hack/install-prereqs.sh installs Debian's prometheus package)"
kubeconfig=${NETCM_E2E_KUBECONFIG:-}
if [ -z "$kubeconfig" ]; then
  line=$(bash hack/controlplane.sh up | tail -1)
  kubeconfig=${line#KUBECONFIG=}
fi
kubectl=$(bash hack/controlplane.sh bin kubectl)
k() { "$kubectl" --kubeconfig="$kubeconfig" "$@"; }
if [ -n "${NETCM_BIN:-}" ]; then
  netcm=$NETCM_BIN
else
  cargo build --quiet --locked -p netcm
  netcm=${CARGO_TARGET_DIR:-$root/target}/debug/netcm
fi

# The e2e tests' cluster lock: nobody else touches Nodes while this runs.
exec 9>"$(dirname "$kubeconfig")/e2e.lock"
flock 9

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  k delete node -l netcm.io/dashboard-check=true --wait=false >/dev/null 2>&1 || true
  k -n kube-system delete lease netcm-dashboard >/dev/null 2>&1 || true
  k delete podcidrclaims -l ipam.netcm.io/node --wait=false >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

k apply --server-side --field-manager=netcm-dashboard-check -f charts/netcm/crds/ >/dev/null
for i in 0 1 2; do
  printf 'apiVersion: v1\nkind: Node\nmetadata:\n  name: dash-%s\n  labels: {netcm.io/dashboard-check: "true"}\n' "$i" | k create -f - >/dev/null
done

port=$(free_port)
"$netcm" --kubeconfig="$kubeconfig" --bind-address=127.0.0.1 --port="$port" \
  --leader-elect-resource-namespace=kube-system --leader-elect-resource-name=netcm-dashboard \
  --cluster-cidr=10.244.0.0/16 --route-table=213 --route-protocol=213 \
  >"$work/netcm.log" 2>&1 &
pids+=($!)

prom_port=$(free_port)
cat >"$work/prometheus.yml" <<YAML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: netcm
    static_configs:
      - targets: ['127.0.0.1:$port']
YAML
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/data" \
  --web.listen-address="127.0.0.1:$prom_port" >"$work/prometheus.log" 2>&1 &
pids+=($!)

query() { curl -sfG "http://127.0.0.1:$prom_port/api/v1/query" --data-urlencode "query=$1"; }
# has_series QUERY: Prometheus answers QUERY with at least one series.
has_series() { query "$1" 2>/dev/null | grep -q '"value"'; }
allocated_and_scraped() {
  has_series 'sum(node_ipam_controller_cidrset_cidrs_allocations_total) >= 3' &&
    has_series 'count_over_time(netcm_build_info[1m]) >= 5'
}
wait_until 150 0.2 allocated_and_scraped || true
# A release too, so the release counter has a series.
k delete node dash-2 >/dev/null
wait_until 100 0.2 has_series 'sum(node_ipam_controller_cidrset_cidrs_releases_total) >= 1' || true
sleep 3 # rate() needs two samples of a series that just appeared
query 'count_over_time(netcm_build_info[1m]) >= 5' | grep -q '"value"' || {
  tail -20 "$work/netcm.log" >&2; tail -5 "$work/prometheus.log" >&2
  die "Prometheus did not get five scrapes of netcm with three allocations within 30 s"
}

# Each panel's queries through Prometheus's HTTP API (hack/verify_dashboard/queries.py, with its tests).
PROM="http://127.0.0.1:$prom_port" python3 hack/verify_dashboard/queries.py charts/netcm/files/dashboard.json
