#!/usr/bin/env bash
# The one test command (CI runs exactly this): installs what it needs on a fresh machine, then
# cargo fmt --check, clippy -D warnings, unit tests, the chart checks and the e2e suite against a real
# kube-apiserver + etcd started by hack/controlplane.sh. A missing prerequisite is an error, never a skip.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

step() { printf '\n=== %s\n' "$*"; }

step "prerequisites"
bash hack/install-prereqs.sh

step "control plane"
kubeconfig_line=$(bash hack/controlplane.sh up | tail -1)
export NETCM_E2E_KUBECONFIG=${kubeconfig_line#KUBECONFIG=}
if [ "${NETCM_KEEP_CONTROLPLANE:-0}" != 1 ]; then
  trap 'bash hack/controlplane.sh down >/dev/null 2>&1 || true' EXIT
fi
# The e2e tests beside real flannel agents run flanneld; build it now so a cold cache fails here, clearly.
bash hack/controlplane.sh bin flanneld >/dev/null

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "unit tests"
cargo test --workspace --exclude netcm-e2e --locked

if [ -f hack/verify-chart.sh ]; then
  step "chart: helm lint, helm template, server-side dry-run"
  bash hack/verify-chart.sh
fi

step "alerts: promtool test rules"
promtool test rules hack/testdata/alerts-test.yaml

step "dashboard: every panel query returns series from a live netcm"
bash hack/verify-dashboard.sh

step "e2e tests (real kube-apiserver + etcd)"
cargo build --locked -p netcm
cargo test --locked -p netcm-e2e --no-fail-fast -- --test-threads=1
