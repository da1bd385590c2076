#!/usr/bin/env bash
exec bash "$(dirname "${BASH_SOURCE[0]}")/bench.sh" decode "$@" # the same as hack/bench.sh decode
