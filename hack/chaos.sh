#!/usr/bin/env bash
# Fault campaign: netcm replicas split across two kube-apiservers on one etcd, Nodes and
# ClusterCIDRs churning, and a seeded random fault every few seconds; prints a table (leader changes,
# faults by kind, overlapping pod CIDRs, late landed and stale writes, Nodes left without CIDRs) and exits
# 1 on any finding: an overlap, a stale write, an early takeover, a Node left without CIDRs, a fault that
# failed to apply, no leader change, no successful list, no term read (e2e/src/bin/chaos/verdict.rs;
# docs/chaos.md says what each number means).
#
#   CHAOS_MINUTES=5 CHAOS_SEED=<n> hack/chaos.sh      (seed printed; the same seed replays the schedule)
#   CHAOS_FAULTS=leader-stop,leader-kill,leader-term,apiserver-stop,etcd-stop,path,config,claim-delete (default: all)
#   CHAOS_REPLICAS=3 CHAOS_SETTLE_SECONDS=90 CHAOS_OUT=_out/chaos/seed-<n>-<UTC time>
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

kubeconfig_line=$(bash hack/controlplane.sh up | tail -1)
export NETCM_E2E_KUBECONFIG=${kubeconfig_line#KUBECONFIG=}
cargo build --quiet --locked -p netcm --bin netcm
cargo build --quiet --locked -p netcm-e2e --bin chaos
target=${CARGO_TARGET_DIR:-$root/target}

# Private copies: a replica restarted mid-run runs the netcm the run started with, whatever is built
# meanwhile in this checkout.
bin=$(mktemp -d "${TMPDIR:-/tmp}/netcm-chaos.XXXXXX")
cp "$target/debug/netcm" "$target/debug/chaos" "$bin/"
export NETCM_BIN=$bin/netcm
export CHAOS_PIDS=$bin/replica-pids

# The program undoes its own faults and stops what it started, also on SIGINT/SIGTERM. This is the net
# for when it cannot (killed with SIGKILL): thaw the control plane, stop the second API server, end the
# replicas it recorded, delete its network namespaces.
chaos_pid=
ran_pid=
cleanup() {
  local state pid name
  state=$(bash hack/controlplane.sh env | sed -n 's/^STATE_DIR=//p')
  for name in etcd kube-apiserver kube-apiserver2; do
    [ -f "$state/$name.pid" ] && kill -CONT "$(cat "$state/$name.pid")" 2>/dev/null || true
  done
  if [ -f "$CHAOS_PIDS" ]; then
    while read -r pid; do
      if [ -n "$pid" ] && grep -qs netcm "/proc/$pid/cmdline"; then kill -KILL "$pid" 2>/dev/null || true; fi
    done <"$CHAOS_PIDS"
  fi
  if [ -n "$ran_pid" ]; then
    for name in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^netcm-e2e-$ran_pid-" || true); do
      ip netns del "$name" 2>/dev/null || true
    done
  fi
  bash hack/controlplane.sh stop-apiserver2 >/dev/null 2>&1 || true
  rm -rf "$bin"
}
trap cleanup EXIT
trap '[ -n "$chaos_pid" ] && kill -TERM "$chaos_pid" 2>/dev/null || true' INT TERM

"$bin/chaos" &
chaos_pid=$!
ran_pid=$chaos_pid
# `wait` returns early when a trapped signal arrives; wait again until the program has cleaned up.
while true; do
  wait "$chaos_pid" && status=0 || status=$?
  kill -0 "$chaos_pid" 2>/dev/null || break
done
chaos_pid=
exit "$status"
