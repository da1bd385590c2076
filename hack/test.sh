#!/usr/bin/env bash
# The one test command (CI runs exactly this): installs what it needs on a fresh machine, then
# cargo fmt --check, clippy -D warnings, unit tests, the chart checks and the e2e suite against a real
# kube-apiserver + etcd started by hack/controlplane.sh, and, on the real nodes of hack/cluster.sh (one
# cluster per machine: a cluster another checkout holds fails this run), a pod network on netcm alone and
# beside flannel, and netcm's chart installed, failed over, upgraded and removed. A missing prerequisite
# is an error, never a skip. Each step's time is printed at the end.
#
#   hack/test.sh     (NETCM_KEEP_CONTROLPLANE=1 keeps the control plane and the cluster running afterwards)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
tag=test
# shellcheck source=hack/lib.sh
source "$root/hack/lib.sh"

# The binary under test is the one this run builds: an inherited override would make every e2e test run
# another build and pass for it.
[ -z "${NETCM_BIN:-}" ] || die "NETCM_BIN is set ($NETCM_BIN): hack/test.sh tests the netcm it builds; unset it (the benchmarks take NETCM_BIN)"

# CI stops a run at 90 minutes and then shows nothing; past this budget the run stops itself at the next
# step with the times so far, so a run that grew too slow says where its time went.
budget=${NETCM_TEST_BUDGET_SECONDS:-4800}
timings=()
step_name="" step_start=$SECONDS
step() {
  [ -z "$step_name" ] || timings+=("$(printf '%5ss  %s' $((SECONDS - step_start)) "$step_name")")
  if [ "$SECONDS" -gt "$budget" ]; then
    die "$SECONDS s spent before step '$*', over the budget of $budget s (NETCM_TEST_BUDGET_SECONDS); CI's limit is 5400 s. The times so far are below."
  fi
  step_name=$* step_start=$SECONDS
  printf '\n=== %s\n' "$*"
}
report() {
  timings+=("$(printf '%5ss  %s' $((SECONDS - step_start)) "$step_name")")
  printf '\n=== times (total %ss)\n' "$SECONDS"
  printf '%s\n' "${timings[@]}"
}

step "prerequisites"
bash hack/install-prereqs.sh test
# One build from scratch gains nothing from incremental state, which would double target/'s size.
export CARGO_INCREMENTAL=0
# A full disk shows up as a linker killed by SIGBUS half an hour in; say it before starting.
min_free_gb=${NETCM_MIN_FREE_GB:-15}
free_gb=$(( $(df -Pk "$root" | awk 'NR == 2 { print $4 }') / 1024 / 1024 ))
if [ "$free_gb" -lt "$min_free_gb" ]; then
  echo "error: $free_gb GB free on the disk of $root; a full run writes about ${min_free_gb} GB (target/, images, the node's state). Free space or set NETCM_MIN_FREE_GB." >&2
  exit 1
fi

step "control plane"
# What it writes and runs, checked before it starts (hack/controlplane/render.py).
python3 -m unittest discover -s hack/controlplane
# Every Go binary the run uses, the Kubernetes ones in one build; a cold cache fails here, clearly.
bash hack/controlplane.sh build etcd kube-apiserver kubectl kube-controller-manager kube-scheduler kubelet kube-proxy flanneld
kubeconfig_line=$(bash hack/controlplane.sh up | tail -1)
export NETCM_E2E_KUBECONFIG=${kubeconfig_line#KUBECONFIG=}
background_pid=
cleanup() {
  [ -z "$background_pid" ] || kill -- -"$background_pid" 2>/dev/null || true
  # The times, even when a step failed.
  [ -z "$step_name" ] || report >&2
  if [ "${NETCM_KEEP_CONTROLPLANE:-0}" != 1 ]; then
    bash hack/cluster.sh down >&2 || true
    bash hack/controlplane.sh down >/dev/null 2>&1 || true
    NETCM_CONTROLPLANE_DIR=$root/_out/controlplane-2 bash hack/controlplane.sh down >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT
# flannel's CNI plugin (built from its source, not a module); the Go unit tests of the DaemonSet's installer and the probe pods.
bash hack/flannel.sh bin flannel-cni >/dev/null
for t in flannel-install probe; do (cd "hack/tools/$t" && go test ./... >/dev/null); done

step "cargo fmt --check; every e2e test checks something (hack/test_lint/assertions.py)"
cargo fmt --all -- --check
python3 -m unittest discover -s hack/test_lint
python3 hack/test_lint/assertions.py e2e

step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "unit tests"
cargo test --workspace --exclude netcm-e2e --locked

step "fuzz corpus: every committed input of every fuzz target replayed (stable build; coverage-guided runs: hack/fuzz.sh)"
# fuzz/ is a workspace of its own, which the steps above leave out. It builds into the main target
# directory, where the steps above built what both workspaces build alike (about 180 of its 260 units;
# not serde nor what uses it, as its proc macros' features differ): half the CPU of a target dir of its
# own. Without libFuzzer (--no-default-features) the replay needs no C++ and no fuzz binary; clippy
# type-checks the binaries (--features bins), so cargo fuzz's build of them cannot break unseen.
fuzz=(--manifest-path fuzz/Cargo.toml --locked --no-default-features)
cargo fmt --manifest-path fuzz/Cargo.toml -- --check
CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target} cargo clippy "${fuzz[@]}" --features bins --all-targets -- -D warnings
CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target} cargo test "${fuzz[@]}"

