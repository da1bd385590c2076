#!/usr/bin/env bash
# Pod network benchmark on the multi-node cluster of hack/cluster.sh, for flannel
# host-gw, flannel vxlan (both beside netcm) and netcm alone: the time from a new node's kubelet start to
# its first pod reachable from every other node, and TCP throughput and HTTP round trips pod to pod vs
# node to node over the same bridge (e2e/src/bin/bench-pod-network.rs says how). Prints a markdown table.
# It downs any cluster of this machine first and leaves none behind. The e2e tests prove the network
# works (e2e/tests/e2e/pod_network*.rs); this only measures it.
#
#   hack/bench-pod-network.sh                  (root; CONFIGS=host-gw,vxlan,alone picks some)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
cargo build --quiet --locked -p netcm-e2e --bin bench-pod-network
exec "$root/target/debug/bench-pod-network"
