#!/usr/bin/env bash
# Leader hand-over benchmark: two replicas on the real control plane; prints how long the standby takes
# to hold the Lease after SIGTERM on the leader (a release) and after kill -9 (an expiry at a 4 s lease)
# (e2e/src/bin/bench-handover.rs). The e2e suite asserts the rules of a hand-over, never its speed.
#
#   hack/bench-handover.sh [ROUNDS]     (default 10 of each)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

kubeconfig_line=$(bash hack/controlplane.sh up | tail -1)
export NETCM_E2E_KUBECONFIG=${kubeconfig_line#KUBECONFIG=}
export ROUNDS=${1:-10}
cargo build --quiet --locked -p netcm -p netcm-e2e --bin netcm --bin bench-handover
exec "$root/target/debug/bench-handover"
