#!/usr/bin/env bash
# Route-controller scale benchmark: N Nodes (default 5000) with lease annotations, netcm's route
# controller inside a network namespace; prints the time from "all lease annotations present, netcm
# started" to "all routes programmed", the time to every RouteCreated condition, and a live change of
# every Node's gateway. The e2e suite runs the same test with 1000 Nodes.
#
#   hack/bench-routes.sh [NODES]      (root: it creates a network namespace)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

kubeconfig_line=$(bash hack/controlplane.sh up | tail -1)
export NETCM_E2E_KUBECONFIG=${kubeconfig_line#KUBECONFIG=}
export NETCM_E2E_ROUTE_NODES=${1:-5000}
cargo build --quiet -p netcm
cargo test --quiet -p netcm-e2e --test route_controller -- --exact \
  thousands_of_nodes_are_routed_in_seconds --nocapture 2>&1 | grep -E "route-controller with|created .* Nodes|test result"
