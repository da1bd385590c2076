"""Times the README's two commands as a newcomer on a fresh machine meets them.

Clones HEAD into a new directory and points every cache the commands fill somewhere new and empty:
netcm's binary cache (NETCM_CACHE_DIR), cargo's target dir (the clone's own), Go's build and module
caches (GOCACHE, GOMODCACHE), cargo's registry (CARGO_HOME) and the root cargo installs tools into
(CARGO_INSTALL_ROOT, first on PATH). Then runs, each cold and then warm:

- `hack/local-up.sh`, until the first sample Node holds a pod CIDR (then Ctrl-C, as a user would);
- `hack/test.sh` (only with --test: it takes the better part of an hour cold), to its end.

and prints one table: each run's time to its mark, and test.sh's own step times. What the scratch
directory cannot make fresh is said in the table's header: Debian packages and the Rust toolchain
stay installed (apt and rustup are the machine's, not a cache).

    python3 hack/fresh_machine/fresh_machine.py [--test] [--keep] [--scratch DIR]
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

# `=== times (total 1234s)` and the `  512s  prerequisites` lines under it (hack/test.sh's report).
TOTAL_LINE = re.compile(r"^=== times \(total (\d+)s\)$")
STEP_LINE = re.compile(r"^\s*(\d+)s  (.+)$")


def parse_step_times(output):
    """hack/test.sh's closing table from its output: (total seconds, [(seconds, step)]); (None, [])
    when the run printed none."""
    lines = output.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        m = TOTAL_LINE.match(lines[i])
        if not m:
            continue
        steps = []
        for line in lines[i + 1:]:
            s = STEP_LINE.match(line)
            if not s:
                break
            steps.append((int(s.group(1)), s.group(2)))
        return int(m.group(1)), steps
    return None, []


def fresh_env(scratch, base=None):
    """The environment of a newcomer's shell whose caches all live, empty, under `scratch`."""
    env = dict(os.environ if base is None else base)
    for var in ("NETCM_BIN", "CARGO_TARGET_DIR", "NETCM_CONTROLPLANE_DIR", "KUBECONFIG"):
        env.pop(var, None)
    tools = os.path.join(scratch, "cargo-tools")
    env.update(
        NETCM_CACHE_DIR=os.path.join(scratch, "netcm-cache"),
        GOCACHE=os.path.join(scratch, "go-build"),
        GOMODCACHE=os.path.join(scratch, "go-mod"),
        CARGO_HOME=os.path.join(scratch, "cargo-home"),
        CARGO_INSTALL_ROOT=tools,
        PATH=os.path.join(tools, "bin") + os.pathsep + env.get("PATH", ""),
    )
    return env


def format_table(rows):
    """rows: [(what, seconds or None, note)] as an aligned text table."""
    width = max([len(r[0]) for r in rows] + [4])
    out = [f"{'what':<{width}}  {'time':>9}  note"]
    for what, seconds, note in rows:
        shown = "-" if seconds is None else f"{seconds // 60}m{seconds % 60:02d}s"
        out.append(f"{what:<{width}}  {shown:>9}  {note}")
    return "\n".join(out)


def first_allocation(checkout, env, log_path, limit):
    """Runs hack/local-up.sh until a sample Node holds a pod CIDR; seconds taken, or None if it did
    not within `limit` seconds or exited first (its log says why)."""
    started = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(["bash", "hack/local-up.sh"], cwd=checkout, env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        while time.monotonic() - started < limit:
            if proc.poll() is not None:
                return None
            if node_has_cidr(checkout, env):
                return int(time.monotonic() - started)
            time.sleep(1)
        return None
    finally:
        # Ctrl-C, as the README says: netcm steps down and releases its Lease.
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def node_has_cidr(checkout, env):
    """Whether sample-node-1 holds a pod CIDR, asked of the clone's control plane (False while it is
    not up yet)."""
    kubeconfig = os.path.join(checkout, "_out", "controlplane", "kubeconfig")
    kubectl_dir = env["NETCM_CACHE_DIR"]
    if not os.path.exists(kubeconfig) or not os.path.isdir(kubectl_dir):
        return False
    kubectls = [os.path.join(d, "kubectl") for d in (os.path.join(kubectl_dir, e) for e in os.listdir(kubectl_dir))
                if os.path.isfile(os.path.join(d, "kubectl"))]
    if not kubectls:
        return False
    got = subprocess.run([kubectls[0], "--kubeconfig", kubeconfig, "get", "node", "sample-node-1", "-o",
                          "jsonpath={.spec.podCIDRs}"], capture_output=True, text=True, env=env, check=False)
    return got.returncode == 0 and got.stdout.strip() not in ("", "[]")


def forget_the_control_plane(checkout, env, run=subprocess.run):
    """Stops the clone's control plane and removes its state (etcd's data, certificates): warm means warm
    caches, not a cluster whose sample Nodes already hold pod CIDRs from the run before."""
    run(["bash", "hack/controlplane.sh", "down"], cwd=checkout, env=env, check=False, capture_output=True)
    shutil.rmtree(os.path.join(checkout, "_out", "controlplane"), ignore_errors=True)


def run_test_command(checkout, env, log_path):
    """hack/test.sh to its end: (exit code, seconds, its step table)."""
    started = time.monotonic()
    with open(log_path, "w") as log:
        code = subprocess.run(["bash", "hack/test.sh"], cwd=checkout, env=env, stdout=log,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, check=False).returncode
    seconds = int(time.monotonic() - started)
    with open(log_path) as log:
        _, steps = parse_step_times(log.read())
    return code, seconds, steps


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--test", action="store_true", help="time hack/test.sh too (cold and warm)")
    p.add_argument("--keep", action="store_true", help="keep the scratch directory")
    p.add_argument("--scratch", help="where the clone and its caches go (default: a new temporary directory)")
    p.add_argument("--limit", type=int, default=3600, help="seconds local-up.sh may take to its first allocation")
    args = p.parse_args(argv)
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                          check=True).stdout.strip()
    scratch = args.scratch or tempfile.mkdtemp(prefix="netcm-fresh-")
    os.makedirs(scratch, exist_ok=True)
    checkout = os.path.join(scratch, "netcm")
    subprocess.run(["git", "clone", "--quiet", "--no-local", root, checkout], check=True)
    env = fresh_env(scratch)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=checkout, capture_output=True, text=True,
                          check=True).stdout.strip()
    rows = []
    try:
        for state in ("cold", "warm"):
            log = os.path.join(scratch, f"local-up-{state}.log")
            seconds = first_allocation(checkout, env, log, args.limit)
            rows.append((f"hack/local-up.sh {state}, to the first allocation", seconds,
                         log if seconds is None else ""))
            print(format_table(rows[-1:]).splitlines()[-1], flush=True)
            forget_the_control_plane(checkout, env)
        if args.test:
            for state in ("cold", "warm"):
                log = os.path.join(scratch, f"test-{state}.log")
                code, seconds, steps = run_test_command(checkout, env, log)
                rows.append((f"hack/test.sh {state}", seconds, f"exit {code}; {log}"))
                rows.extend((f"  {step}", s, "") for s, step in steps)
                print(format_table(rows[-1 - len(steps):]), flush=True)
    finally:
        print(f"\n{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, {head}, {os.cpu_count()} cores; fresh: "
              "netcm's cache, cargo's target dir and registry, Go's build and module caches, cargo-installed "
              "tools; kept: Debian packages, the Rust toolchain")
        print(format_table(rows))
        if not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
