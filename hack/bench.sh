#!/usr/bin/env bash
# netcm's benchmarks, one entry point: hack/bench.sh NAME [ARGS]. Each prints its numbers (mostly markdown
# tables); the e2e tests assert what netcm does, never how fast (docs/performance.md has the numbers).
#
#   allocation      netcm vs kube-controller-manager's nodeipam vs the API server's ceiling, side by side in
#                   one run on the real control plane (e2e/src/bin/bench-allocation/;
#                   docs/performance.md says what each column means):
#                     hack/bench.sh allocation                          MODE=default: 5,000-Node backlog, every contender
#                     NODES=1000 SKIP_KCM_DEFAULT=1 hack/bench.sh allocation   (ONLY_NETCM=1: ceiling and netcm only)
#                     MODE=scale NODES=50000 hack/bench.sh allocation   ceiling, netcm and KCM at QPS=1000 (BURST=2×QPS)
#                     MODE=scale NODES=5000 ROUNDS=3 hack/bench.sh allocation   three rounds, then the medians of the ratios
#                     MODE=scale NODES=100000 CLUSTER_CIDR=10.0.0.0/7 BARE_CEILING_ONLY=1 hack/bench.sh allocation
#                                   past a /8's 65,536 /24s (kube-apiserver ~10 GiB, ~30 min)
#                     MODE=churn NODES=5000 CHURN_SECONDS=300 hack/bench.sh allocation   20 Nodes/s created + deleted
#                                   (its tail, from the audit log: python3 hack/churn_tail/churn_tail.py LOG SET BASE)
#                     MODE=sizing hack/bench.sh allocation   5,000 Nodes of a seeded max-pods mix (SEED, 29), netcm at
#                                   a fixed /24 vs --node-cidr-size-from-pods (/24../28), ROUNDS (3) alternating:
#                                   time, addresses used, prefixes, Nodes per /16 (docs/pools.md has numbers)
#                     MODE=failover NODES=50000 hack/bench.sh allocation   N Nodes allocated, then a SIGTERM
#                                   hand-over and a kill -9 takeover: signal → Lease → a new Node's CIDR
#                                   and lease annotations (STANDBY_SECONDS, 10)
#                     MODE=lived-in NODES=50000 hack/bench.sh allocation   the next leader's backlog on the
#                                   claims an earlier leader left (SIGTERM, then kill -9) against its fresh run;
#                                   FRESH_AFTER=1 runs the fresh backlog again after it, SIGNALS=TERM one round,
#                                   RESTART_APISERVER=1 a fresh kube-apiserver process before each backlog
#                   The ceiling runs three times (bare; with the bench's watch; with that and a watch of every
#                   Node, as any informer-based allocator holds); BARE_CEILING_ONLY=1 runs it bare only.
#                   ALLOCATOR_FLOOR=1 adds an allocator's floor (FLOOR_CLIENTS, 32); FLOOR_AFTER=1 runs it again after netcm,
#                   BARE_AFTER=1 the bare ceiling (netcm ÷ the mean of each pair around it).
#                   ROTATE=1 (scale): round r runs its rows starting at the r-th, so none always runs first;
#                   RESTART_APISERVER=1 (scale, lived-in): a new kube-apiserver process before each row.
#                   CEILING_PROTOBUF_ANSWER=1 adds the bare ceiling asking for answers in protobuf.
#                   Other knobs: CREATORS (concurrent Node POSTs, 32), CEILING_CLIENTS (16), IDLE_SECONDS (30),
#                   CHURN_RATE (20), RSS_EARLY_SECONDS (60), CHURN_KCM=1, NETCM_EXTRA_ARGS, NETCM_BIN_BEFORE
#                   (scale: a row for that netcm build before this one's), NETCM_BIN (the netcm to run
#                   instead of this checkout's release build: another build, or a wrapper setting its
#                   environment), CLUSTER_CIDR
#                   (10.0.0.0/8), TIMEOUT_SECONDS (3600). At 50,000 Nodes kube-apiserver holds ~4 GiB.
#   decode          what the informer spends per Node decoding a watch event and caching it, the full
#                   k8s-openapi Node trimmed in kube-runtime's reflector store (before) against WireNode →
#                   CachedNode in the informer's own store (after), for the subnet-allocator's declaration
#                   alone and for all three controllers': allocations, bytes allocated, bytes retained per
#                   cached Node, time; and size_of::<CachedNode>(). No cluster needed.
#                     hack/bench.sh decode                              5,000 Nodes, 5 rounds
#                     NODES=50000 ROUNDS=3 hack/bench.sh decode
#   forget          on the multi-node cluster of hack/cluster.sh (root; it downs any cluster first and leaves
#                   none): how long netcm's route controller, flanneld (host-gw, vxlan), kube-proxy's UDP
#                   conntrack, the kernel's conntrack and neighbour tables on a surviving node keep pointing
#                   at a Node that died and was deleted — what --cidr-release-hold must outlast
#                   (e2e/src/bin/bench-forget.rs).
#                     hack/bench.sh forget                              REPEATS=3 deletions per configuration
#                     CONFIGS=alone,host-gw,vxlan OBSERVE_SECONDS=150 REPEATS=5 hack/bench.sh forget
#   handover        two replicas on the real control plane: how long the standby takes to hold the Lease
#                   after SIGTERM on the leader (a release) and after kill -9 (an expiry at a 4 s lease)
#                   (e2e/src/bin/bench-handover.rs).
#                     hack/bench.sh handover [ROUNDS]                   default 10 of each
#   kernel-routes   the kernel alone: N routes installed with one `ip -batch` in a fresh network namespace,
#                   each via its own gateway, all via one, and via nexthop objects (root; no cluster):
#                     hack/bench.sh kernel-routes [N ...]               default 10000 20000 50000
#   ledger          the bytes and allocations the subnet-allocator's ledger (netcm-ipam's Pools) holds per
#                   allocated Node and the time per allocation, single-stack and dual-stack. No cluster needed.
#                     hack/bench.sh ledger                              50,000 Nodes, 3 rounds
#                     NODES=5000 ROUNDS=5 hack/bench.sh ledger
#   memory-limit    netcm under the chart's memory limit, in a cgroup v1 memory cgroup (root): hack/bench/
#                   memory-limit.sh says what and how.
#                     NETCM_CONTROLPLANE_DIR=/tmp/mine hack/bench.sh memory-limit
#                     NODES=2000 MEMORY_LIMIT=64M hack/bench.sh memory-limit
#   outside         the outside harness (hack/outside_bench/, Python, no code shared with the Rust bench), set
#                   up as the outside benchmark of docs/performance.md: ceiling, netcm (the chart's controllers), KCM's nodeipam,
#                   each on its own backlog, a watch counting Nodes with a CIDR, etcd compacted between them.
#                     hack/bench.sh outside                             NODES=50000, CLIENTS=16
#                     NODES=2000 CONTENDERS=netcm,kcm hack/bench.sh outside
#   pools           netcm's allocation time for a backlog of N Nodes with the flag pool alone vs ten
#                   ClusterCIDR pools (Nodes spread over them by label), on the real control plane.
#                     hack/bench.sh pools                               2,000 Nodes, each mode twice
#                     NODES=5000 REPEATS=3 hack/bench.sh pools
#   migration       a PodCIDRMigration of N Nodes (default 1000) from the flag pool to a ClusterCIDR at
#                   maxUnavailable (MAX_UNAVAILABLE, 10 %), the kubelets simulated (a deleted Node created
#                   again after REGISTER_DELAY_MS, 0): wall time, Nodes/s, per-Node seconds delete → new CIDR
#                   and cordon → new CIDR (e2e/src/bin/bench-migration.rs).
#                     NODES=1000 hack/bench.sh migration
#   patch-cost      kube-apiserver's and etcd's CPU per pod-CIDR write by the PATCH's form — netcm's JSON Patch with
#                   its tests, kube-controller-manager's strategic merge patch, and others — on fresh Nodes with a
#                   kubelet-sized status, no controller (hack/patch_cost/patch_cost.py):
#                     NODES=1000 ROUNDS=3 hack/bench.sh patch-cost [FORM ...]
#   requests        API requests per Node, by verb and resource, from kube-apiserver's audit log, one fresh
#                   control plane per contender: hack/bench/requests.sh says what and how.
#                     hack/bench.sh requests                            NODES=2000, this checkout's release build
#                     CONTENDERS="before=/tmp/netcm-main after=target/release/netcm" NODES=50000 hack/bench.sh requests
#   routes          N Nodes (default 5000) with lease annotations, netcm's route controller inside a network
#                   namespace (root): the time from "all lease annotations present, netcm started" to "all
#                   routes programmed", the time to every RouteCreated condition, and a live change of every
#                   Node's gateway (e2e/src/bin/bench-routes.rs).
#                     hack/bench.sh routes [NODES]
#   token-expiry    on the multi-node cluster of hack/cluster.sh (root; it downs any cluster first and leaves
#                   none), ~15 minutes: netcm's pod given a ServiceAccount token that expires after 600 s (the
#                   least the API server issues) keeps working past it — probe Nodes get pod CIDRs every 30 s,
#                   no restart, the Lease kept, the audit log shows netcm switching to the kubelet's next token
#                   before the first expires (e2e/src/bin/bench-token-expiry.rs).
#                     hack/bench.sh token-expiry                        OBSERVE_SECONDS=780
#
# hack/bench-pod-network.sh (the multi-node cluster of hack/cluster.sh) is not run from here; forget and
# token-expiry are.
# The benchmarks on the real control plane start (or reuse) the one of NETCM_CONTROLPLANE_DIR.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
tag=bench
# shellcheck source=hack/lib.sh
source "$root/hack/lib.sh"

