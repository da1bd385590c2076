#!/usr/bin/env bash
exec bash "$(dirname "${BASH_SOURCE[0]}")/bench.sh" allocation "$@" # the same as hack/bench.sh allocation