step "chart: helm lint, helm template, server-side dry-run"
bash hack/verify-chart.sh

step "alerts: promtool test rules"
promtool test rules hack/testdata/alerts-test.yaml

step "dashboard: every panel query returns series from a live netcm"
python3 -m unittest discover -s hack/verify_dashboard
bash hack/verify-dashboard.sh

step "image: release build, OCI image with umoci, checked against the Dockerfile"
python3 -m unittest discover -s hack/image
image_lines=$(bash hack/image.sh build)
bash hack/image.sh check
# The shipped build carries no test-only fault hook (netcm_manager::supervision::faults).
release_version=$(target/release/netcm --version)
case "$release_version" in
  *test-faults*) die "the release binary reports '$release_version': the image would carry the test fault hooks" ;;
esac
export NETCM_E2E_IMAGE NETCM_E2E_IMAGE_TAR
NETCM_E2E_IMAGE=$(sed -n 's/^IMAGE=//p' <<<"$image_lines")
NETCM_E2E_IMAGE_TAR=$(sed -n 's/^TAR=//p' <<<"$image_lines")

# The supply chain's builds — its tools, the image again from a clean clone, the static plugin — need
# ~20 minutes of CPU cold, while the pod-network, e2e and chaos steps below mostly wait on API servers,
# kubelets and leases and leave a core idle. They run from here at the lowest CPU and I/O priority, in a
# process group of their own and target dirs of their own (cargo's lock on target/ would stall the e2e
# builds), and the supply-chain and plugin steps wait for them. The image is HEAD's only when the checkout
# is clean, as CI's is: a dirty checkout builds them in those steps instead.
mkdir -p _out/test
background_log=$root/_out/test/supply-chain-builds.log
plugin_target=$root/_out/plugin-target
if git diff --quiet HEAD --; then
  setsid nice -n 19 ionice -c 3 bash -c '
    set -e
    bash hack/install-prereqs.sh supply-chain
    bash hack/supply-chain.sh reproducible --against-checkout
    CARGO_TARGET_DIR=$1 bash hack/plugin.sh build' _ "$plugin_target" >"$background_log" 2>&1 </dev/null &
  background_pid=$!
  log "supply-chain builds started at low priority (pid $background_pid, log: $background_log)"
fi
# wait_for_background: the builds above finished well; a failure dies with their log's tail.
wait_for_background() {
  [ -n "$background_pid" ] || return 0
  local started=$SECONDS
  wait "$background_pid" || die "the supply-chain builds failed; the last lines of $background_log: $(tail -20 "$background_log")"
  background_pid=
  log "waited $((SECONDS - started)) s for the supply-chain builds ($background_log)"
}

step "multi-node cluster: a dual-stack pod network on netcm alone, one round of the hostile-node campaign (e2e/tests/e2e/pod_network.rs; ROUNDS=N hack/hostile-node.sh)"
python3 -m unittest discover -s hack/cluster
# The test boots its own cluster from zero (down, then up): nodes without pod CIDRs, then helm install.
cargo_test_telling_why --locked -p netcm-e2e --test e2e -- --test-threads=1 pod_network::
[ "${NETCM_KEEP_CONTROLPLANE:-0}" = 1 ] || bash hack/cluster.sh down

step "multi-node cluster: flannel host-gw and vxlan beside netcm (e2e/tests/e2e/pod_network_flannel.rs)"
cargo_test_telling_why --locked -p netcm-e2e --test e2e -- --test-threads=1 pod_network_flannel::
[ "${NETCM_KEEP_CONTROLPLANE:-0}" = 1 ] || bash hack/cluster.sh down

