#!/usr/bin/env bash
# Allocation benchmark: netcm vs kube-controller-manager's nodeipam vs the API server's ceiling, side by
# side in one run on the real control plane (e2e/src/bin/bench-allocation/). Prints markdown tables;
# the README's "Benchmarks" section says what each column means.
#
#   hack/bench-allocation.sh                                  # MODE=default: 5,000-Node backlog, every contender
#   NODES=1000 SKIP_KCM_DEFAULT=1 hack/bench-allocation.sh    (ONLY_NETCM=1: ceiling and netcm only)
#   MODE=scale NODES=50000 hack/bench-allocation.sh           # ceiling, netcm and KCM at QPS=1000 (BURST=2×QPS)
#   MODE=scale NODES=5000 ROUNDS=3 hack/bench-allocation.sh   # three rounds, then the medians of the ratios
#   MODE=churn NODES=5000 CHURN_SECONDS=300 hack/bench-allocation.sh   # 20 Nodes/s created + deleted
#
# The ceiling runs three times (bare; with the bench's watch; with that and a watch of every Node, as
# any informer-based allocator holds); BARE_CEILING_ONLY=1 runs it bare only.
#
# Other knobs: CREATORS (concurrent Node POSTs, 32), CEILING_CLIENTS (16), IDLE_SECONDS (30),
# CHURN_RATE (20), RSS_EARLY_SECONDS (60), CHURN_KCM=1, NETCM_EXTRA_ARGS, CLUSTER_CIDR (10.0.0.0/8),
# TIMEOUT_SECONDS (3600). At 50,000 Nodes kube-apiserver holds ~4 GiB.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash hack/install-prereqs.sh >/dev/null
kubeconfig_line=$(bash hack/controlplane.sh up | tail -1)
export NETCM_E2E_KUBECONFIG=${kubeconfig_line#KUBECONFIG=}
bash hack/controlplane.sh bin kube-controller-manager >/dev/null
cargo build --release --locked -p netcm -p netcm-e2e --bin netcm --bin bench-allocation
export NETCM_BIN=$root/target/release/netcm
echo "[bench] MODE=${MODE:-default} NODES=${NODES:-default} on $(nproc) cores; df: $(df -h / | awk 'NR==2 {print $4}') free" >&2
exec "$root/target/release/bench-allocation"
