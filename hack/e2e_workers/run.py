"""Runs the e2e suite on several control planes at once, one test process at a time per control plane.

The e2e tests spend most of their time waiting on API servers, leases and kubelets, and each takes its
control plane's lock for its whole run, so one control plane runs one test at a time and leaves a core
mostly idle. Each worker here owns a control plane (its NETCM_CONTROLPLANE_DIR and kubeconfig) and takes
the next test from one shared queue (one worker: by name; several: longest first by the durations
recorded on this machine's last run, kept beside the binary caches outside the checkout); each test runs
in a process of its own (`<test binary> --exact NAME`), so a test that hangs or crashes takes nothing else
with it. The multi-node cluster stays one per machine: its tests wait for its lock (e2e/src/multinode.rs).

Tests that hold a lease of a few seconds (`--alone PREFIX`) run with nothing else beside them, after the
others: a second test on the other core, or the supply chain's builds early in the step, delay a
leader's renewals past such a lease, and a leader that loses its lease exits.

    python3 hack/e2e_workers/run.py --binary TEST_BINARY --controlplane DIR [--controlplane DIR ...]
                                    [--skip PREFIX ...] [--alone PREFIX ...] [--durations FILE]

Prints each test's result as it ends, the output of every failed test, the slowest tests, and closes with
'N passed, N failed'; exits 1 when a test failed or none ran.
"""

import argparse
import json
import os
import queue
import subprocess
import sys
import threading
import time


# The longest e2e test takes a few minutes (the chart on real nodes); one past this is hung.
TEST_TIMEOUT = 1200


def parse_list(output):
    """Test names from `<test binary> --list` (lines `name: test`; benches and the summary dropped)."""
    names = []
    for line in output.splitlines():
        name, sep, kind = line.rpartition(": ")
        if sep and kind.strip() == "test":
            names.append(name)
    return names


def selected(names, skips):
    """`names` without those libtest's `--skip` would drop (a substring match)."""
    return [n for n in names if not any(s in n for s in skips)]


def skip_counts(names, skips):
    """How many of `names` each skip drops: a skip that drops none names tests that are gone (a renamed
    module), and the run says so rather than carry it silently."""
    return {s: sum(s in n for n in names) for s in skips}


def is_alone(name, alones):
    """Whether `name` runs with no other test beside it (a substring match, as the skips)."""
    return any(a in name for a in alones)


def ordered(names, durations, workers, alones=()):
    """The order the queue hands tests out. One worker: by name, as `cargo test` runs them (the order
    changes nothing of the total, and the short-lease tests stay where their runs have passed: late,
    after the supply chain's background builds are done). Several: the tests that may share the machine
    longest first by earlier durations, tests never timed first of all (they may be the longest), so no
    long test starts last; then the tests that run alone, by name, once the background builds are done."""
    if workers == 1:
        return sorted(names)
    shared = [n for n in names if not is_alone(n, alones)]
    alone = sorted(n for n in names if is_alone(n, alones))
    return sorted(shared, key=lambda n: (n in durations, -durations.get(n, 0.0), n)) + alone


class Gate:
    """Lets tests start: any number of shared tests at once, or one test alone. A test that must run
    alone waits for those running to end, and no test starts while it waits."""

    def __init__(self):
        self._cond = threading.Condition()
        self._running = 0
        self._alone = False

    def enter(self, alone):
        with self._cond:
            if alone:
                self._cond.wait_for(lambda: not self._alone)
                self._alone = True
                self._cond.wait_for(lambda: self._running == 0)
            else:
                self._cond.wait_for(lambda: not self._alone)
            self._running += 1

    def leave(self, alone):
        with self._cond:
            self._running -= 1
            if alone:
                self._alone = False
            self._cond.notify_all()


def summary_line(passed, failed):
    """The closing line CI reads, alone on its line."""
    return f"{passed} passed, {failed} failed"


def slowest(results, count=15):
    """Text lines of the `count` slowest tests: seconds, worker, name."""
    rows = sorted(results, key=lambda r: -r["seconds"])[:count]
    return [f"{r['seconds']:7.1f}s  w{r['worker']}  {r['name']}" for r in rows]


def load_durations(path):
    try:
        with open(path) as f:
            data = json.load(f)
        return {k: float(v) for k, v in data.items()}
    except (OSError, ValueError, AttributeError):
        return {}


