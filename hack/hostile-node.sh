#!/usr/bin/env bash
# The hostile-node campaign (e2e/src/hostile_node.rs says what it registers and checks) for ROUNDS rounds
# on the multi-node cluster of hack/cluster.sh, inside the pod network test that boots it (netcm alone,
# probe pods on every node); prints one table row per round. hack/test.sh runs one round.
#
#   ROUNDS=10 hack/hostile-node.sh        (root; downs any cluster of this machine first, leaves none)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
tag=hostile-node
# shellcheck source=hack/lib.sh
source "$root/hack/lib.sh"

bash hack/install-prereqs.sh nodes >/dev/null
bash hack/controlplane.sh build etcd kube-apiserver kubectl kube-controller-manager kube-scheduler kubelet kube-proxy
trap 'bash hack/cluster.sh down >&2 || true' EXIT
NETCM_HOSTILE_ROUNDS=${ROUNDS:-5} cargo_test_telling_why --locked -p netcm-e2e --test e2e -- \
  --test-threads=1 --nocapture pod_network::netcm_alone
