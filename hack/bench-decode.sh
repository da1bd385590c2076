#!/usr/bin/env bash
# Decode benchmark: what the informer spends per Node decoding a watch event and caching it, the full
# k8s-openapi Node trimmed in kube-runtime's reflector store (before) against WireNode → CachedNode in the
# informer's own store (after), for the subnet-allocator's declaration alone and for all three
# controllers': allocations, bytes allocated, bytes retained per cached Node, time; and
# size_of::<CachedNode>(). No cluster needed. Prints markdown tables.
#
#   hack/bench-decode.sh                  # 5,000 Nodes, 5 rounds
#   NODES=50000 ROUNDS=3 hack/bench-decode.sh
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
exec cargo bench --locked -p netcm-manager --bench decode