def save_durations(path, old, results):
    merged = dict(old)
    merged.update({r["name"]: round(r["seconds"], 1) for r in results if r["ok"]})
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(merged, f, indent=0, sort_keys=True)
    os.replace(tmp, path)


def worker(index, controlplane, binary, tests, results, lock, log_dir, package_dir, gate, alones):
    env = dict(os.environ)
    env["NETCM_CONTROLPLANE_DIR"] = controlplane
    env["NETCM_E2E_KUBECONFIG"] = os.path.join(controlplane, "kubeconfig")
    while True:
        try:
            name = tests.get_nowait()
        except queue.Empty:
            return
        log_path = os.path.abspath(os.path.join(log_dir, name.replace("::", ".") + ".log"))
        alone = is_alone(name, alones)
        gate.enter(alone)
        started = time.monotonic()
        with open(log_path, "w") as log:
            # In the package's directory, as cargo test runs a test binary. A test that hangs fails at
            # TEST_TIMEOUT with what it printed, not at CI's limit with nothing.
            try:
                code = subprocess.run([binary, "--exact", name, "--test-threads=1", "--nocapture"], env=env,
                                      cwd=package_dir, stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, timeout=TEST_TIMEOUT).returncode
            except subprocess.TimeoutExpired:
                code = f"killed after {TEST_TIMEOUT} s"
        seconds = time.monotonic() - started
        gate.leave(alone)
        with open(log_path, errors="replace") as log:
            ran = "test result: ok. 1 passed" in log.read()
        result = {"name": name, "ok": code == 0 and ran, "seconds": seconds, "worker": index, "log": log_path}
        with lock:
            results.append(result)
            verdict = "ok" if result["ok"] else f"FAILED (exit {code}; {log_path})"
            print(f"[w{index} {seconds:6.1f}s] {name} ... {verdict}", flush=True)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--binary", required=True, help="the e2e test binary (cargo test --no-run)")
    p.add_argument("--controlplane", action="append", required=True, help="a control plane's state dir, one per worker")
    p.add_argument("--skip", action="append", default=[], help="skip tests whose name contains this")
    p.add_argument("--alone", action="append", default=[],
                   help="run tests whose name contains this with no other test beside them")
    p.add_argument("--durations", default=os.path.expanduser("~/.cache/netcm/e2e-durations.json"))
    p.add_argument("--log-dir", default="_out/test/e2e")
    p.add_argument("--package-dir", default="e2e", help="the test package's directory (the tests' working directory)")
    args = p.parse_args(argv)

    listed = subprocess.run([args.binary, "--list"], capture_output=True, text=True, check=True,
                            cwd=args.package_dir).stdout
    listed_names = parse_list(listed)
    for skip, count in skip_counts(listed_names, args.skip).items():
        if count == 0:
            print(f"error: --skip {skip} matches no test: a renamed test or module?", file=sys.stderr)
            return 1
        print(f"skipping {count} tests matching {skip} (run elsewhere)", flush=True)
    names = selected(listed_names, args.skip)
    for alone, count in skip_counts(names, args.alone).items():
        if count == 0:
            print(f"error: --alone {alone} matches no test: a renamed test or module?", file=sys.stderr)
            return 1
    if not names:
        print("error: the e2e binary lists no test to run", file=sys.stderr)
        return 1
    durations = load_durations(args.durations)
    tests = queue.Queue()
    for n in ordered(names, durations, len(args.controlplane), args.alone):
        tests.put(n)
    os.makedirs(args.log_dir, exist_ok=True)
    results, lock, gate = [], threading.Lock(), Gate()
    started = time.monotonic()
    threads = [threading.Thread(target=worker, args=(i + 1, cp, args.binary, tests, results, lock, args.log_dir,
                                                        args.package_dir, gate, args.alone))
               for i, cp in enumerate(args.controlplane)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    save_durations(args.durations, durations, results)
    failed = [r for r in results if not r["ok"]]
    for r in failed:
        print(f"\n=== output of the failed test {r['name']} ({r['log']})")
        with open(r["log"], errors="replace") as log:
            print(log.read()[-20000:])
    print(f"\n=== the slowest e2e tests ({len(results)} in {time.monotonic() - started:.0f}s on "
          f"{len(args.controlplane)} control planes)")
    print("\n".join(slowest(results)))
    print(summary_line(len(results) - len(failed), len(failed)))
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
