#!/usr/bin/env bash
exec bash "$(dirname "${BASH_SOURCE[0]}")/bench.sh" routes "$@" # the same as hack/bench.sh routes
