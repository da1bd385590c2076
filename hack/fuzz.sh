#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ (cargo-fuzz, libFuzzer) for SECONDS_PER_TARGET seconds each (default 30),
# one target and one libFuzzer process at a time, from the committed corpus fuzz/corpus/<target>/, and
# prints per target the executions, the coverage (libFuzzer's cov/ft) and the crashes found. Exits non-zero
# if any target crashed (its input is in fuzz/artifacts/<target>/; `cargo +nightly fuzz fmt <target> <file>`
# shows it). Installs cargo-fuzz and the nightly toolchain if they are missing.
#
#   hack/fuzz.sh [SECONDS_PER_TARGET]
#   NETCM_FUZZ_TARGETS="duration lease_plan" hack/fuzz.sh 60   (some targets only)
#   NETCM_FUZZ_GROW=1 hack/fuzz.sh 600   (new inputs go into fuzz/corpus/<target>/, minimised after the run)
#   NETCM_FUZZ_RUNS=10000000 hack/fuzz.sh 1800   (stop a target at 10 M executions or 30 minutes, whichever first)
#   NETCM_FUZZ_LOG_DIR=/tmp/fuzz-logs hack/fuzz.sh   (keep each target's whole libFuzzer output there)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
tag=fuzz
# shellcheck source=hack/lib.sh
source "$root/hack/lib.sh"

seconds=${1:-30}
[[ "$seconds" =~ ^[0-9]+$ ]] || { echo "usage: hack/fuzz.sh [SECONDS_PER_TARGET]" >&2; exit 2; }

command -v rustup >/dev/null 2>&1 || die "rustup not found: the fuzz build needs a nightly toolchain"
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked

# Safe Rust needs no AddressSanitizer to find a panic, and runs about twice as fast without it; -a keeps
# debug assertions and overflow checks on. NETCM_FUZZ_SANITIZER=address brings it back.
build=(-a -s "${NETCM_FUZZ_SANITIZER:-none}")
cd fuzz
cargo +nightly fuzz build "${build[@]}"
targets=${NETCM_FUZZ_TARGETS:-$(cargo +nightly fuzz list)}
# Each target runs the binary built above, not `cargo fuzz run`: in a tree others edit during a long run,
# that would rebuild before each target (minutes each on 2 cores) and fuzz a different build per target.
bin_dir=$PWD/target/$(rustc +nightly -vV | sed -n 's/^host: //p')/release

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
rows=() crashed=()
for t in $targets; do
  mkdir -p "corpus/$t" "artifacts/$t"
  # Without NETCM_FUZZ_GROW new inputs go to a scratch directory: the committed corpus is only read.
  if [ "${NETCM_FUZZ_GROW:-0}" = 1 ]; then dirs=("$PWD/corpus/$t"); else dirs=("$logs/$t.new" "$PWD/corpus/$t"); mkdir -p "$logs/$t.new"; fi
  extra=()
  [ -f "dicts/$t.dict" ] && extra+=("-dict=$PWD/dicts/$t.dict")
  [ -n "${NETCM_FUZZ_RUNS:-}" ] && extra+=("-runs=$NETCM_FUZZ_RUNS")
  before=$(find "artifacts/$t" -type f | wc -l)
  echo "=== $t (${seconds}s)"
  status=0 started=$SECONDS
  # One libFuzzer process; it stops at the first crash.
  "$bin_dir/$t" "${dirs[@]}" -max_total_time="$seconds" -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$root/fuzz/artifacts/$t/" "${extra[@]}" >"$logs/$t.out" 2>&1 || status=$?
  elapsed=$((SECONDS - started))
  # A grown corpus is minimised as `cargo fuzz cmin` does (-merge=1 into an empty directory keeps only
  # inputs that add coverage), so the committed corpus stays small.
  if [ "${NETCM_FUZZ_GROW:-0}" = 1 ] && [ "$status" -eq 0 ]; then
    mkdir "$logs/$t.min"
    "$bin_dir/$t" -merge=1 "$logs/$t.min" "corpus/$t" >"$logs/$t.merge" 2>&1 &&
      rm -rf "corpus/$t" && mv "$logs/$t.min" "corpus/$t"
  fi
  if [ -n "${NETCM_FUZZ_LOG_DIR:-}" ]; then mkdir -p "$NETCM_FUZZ_LOG_DIR" && cp "$logs/$t.out" "$NETCM_FUZZ_LOG_DIR/$t.log"; fi
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$logs/$t.out" | tail -1 | grep -o '[0-9]*$' || true)
  cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$logs/$t.out" | tail -1 || true)
  crashes=$(($(find "artifacts/$t" -type f | wc -l) - before))
  if [ "$status" -ne 0 ] && [ "$crashes" -eq 0 ]; then crashes=1; fi
  if [ "$crashes" -gt 0 ]; then
    crashed+=("$t")
    grep -E 'panicked|ERROR: libFuzzer|SUMMARY|Test unit written' "$logs/$t.out" | head -8 || true
  fi
  rows+=("$(printf '%-26s %12s %8s  %-22s %6s  %s' "$t" "${execs:-?}" "$elapsed" "${cov:-?}" "$(find "corpus/$t" -type f | wc -l)" "$crashes")")
done

printf '\n%-26s %12s %8s  %-22s %6s  %s\n' target executions seconds coverage corpus crashes
printf '%s\n' "${rows[@]}"
if [ ${#crashed[@]} -gt 0 ]; then
  echo "crashed: ${crashed[*]} (inputs in fuzz/artifacts/<target>/)" >&2
  exit 1
fi
