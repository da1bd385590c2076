#!/usr/bin/env bash
# Allocation benchmark: netcm vs kube-controller-manager's nodeipam vs the API server's ceiling, side by
# side in one run on the real control plane. Prints a markdown table.
#
#   hack/bench-allocation.sh                 # 5,000 Nodes
#   NODES=1000 SKIP_KCM_DEFAULT=1 hack/bench-allocation.sh   (ONLY_NETCM=1: ceiling and netcm only)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash hack/install-prereqs.sh >/dev/null
kubeconfig_line=$(bash hack/controlplane.sh up | tail -1)
export NETCM_E2E_KUBECONFIG=${kubeconfig_line#KUBECONFIG=}
bash hack/controlplane.sh bin kube-controller-manager >/dev/null
cargo build --release --locked -p netcm -p netcm-e2e --bin netcm --bin bench-allocation
export NETCM_BIN=$root/target/release/netcm
exec "$root/target/release/bench-allocation"
