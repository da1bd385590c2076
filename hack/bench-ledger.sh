#!/usr/bin/env bash
# Ledger benchmark: the bytes and allocations the subnet-allocator's ledger (netcm-ipam's Pools) holds
# per allocated Node and the time per allocation, single-stack and
# dual-stack. No cluster needed. Prints a markdown table.
#
#   hack/bench-ledger.sh                   # 50,000 Nodes, 3 rounds
#   NODES=5000 ROUNDS=5 hack/bench-ledger.sh
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
exec cargo bench --locked -p netcm-ipam --bench ledger
