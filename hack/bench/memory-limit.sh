#!/usr/bin/env bash
# netcm under the chart's memory limit: a NODES-Node backlog (default 50,000) allocated by netcm running
# the chart's default Deployment arguments inside a cgroup v1 memory cgroup limited to MEMORY_LIMIT
# (default 256M, the chart's resources.limits.memory), as the kubelet confines the container. Runs
# bench-allocation's scale mode (ONLY_NETCM=1 BARE_CEILING_ONLY=1: the bare API ceiling, then netcm) on
# the control plane of NETCM_CONTROLPLANE_DIR, then prints the cgroup's figures: peak usage
# (memory.max_usage_in_bytes: page cache included, as the kubelet's limit counts it), peak anonymous
# memory (memory.stat rss, sampled every second), memory.failcnt (times usage hit the limit) and OOM
# kills (memory.oom_control). Exits 1 if netcm was OOM-killed or did not allocate every Node. Needs root
# and cgroup v1's memory controller.
#
#   NETCM_CONTROLPLANE_DIR=/tmp/mine hack/bench.sh memory-limit
#   NODES=2000 MEMORY_LIMIT=64M hack/bench.sh memory-limit
#
# Knobs: NODES (50000), MEMORY_LIMIT (256M), TIMEOUT_SECONDS (1800), IDLE_SECONDS (120: the annotation
# syncer's writes follow the allocations, so netcm runs that long after the last one; "node writes per
# Node" 2.00 says every Node was also annotated in that time),
# CLUSTER_CIDR (10.0.0.0/8; the chart's default 10.244.0.0/16 holds only 256 /24s), NETCM_EXTRA_ARGS.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
tag=bench
# shellcheck source=hack/lib.sh
source "$root/hack/lib.sh"

memory_root=/sys/fs/cgroup/memory
[ -w "$memory_root" ] || die "needs root and cgroup v1's memory controller at $memory_root"
nodes=${NODES:-50000} limit=${MEMORY_LIMIT:-256M}

# hack/install-prereqs.sh is not run here: it may cargo-install tools this benchmark does not use.
kubeconfig_line=$(bash hack/controlplane.sh up | tail -1)
export NETCM_E2E_KUBECONFIG=${kubeconfig_line#KUBECONFIG=}
# --cluster-cidr-objects=true (the chart's default) watches ClusterCIDRs: the chart's CRDs, as helm installs them.
kubectl=$(bash hack/controlplane.sh bin kubectl)
"$kubectl" --kubeconfig="$NETCM_E2E_KUBECONFIG" apply --server-side --force-conflicts \
  --field-manager=netcm-bench -f charts/netcm/crds >/dev/null
kubectl_wait 60 "$kubectl" --kubeconfig="$NETCM_E2E_KUBECONFIG" --for=condition=Established -f charts/netcm/crds
cargo build --release --locked -p netcm -p netcm-e2e --bin netcm --bin bench-allocation

# The Deployment's arguments as the chart renders them with its default values, less what the bench
# sets for its own control plane (cluster CIDR, Lease namespace) and what would collide on a shared
# machine (ports: the metrics port is off, the secure port a free one). QPS and burst go to the bench,
# which labels its row with them.
rendered=$("$(bash hack/verify-chart.sh helm)" template netcm charts/netcm |
  awk '/^kind: Deployment/ {d = 1} /^kind: / && !/Deployment/ {d = 0} d && /^ +- --/ {print $2}')
chart_args=() qps=500 burst=1000
for a in $rendered; do
  case "$a" in
    --kube-api-qps=*) qps=${a#*=} ;;
    --kube-api-burst=*) burst=${a#*=} ;;
    --cluster-cidr=* | --leader-elect-resource-namespace=* | --port=* | --secure-port=* | --bind-address=*) ;;
    *) chart_args+=("$a") ;;
  esac
done
secure_port=$(free_port)
chart_args+=(--bind-address=127.0.0.1 "--secure-port=$secure_port")

