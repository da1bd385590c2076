"""The machine: processes, the record of machine-wide changes, and undoing them.

Every machine-wide change is appended to RUN/record *before* it is made, so `down` (from any checkout, after
any crash) undoes exactly what `up` did. RUN/lock (flock) serialises up/down/add/remove; it is released when
the process exits, whatever happens, so no run can leave it held.
"""

import fcntl
import os
import signal
import subprocess
import time

RUN = "/run/netcm-cluster"
# The sysctls kubelet, kube-proxy and CNI plugins are known to set in the host's namespace (the rest are
# per network namespace and die with the node's).
SYSCTLS = ["vm.overcommit_memory", "vm.panic_on_oom", "kernel.panic", "kernel.panic_on_oops",
           "kernel.keys.root_maxkeys", "kernel.keys.root_maxbytes"]
# Paths outside the state dir the components create whatever their flags say; removed on `down` if `up`
# found them absent.
MACHINE_DIRS = ["/var/lib/kubelet", "/var/log/pods", "/var/log/containers", "/var/lib/cni", "/etc/cni",
                "/opt/cni", "/run/containerd", "/var/lib/containerd", "/opt/containerd",
                "/usr/libexec/kubernetes", "/etc/kubernetes", "/var/run/kubernetes", "/run/netns"]


def log(msg):
    print(f"[cluster] {msg}", flush=True, file=__import__("sys").stderr)


def sh(*args, check=True, capture=True, **kw):
    """Run a command; its stdout (stripped) when captured."""
    r = subprocess.run(args, check=False, text=True, capture_output=capture, **kw)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))}: exit {r.returncode}: {(r.stderr or '').strip()}")
    return (r.stdout or "").strip() if capture else ""


def try_sh(*args):
    """A command whose failure is expected (already gone, not there yet)."""
    return subprocess.run(args, check=False, capture_output=True, text=True).returncode == 0


class Lock:
    def __init__(self):
        os.makedirs(RUN, exist_ok=True)
        self.f = open(f"{RUN}/lock", "w")

    def __enter__(self):
        deadline = time.time() + 60
        while True:
            try:
                fcntl.flock(self.f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                if time.time() > deadline:
                    raise RuntimeError(f"another hack/cluster.sh up/down holds {RUN}/lock")
                time.sleep(0.5)

    def __exit__(self, *exc):
        fcntl.flock(self.f, fcntl.LOCK_UN)
        self.f.close()


def record(line):
    with open(f"{RUN}/record", "a") as f:
        f.write(line + "\n")


def recorded():
    try:
        with open(f"{RUN}/record") as f:
            return [line.split() for line in f if line.strip()]
    except FileNotFoundError:
        return []


def snapshot(owner):
    """The first lines of a new record: who owns it, the host sysctls to restore, the dirs to remove."""
    with open(f"{RUN}/record", "w") as f:
        f.write(f"owner {owner}\n")
    for key in SYSCTLS:
        v = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True)
        if v.returncode == 0:
            record(f"sysctl {key} {v.stdout.strip()}")
    for d in MACHINE_DIRS:
        if not os.path.exists(d):
            record(f"dir {d}")


# --- processes ----------------------------------------------------------------------------------------


def start(name, args, logdir, netns=None):
    """A daemon in its own session, output in logdir/name.log, pid in logdir/name.pid; inside netns
    through `nsenter --net` (not `ip netns exec`, which remounts /sys and hides the cgroup tree)."""
    if netns:
        args = ["nsenter", f"--net=/run/netns/{netns}", "--"] + list(args)
    out = open(f"{logdir}/{name}.log", "ab")
    p = subprocess.Popen(args, stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True)
    with open(f"{logdir}/{name}.pid", "w") as f:
        f.write(str(p.pid))
    return p.pid


def alive(logdir, name):
    try:
        pid = int(open(f"{logdir}/{name}.pid").read())
        os.kill(pid, 0)
        return True
    except (OSError, ValueError):
        return False


def stop(logdir, name, grace=5):
    """SIGTERM, then SIGKILL after grace seconds."""
    path = f"{logdir}/{name}.pid"
    try:
        pid = int(open(path).read())
    except (OSError, ValueError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
        deadline = time.time() + grace
        while time.time() < deadline:
            os.kill(pid, 0)
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        while os.path.exists(f"/proc/{pid}") and "zombie" not in open(f"/proc/{pid}/status").read():
            time.sleep(0.05)
    os.remove(path)


def pids_naming(text):
    """Processes whose command line contains text (a node's state dir: its shims and containers)."""
    found = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            if text in open(f"/proc/{p}/cmdline").read().replace("\0", " "):
                found.append(int(p))
        except OSError:
            pass
    return found


def cgroup_dirs(name):
    """The node's cgroupRoot in every hierarchy (not the symlinked co-mounts)."""
    return [f"/sys/fs/cgroup/{h}/{name}" for h in sorted(os.listdir("/sys/fs/cgroup"))
            if not os.path.islink(f"/sys/fs/cgroup/{h}")]


def cgroup_pids(name):
    found = set()
    for d in cgroup_dirs(name):
        for dirpath, _, files in os.walk(d):
            if "cgroup.procs" in files:
                try:
                    found.update(int(x) for x in open(f"{dirpath}/cgroup.procs").read().split())
                except OSError:
                    pass
    return found


def make_cgroups(name):
    """cgroupRoot must exist in every hierarchy kubelet validates, with cpuset's cpus/mems set (else ENOSPC)."""
    for d in cgroup_dirs(name):
        os.makedirs(d, exist_ok=True)
    for f in ("cpus", "mems"):
        with open(f"/sys/fs/cgroup/cpuset/cpuset.{f}") as src, open(f"/sys/fs/cgroup/cpuset/{name}/cpuset.{f}", "w") as dst:
            dst.write(src.read())


def remove_cgroups(name, seconds=10):
    deadline = time.time() + seconds
    for d in cgroup_dirs(name):
        while os.path.isdir(d):
            for dirpath, dirs, _ in os.walk(d, topdown=False):
                try:
                    os.rmdir(dirpath)
                except OSError:
                    pass
            if os.path.isdir(d):
                if time.time() > deadline:
                    log(f"could not remove cgroup {d} (processes still in it: {sorted(cgroup_pids(name))})")
                    break
                for pid in cgroup_pids(name):
                    kill(pid)
                time.sleep(0.2)


def kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def unmount_under(path):
    """Mounts under path (rootfs, shm, secrets, pod network namespaces), deepest first."""
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4]
            if mp.startswith(path + "/"):
                mounts.append(mp)
    for mp in sorted(mounts, reverse=True):
        try_sh("umount", "-l", mp)


def delete_netns(name, seconds=20):
    """`ip netns del` once nothing runs in it; a pod still terminating keeps it busy, so retry, killing
    what remains, rather than leave it behind (EBUSY)."""
    deadline = time.time() + seconds
    while os.path.exists(f"/run/netns/{name}"):
        for pid in sh("ip", "netns", "pids", name, check=False).split():
            kill(int(pid))
        if try_sh("ip", "netns", "del", name):
            return
        if time.time() > deadline:
            raise RuntimeError(f"could not delete network namespace {name}")
        time.sleep(0.3)