step "e2e tests (real kube-apiserver + etcd, two control planes, a process per test: hack/e2e_workers/run.py; the chart on real nodes of hack/cluster.sh)"
# The e2e suite's netcm has the test-only fault hooks; the release build above has none.
cargo build --locked -p netcm --features test-faults
target_dir=${CARGO_TARGET_DIR:-$root/target}
case "$("$target_dir/debug/netcm" --version)" in
  *test-faults*) ;;
  *) die "$target_dir/debug/netcm --version does not name test-faults: the fault tests would test nothing" ;;
esac
# The e2e crate's own unit tests (its helpers, the chaos campaign's verdict) and its binaries' tests.
cargo_test_telling_why --locked -p netcm-e2e --lib --bins
python3 -m unittest discover -s hack/e2e_workers
e2e_binary=$(cargo test --locked -p netcm-e2e --test e2e --no-run --message-format=json |
  python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "e2e" and m.get("executable"):
        print(m["executable"])')
[ -x "$e2e_binary" ] || die "cargo test --no-run named no e2e test binary"
second_controlplane=$root/_out/controlplane-2
NETCM_CONTROLPLANE_DIR=$second_controlplane bash hack/controlplane.sh up >/dev/null
# pod_network and pod_network_flannel ran in the multi-node steps (they need no shared control plane).
# The chart tests boot their own clusters (NODES=2, then NODES=1) and leave the last one up. NETCM_BIN is
# the build just made and checked above: without it each test process would run cargo build again. Two
# tests at a time, one per control plane, except the tests whose leaders hold leases of 2-4 s or whose
# checks time a takeover (--alone): beside another test those lost their leases, and a leader that loses
# its lease exits; they run last, one at a time.
NETCM_BIN=$target_dir/debug/netcm python3 hack/e2e_workers/run.py --binary "$e2e_binary" \
  --controlplane "$root/_out/controlplane" --controlplane "$second_controlplane" \
  --skip pod_network:: --skip pod_network_flannel:: \
  --alone leader_election:: --alone split_brain:: --alone manager:: --alone allocator_adversary:: \
  --alone subnet_allocator::a_frozen_leader_and_a_killed_one --alone faults_outside_the_api:: \
  --alone crd_upgrade:: --alone check::leadership:: --alone takeover_from_another_configuration:: \
  --alone lagging_api_server::
if [ "${NETCM_KEEP_CONTROLPLANE:-0}" != 1 ]; then
  bash hack/cluster.sh down
  NETCM_CONTROLPLANE_DIR=$second_controlplane bash hack/controlplane.sh down >/dev/null
fi

step "chaos: a short fault campaign of every fault kind (hack/chaos.sh; CHAOS_MINUTES=60 by hand)"
# A fixed seed; every finding the campaign reports fails it (e2e/src/bin/chaos/verdict.rs). A late write
# a lossy path delivers after its writer's term is counted, not failed, unless it landed once a successor
# led (stale): the quarantine keeps it harmless (docs/chaos.md).
CHAOS_MINUTES=${NETCM_CHAOS_MINUTES:-2} CHAOS_SEED=${NETCM_CHAOS_SEED:-1} \
  CHAOS_FAULTS=${NETCM_CHAOS_FAULTS:-leader-stop,leader-kill,leader-term,apiserver-stop,etcd-stop,path,config,claim-delete} \
  bash hack/chaos.sh

# Last: the checks of what the background builds made.
step "supply chain: cargo deny, SBOMs, provenance, the image rebuilt from a clean clone (hack/supply-chain.sh)"
python3 -m unittest discover -s hack/supply_chain
python3 -m unittest discover -s hack/bench_requests
python3 -m unittest discover -s hack/patch_cost
python3 -m unittest discover -s hack/bench_kernel_routes
python3 -m unittest discover -s hack/churn_tail
python3 -m unittest discover -s hack/outside_bench
python3 -m unittest discover -s hack/fresh_machine
if [ -n "$background_pid" ]; then
  wait_for_background
  grep -E 'reproducible: both builds give' "$background_log"
else
  bash hack/install-prereqs.sh supply-chain
  bash hack/supply-chain.sh reproducible --against-checkout
fi
bash hack/supply-chain.sh deny
bash hack/supply-chain.sh sbom
bash hack/supply-chain.sh provenance

step "kubectl plugin: the static kubectl-netcm installed by the real krew (hack/plugin.sh)"
CARGO_TARGET_DIR=$plugin_target bash hack/plugin.sh test
