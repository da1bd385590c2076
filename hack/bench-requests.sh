#!/usr/bin/env bash
exec bash "$(dirname "${BASH_SOURCE[0]}")/bench.sh" requests "$@" # the same as hack/bench.sh requests
