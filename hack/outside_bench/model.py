"""The outside harness's pure parts: the Nodes it creates, the CIDRs its ceiling writes, the watch's count of
Nodes holding a CIDR, a process's CPU and peak memory, and the table it prints."""

import ipaddress
import threading

# The label naming the set a Node belongs to (one set per contender); `<SET_LABEL>-chunk` groups them by
# the thousand, so a delete request never outlives the server's request timeout.
SET_LABEL = "outside.netcm.io/set"
IMAGES = 28


def chunk_selector(chunk):
    """The label selector of one chunk of harness Nodes."""
    return f"{SET_LABEL}-chunk={chunk}"


def node_body(set_name, i, chunk_size):
    """Node i of a set, registered with its status in one POST as a kubelet does: ~8 KB as served."""
    name = f"{set_name}-{i:05d}"
    stamp = "2026-01-01T00:00:00Z"
    conditions = [
        {"type": t, "status": s, "reason": r, "message": f"kubelet reports {t}",
         "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}
        for t, s, r in [
            ("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            ("PIDPressure", "False", "KubeletHasSufficientPID"),
            ("Ready", "True", "KubeletReady"),
        ]
    ]
    images = [
        {"names": [f"registry.example.org/app-{k}/img@sha256:{(i * 31 + k):064x}", f"registry.example.org/app-{k}/img:{k}.{i}"],
         "sizeBytes": 50_000_000 + k * 999_983}
        for k in range(IMAGES)
    ]
    resources = {"cpu": "16", "memory": "65843856Ki", "pods": "110", "ephemeral-storage": "203056560Ki"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                SET_LABEL: set_name, f"{SET_LABEL}-chunk": str(i // chunk_size),
            },
        },
        "status": {
            "conditions": conditions,
            "addresses": [
                {"type": "InternalIP", "address": f"100.64.{(i // 250) % 250}.{i % 250 + 1}"},
                {"type": "Hostname", "address": name},
            ],
            "capacity": resources,
            "allocatable": dict(resources, cpu="15800m"),
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": f"{i:032x}", "systemUUID": f"{i:032x}", "bootID": f"{i:032x}",
                "kernelVersion": "6.1.0-28-amd64", "osImage": "Debian GNU/Linux 12 (bookworm)",
                "containerRuntimeVersion": "containerd://1.7.24", "kubeletVersion": "v1.36.3",
                "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
            },
            "images": images,
        },
    }


def pod_cidr(cluster_cidr, i, prefix=24):
    """The i-th /prefix of the cluster CIDR, as the ceiling writes it to Node i."""
    net = ipaddress.ip_network(cluster_cidr)
    count = 1 << (prefix - net.prefixlen)
    if not 0 <= i < count:
        raise ValueError(f"{cluster_cidr} holds {count} /{prefix}s, not {i + 1}")
    return str(ipaddress.ip_network((int(net.network_address) + (i << (net.max_prefixlen - prefix)), prefix)))


class WatchGone(Exception):
    """The watch's resourceVersion is too old (410) or the server ended it with an error: relist."""


class AllocationCounter:
    """The Nodes of a set that hold a pod CIDR, from a watch's events; done once `expected` do."""

    def __init__(self, expected):
        self.expected = expected
        self.holding = set()
        self.first = None
        self.last = None
        self.done = threading.Event()
        self._lock = threading.Lock()

    def count(self):
        with self._lock:
            return len(self.holding)

    def _observe(self, node, now):
        name = node["metadata"]["name"]
        if (node.get("spec") or {}).get("podCIDR"):
            if name not in self.holding:
                self.holding.add(name)
                if self.first is None:
                    self.first = now
                if len(self.holding) >= self.expected and not self.done.is_set():
                    self.last = now
                    self.done.set()
        else:
            self.holding.discard(name)

    def apply(self, event, now):
        """Takes one watch event; returns the resourceVersion to resume from, if it names one."""
        kind, obj = event.get("type"), event.get("object") or {}
        if kind == "ERROR":
            raise WatchGone(f"{obj.get('code')}: {obj.get('message')}")
        with self._lock:
            if kind in ("ADDED", "MODIFIED"):
                self._observe(obj, now)
            elif kind == "DELETED":
                self.holding.discard(obj["metadata"]["name"])
        return (obj.get("metadata") or {}).get("resourceVersion")

    def reset(self, nodes, now):
        """Starts again from a list of the set's Nodes (after a watch was lost)."""
        with self._lock:
            self.holding.clear()
            for node in nodes:
                self._observe(node, now)


def process_usage(stat, status, ticks_per_second):
    """CPU seconds (user + system) from /proc/PID/stat and peak RSS in MiB (VmHWM) from /proc/PID/status."""
    # The command name may hold spaces and parentheses; the fields after the last ')' do not.
    fields = stat[stat.rindex(")") + 2:].split()
    cpu = (int(fields[11]) + int(fields[12])) / ticks_per_second
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return cpu, int(line.split()[1]) / 1024
    raise ValueError("/proc/PID/status has no VmHWM line")


LABELS = {"ceiling": "API ceiling: concurrent merge PATCHes of the CIDR", "netcm": "netcm", "kcm": "kube-controller-manager nodeipam"}


def render_table(rows):
    """The markdown table of the contenders' rows (seconds, spread, and for processes cpu and rss_mib)."""
    ceiling = rows.get("ceiling", {}).get("seconds")
    kcm = rows.get("kcm", {}).get("seconds")
    out = [
        "| contender | every Node holds its CIDR | × ceiling | × kube-controller-manager | first → last CIDR | peak RSS | CPU |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        ratio = lambda base: f"{row['seconds'] / base:.2f}" if base else "–"  # noqa: E731
        rss = f"{row['rss_mib']:.1f} MiB" if "rss_mib" in row else "–"
        cpu = f"{row['cpu']:.1f} s" if "cpu" in row else "–"
        out.append(
            f"| {LABELS.get(name, name)} | {row['seconds']:.1f} s | {ratio(ceiling)} | {ratio(kcm)} | {row['spread']:.1f} s | {rss} | {cpu} |"
        )
    return "\n".join(out)
