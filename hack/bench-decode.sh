#!/usr/bin/env bash
# Decode benchmark: what the informer spends per Node decoding a watch event, the full k8s-openapi Node
# then trimmed (before) against the wire type (after): allocations, bytes allocated, bytes retained per
# cached Node, time. No cluster needed. Prints a markdown table.
#
#   hack/bench-decode.sh                  # 5,000 Nodes, 5 rounds
#   NODES=50000 ROUNDS=3 hack/bench-decode.sh
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
exec cargo bench --locked -p netcm-manager --bench decode
