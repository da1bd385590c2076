#!/usr/bin/env bash
# Route-controller scale benchmark: N Nodes (default 5000) with lease annotations, netcm's route
# controller inside a network namespace; prints the time from "all lease annotations present, netcm
# started" to "all routes programmed", the time to every RouteCreated condition, and a live change of
# every Node's gateway (e2e/src/bin/bench-routes.rs). The e2e suite asserts what is routed, never how fast.
#
#   hack/bench-routes.sh [NODES]      (root: it creates a network namespace)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

kubeconfig_line=$(bash hack/controlplane.sh up | tail -1)
export NETCM_E2E_KUBECONFIG=${kubeconfig_line#KUBECONFIG=}
export NODES=${1:-5000}
cargo build --quiet --locked -p netcm -p netcm-e2e --bin netcm --bin bench-routes
exec "$root/target/debug/bench-routes"
