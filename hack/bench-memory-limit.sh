#!/usr/bin/env bash
exec bash "$(dirname "${BASH_SOURCE[0]}")/bench.sh" memory-limit "$@" # the same as hack/bench.sh memory-limit
