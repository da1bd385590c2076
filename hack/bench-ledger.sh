#!/usr/bin/env bash
exec bash "$(dirname "${BASH_SOURCE[0]}")/bench.sh" ledger "$@" # the same as hack/bench.sh ledger
