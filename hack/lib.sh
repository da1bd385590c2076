# Helpers the scripts in hack/ share. Source it after setting `tag`, the word log lines start with, and
# (for alive, stop_component and wait_alive) `state`, the directory holding NAME.pid and NAME.log:
#   tag=controlplane state=…; source "$root/hack/lib.sh"
# log and die read `tag` when they run: a function calling them must not have a local named tag.

log() { printf '[%s] %s\n' "$tag" "$*" >&2; }
die() { printf '[%s] error: %s\n' "$tag" "$*" >&2; exit 1; }

# need TOOL...: dies naming every missing one at once.
need() {
  local missing=() tool
  for tool in "$@"; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
  [ ${#missing[@]} -eq 0 ] || die "missing tools: ${missing[*]} (hack/install-prereqs.sh installs them)"
}

# free_port: a TCP port of 127.0.0.1 that nothing listens on now (the kernel's pick; free until taken).
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# wait_until TRIES PAUSE CHECK...: runs CHECK until it succeeds, TRIES times PAUSE seconds apart; fails
# (returns 1) when the tries run out.
wait_until() {
  local tries=$1 pause=$2 i
  shift 2
  for i in $(seq 1 "$tries"); do
    if "$@"; then return 0; fi
    sleep "$pause"
  done
  return 1
}

# kubectl_wait SECONDS KUBECTL WAIT-ARGS...: `KUBECTL wait WAIT-ARGS`, tried again until SECONDS pass.
# kubectl wait fails at once rather than waiting when an object's status has no conditions yet ("accessor
# error: <nil> is of the type <nil>"): a CRD the API server has not marked yet, a Node just registered.
kubectl_wait() {
  local seconds=$1 kubectl=$2
  shift 2
  wait_until $(((seconds + 4) / 5)) 1 "$kubectl" wait --timeout=4s "$@" >/dev/null 2>&1 ||
    "$kubectl" wait --timeout=1s "$@" >/dev/null # the last try's error is the one to show
}

# alive NAME: the process in $state/NAME.pid is running.
alive() { [ -f "$state/$1.pid" ] && kill -0 "$(cat "$state/$1.pid")" 2>/dev/null; }

# wait_alive NAME TRIES PAUSE CHECK...: runs CHECK until it succeeds, TRIES times PAUSE seconds apart,
# dying with NAME's last log lines as soon as NAME exits; fails (returns 1) when the tries run out.
wait_alive() {
  local name=$1 tries=$2 pause=$3 i
  shift 3
  for i in $(seq 1 "$tries"); do
    if "$@"; then return 0; fi
    alive "$name" || die "$name exited; see $state/$name.log: $(tail -3 "$state/$name.log")"
    sleep "$pause"
  done
  return 1
}

# stop_component NAME [GRACE]: SIGTERM, then SIGKILL after GRACE seconds (default 3); removes the pid
# file. kube-apiserver takes ~60 s to exit on SIGTERM while watches are open, hence the short grace.
stop_component() {
  local name=$1 grace=${2:-3} pid i
  alive "$name" || { rm -f "$state/$name.pid"; return 0; }
  pid=$(cat "$state/$name.pid")
  # A frozen (SIGSTOPped) process would not act on SIGTERM until continued.
  kill -CONT "$pid" 2>/dev/null || true
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 $((grace * 10))); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  fi
  rm -f "$state/$name.pid"
}

# Runs `cargo test` with the arguments given; when it fails, repeats each panic message at the end, where a
# truncated CI log still shows it (the netcm log tail and the backtrace of a failing test come after it).
# A run in which no test passed fails too: a name filter that matches nothing (a module renamed) would
# otherwise pass with "0 passed".
cargo_test_telling_why() {
  local out rc=0 passed
  out=$(mktemp)
  cargo test "$@" 2>&1 | tee "$out" || rc=$?
  if [ "$rc" != 0 ]; then
    echo "=== every panic message above, the failing tests' among them (a test of a recovered panic prints one too)"
    grep -E -A4 "^thread '[^']*'.* panicked at " "$out" | grep -v -E '^\s+[0-9]+: |^\s+at ' | head -80 || true
  fi
  passed=$(sed -n -E 's/^test result: [a-zA-Z]+\. ([0-9]+) passed;.*/\1/p' "$out" | awk '{ n += $1 } END { print n + 0 }')
  rm -f "$out"
  if [ "$rc" = 0 ] && [ "$passed" -eq 0 ]; then
    printf 'error: cargo test %s ran no test: a filter that matches nothing passes silently\n' "$*" >&2
    return 1
  fi
  return "$rc"
}
