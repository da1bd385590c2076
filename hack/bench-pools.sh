#!/usr/bin/env bash
# Pools benchmark: netcm's allocation time for a backlog of N Nodes with the flag pool alone vs ten
# ClusterCIDR pools (Nodes spread over them by label), on the real control plane. Prints a markdown table.
#
#   hack/bench-pools.sh              # 2,000 Nodes, each mode twice
#   NODES=5000 REPEATS=3 hack/bench-pools.sh
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash hack/install-prereqs.sh >/dev/null
kubeconfig_line=$(bash hack/controlplane.sh up | tail -1)
export NETCM_E2E_KUBECONFIG=${kubeconfig_line#KUBECONFIG=}
cargo build --release --locked -p netcm -p netcm-e2e --bin netcm --bin bench-pools
export NETCM_BIN=$root/target/release/netcm
exec "$root/target/release/bench-pools"