# controlplane_up: starts (or reuses) hack/controlplane.sh's control plane; the e2e binaries find it
# through NETCM_E2E_KUBECONFIG.
controlplane_up() {
  local line
  line=$(bash hack/controlplane.sh up | tail -1)
  export NETCM_E2E_KUBECONFIG=${line#KUBECONFIG=}
}

# build_release BENCH: builds netcm and the e2e binary BENCH in release mode; BENCH starts the netcm of
# NETCM_BIN, this build unless the caller set another.
build_release() {
  cargo build --release --locked -p netcm -p netcm-e2e --bin netcm --bin "$1"
  export NETCM_BIN=${NETCM_BIN:-$root/target/release/netcm}
}

# run_debug BENCH: builds netcm and the e2e binary BENCH (debug, quietly), then becomes BENCH.
run_debug() {
  cargo build --quiet --locked -p netcm -p netcm-e2e --bin netcm --bin "$1"
  exec "$root/target/debug/$1"
}

name=${1:-}
[ $# -eq 0 ] || shift
case "$name" in
  allocation)
    bash hack/install-prereqs.sh >/dev/null
    controlplane_up
    bash hack/controlplane.sh bin kube-controller-manager >/dev/null
    build_release bench-allocation
    log "MODE=${MODE:-default} NODES=${NODES:-default} on $(nproc) cores; df: $(df -h / | awk 'NR==2 {print $4}') free"
    exec "$root/target/release/bench-allocation" ;;
  decode) exec cargo bench --locked -p netcm-manager --bench decode ;;
  forget)
    # It boots its own cluster (hack/cluster.sh), so no control plane of hack/controlplane.sh; no netcm
    # binary either: netcm runs from hack/image.sh build's image.
    cargo build --quiet --locked -p netcm-e2e --bin bench-forget
    exec "$root/target/debug/bench-forget" ;;
  handover)
    controlplane_up
    export ROUNDS=${1:-10}
    run_debug bench-handover ;;
  kernel-routes) exec python3 hack/bench_kernel_routes/bench_kernel_routes.py "$@" ;;
  ledger) exec cargo bench --locked -p netcm-ipam --bench ledger ;;
  memory-limit) exec bash hack/bench/memory-limit.sh "$@" ;;
  outside)
    bash hack/install-prereqs.sh >/dev/null
    controlplane_up
    kubectl=$(bash hack/controlplane.sh bin kubectl)
    "$kubectl" --kubeconfig="$NETCM_E2E_KUBECONFIG" apply --server-side --force-conflicts \
      --field-manager=outside-bench -f charts/netcm/crds >/dev/null
    KCM_BIN=$(bash hack/controlplane.sh bin kube-controller-manager)
    ETCD_PORT=$(bash hack/controlplane.sh env | sed -n 's/^ETCD_PORT=//p')
    cargo build --release --locked -p netcm --bin netcm
    export KCM_BIN ETCD_PORT KUBECONFIG=$NETCM_E2E_KUBECONFIG NETCM_BIN=${NETCM_BIN:-$root/target/release/netcm}
    exec python3 hack/outside_bench/outside_bench.py ;;
  pools)
    bash hack/install-prereqs.sh >/dev/null
    controlplane_up
    build_release bench-pools
    exec "$root/target/release/bench-pools" ;;
  migration)
    controlplane_up
    build_release bench-migration
    exec "$root/target/release/bench-migration" ;;
  patch-cost)
    controlplane_up
    exec python3 hack/patch_cost/patch_cost.py "$NETCM_E2E_KUBECONFIG" "${NODES:-1000}" "${ROUNDS:-3}" "$@" ;;
  requests) exec bash hack/bench/requests.sh "$@" ;;
  routes)
    controlplane_up
    export NODES=${1:-5000}
    run_debug bench-routes ;;
  token-expiry)
    # As forget: its own cluster, netcm from hack/image.sh build's image.
    cargo build --quiet --locked -p netcm-e2e --bin bench-token-expiry
    exec "$root/target/debug/bench-token-expiry" ;;
  *) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "$0"; exit 2 ;;
esac