cg=$memory_root/netcm-bench-memory-$$
tmp=$(mktemp -d)
watcher=
cleanup() {
  [ -n "$watcher" ] && kill "$watcher" 2>/dev/null || true
  # netcm is gone by now (the bench kills it); rmdir fails harmlessly if a process is still inside.
  [ -d "$cg" ] && rmdir "$cg" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
mkdir "$cg"
echo "$limit" >"$cg/memory.limit_in_bytes"
# With swap accounting, memory+swap gets the same limit: the kubelet gives a container no swap by default.
[ -f "$cg/memory.memsw.limit_in_bytes" ] && echo "$limit" >"$cg/memory.memsw.limit_in_bytes"

# The bench starts NETCM_BIN: this wrapper moves itself into the cgroup, then becomes netcm (same PID,
# so the bench's peak RSS and CPU figures are netcm's).
cat >"$tmp/netcm" <<EOF
#!/bin/sh
echo \$\$ >"$cg/cgroup.procs" && exec "$root/target/release/netcm" "\$@"
EOF
chmod +x "$tmp/netcm"

# Samples the anonymous memory each second and ends the bench at the first OOM kill, so a killed netcm
# is reported at once instead of after TIMEOUT_SECONDS.
echo 0 >"$tmp/peak_rss"
(
  peak=0
  while sleep 1; do
    rss=$(awk '$1 == "rss" {print $2}' "$cg/memory.stat")
    [ "$rss" -gt "$peak" ] && peak=$rss && echo "$peak" >"$tmp/peak_rss"
    if [ "$(awk '$1 == "oom_kill" {print $2}' "$cg/memory.oom_control")" -gt 0 ] && [ -f "$tmp/bench.pid" ]; then
      log "netcm was OOM-killed at the $limit limit; ending the bench"
      kill "$(cat "$tmp/bench.pid")" 2>/dev/null || true
      break
    fi
  done
) &
watcher=$!

log "netcm in cgroup $cg (memory.limit_in_bytes=$limit), $nodes Nodes, chart arguments: ${chart_args[*]}"
started=$SECONDS status=0
MODE=scale ONLY_NETCM=1 BARE_CEILING_ONLY=1 NODES=$nodes QPS=$qps BURST=$burst NETCM_BIN=$tmp/netcm \
  TIMEOUT_SECONDS=${TIMEOUT_SECONDS:-1800} IDLE_SECONDS=${IDLE_SECONDS:-120} \
  NETCM_EXTRA_ARGS="${chart_args[*]} ${NETCM_EXTRA_ARGS:-}" \
  "$root/target/release/bench-allocation" >"$tmp/bench.out" &
echo $! >"$tmp/bench.pid"
wait "$(cat "$tmp/bench.pid")" || status=$?
cat "$tmp/bench.out"

mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
row=$(grep '^| netcm' "$tmp/bench.out" || true)
oom_kills=$(awk '$1 == "oom_kill" {print $2}' "$cg/memory.oom_control")
echo
echo "netcm under a $limit memory limit (cgroup v1), $nodes-Node backlog, chart's default arguments:"
echo "  every Node allocated:  $([ "$status" -eq 0 ] && echo yes || echo "NO (bench exit $status)")"
echo "  time to allocate all:  $(echo "$row" | awk -F'|' '{gsub(/ /, "", $3); print ($3 == "" ? "–" : $3)}')"
echo "  node writes per Node:  $(echo "$row" | awk -F'|' '{gsub(/ /, "", $6); print ($6 == "" ? "–" : $6)}') (1 allocation + 1 annotation each: 2.00 once the syncer is done)"
echo "  peak usage:            $(mib "$(cat "$cg/memory.max_usage_in_bytes")") (memory.max_usage_in_bytes, page cache included)"
echo "  peak anonymous memory: $(mib "$(cat "$tmp/peak_rss")") (memory.stat rss, sampled each second)"
echo "  peak RSS (VmHWM):      $(echo "$row" | awk -F'|' '{gsub(/ /, "", $8); print ($8 == "" ? "–" : $8 " MiB")}')"
[ -f "$cg/memory.memsw.max_usage_in_bytes" ] && echo "  peak memory+swap:      $(mib "$(cat "$cg/memory.memsw.max_usage_in_bytes")")"
echo "  memory.failcnt:        $(cat "$cg/memory.failcnt")"
echo "  OOM kills:             $oom_kills"
echo "  wall time of the run:  $((SECONDS - started)) s (bare ceiling, netcm, idle window, clean-up)"
[ "$status" -eq 0 ] && [ "$oom_kills" -eq 0 ]
