#!/usr/bin/env bash
# A multi-node cluster on this machine, one network namespace per node: see hack/cluster/cluster.py's
# header (or `hack/cluster.sh` without arguments) for what it starts, the addresses and per-node paths.
#   NODES=3 hack/cluster.sh up | down | env | load TAR IMAGE | add-node | remove-node NAME
exec python3 "$(dirname "${BASH_SOURCE[0]}")/cluster/cluster.py" "$@"
