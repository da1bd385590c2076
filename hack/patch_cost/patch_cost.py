"""What one pod-CIDR write costs kube-apiserver and etcd, by the form of the PATCH, on one server.

  patch_cost.py KUBECONFIG NODES ROUNDS [FORM ...]

For each round and each form (in an order rotated per round), NODES fresh Nodes with a kubelet-sized
status are created, then each gets its pod CIDRs by one PATCH of that form from CLIENTS threads, while the
CPU kube-apiserver and etcd spend is read from /proc. It prints, per form, the median over rounds of the
server CPU per PATCH and of the writes per second: the PATCH forms of netcm and of kube-controller-manager
side by side on the same Nodes and server, in isolation (no controller, no informer).
"""

import http.client
import json
import os
import re
import ssl
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

CLIENTS = int(os.environ.get("CLIENTS", "16"))
JSON = "application/json"
PROTOBUF = "application/vnd.kubernetes.protobuf"
METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1, application/json"
METADATA_PROTOBUF = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"


def pod_cidrs(i):
    return [f"10.{(i >> 8) & 255}.{i & 255}.0/24"]


def json_patch(uid, cidrs):
    """netcm's: tests of the UID and of the fence annotation, then both pod CIDR fields."""
    return [
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "test", "path": "/metadata/annotations/ipam.netcm.io~1fenced-at", "value": None},
        {"op": "add", "path": "/spec/podCIDR", "value": cidrs[0]},
        {"op": "add", "path": "/spec/podCIDRs", "value": cidrs},
    ]


def spec_patch(cidrs):
    return {"spec": {"podCIDR": cidrs[0], "podCIDRs": cidrs}}


def uid_spec_patch(uid, cidrs):
    return {"metadata": {"uid": uid}, **spec_patch(cidrs)}


# name: (content type, body builder(uid, cidrs), Accept, extra query)
FORMS = {
    # netcm's write as it sends it: JSON Patch, metadata-only answer, its field manager and timeout.
    "netcm-json-patch": ("application/json-patch+json", json_patch, METADATA, "fieldManager=netcm&timeout=9500ms"),
    # The same, with the unknown-field check off (a strict decode of the patched Node otherwise).
    "json-patch-validation-ignored": ("application/json-patch+json", json_patch, METADATA,
                                      "fieldManager=netcm&timeout=9500ms&fieldValidation=Ignore"),
    "json-patch-full-answer": ("application/json-patch+json", json_patch, JSON, "fieldManager=netcm"),
    "json-patch-metadata-protobuf-answer": ("application/json-patch+json", json_patch, METADATA_PROTOBUF,
                                            "fieldManager=netcm&timeout=9500ms"),
    "json-patch-protobuf-answer": ("application/json-patch+json", json_patch, PROTOBUF,
                                   "fieldManager=netcm&timeout=9500ms"),
    # kube-controller-manager's nodeipam: a strategic merge patch of spec, answered in protobuf.
    "kcm-strategic-merge": ("application/strategic-merge-patch+json", lambda u, c: spec_patch(c), PROTOBUF, ""),
    "strategic-merge-uid-metadata-answer": (
        "application/strategic-merge-patch+json", uid_spec_patch, METADATA, "fieldManager=netcm&timeout=9500ms"),
    "merge-uid-metadata-answer": ("application/merge-patch+json", uid_spec_patch, METADATA,
                                  "fieldManager=netcm&timeout=9500ms"),
}


# What a kubelet annotates its Node with: netcm's fence test reads a member of this map.
KUBELET_ANNOTATIONS = {"volumes.kubernetes.io/controller-managed-attach-detach": "true",
                       "node.alpha.kubernetes.io/ttl": "0"}


def status(i):
    """A kubelet's status: addresses, resources, four conditions, node info, a dozen images."""
    when = "2026-12-01T00:00:00Z"
    return {
        "addresses": [{"type": "InternalIP", "address": f"198.18.{(i >> 8) & 255}.{i & 255}"},
                      {"type": "Hostname", "address": f"cost-{i}"}],
        "capacity": {"cpu": "32", "memory": "131900000Ki", "pods": "110", "ephemeral-storage": "400000000Ki"},
        "allocatable": {"cpu": "31500m", "memory": "130000000Ki", "pods": "110", "ephemeral-storage": "380000000000"},
        "conditions": [{"type": t, "status": s, "reason": "Kubelet" + t, "message": f"kubelet reports {t}",
                        "lastHeartbeatTime": when, "lastTransitionTime": when}
                       for t, s in (("MemoryPressure", "False"), ("DiskPressure", "False"),
                                    ("PIDPressure", "False"), ("Ready", "True"))],
        "nodeInfo": {"machineID": "0" * 32, "systemUUID": "1" * 36, "bootID": "2" * 36,
                     "kernelVersion": "6.12.0-amd64", "osImage": "Debian GNU/Linux 13",
                     "containerRuntimeVersion": "containerd://2.1.0", "kubeletVersion": "v1.36.3",
                     "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
        "images": [{"names": [f"registry.test/app/component-{j}@sha256:{'f' * 64}",
                              f"registry.test/app/component-{j}:v2.{j}.1"],
                    "sizeBytes": 25_000_000 + j * 1_000_000} for j in range(12)],
    }


def kubeconfig_endpoint(path):
    text = open(path).read()
    field = {k: re.search(rf"^\s*{k}:\s*(\S+)\s*$", text, re.M).group(1)
             for k in ("server", "certificate-authority", "client-certificate", "client-key")}
    url = urllib.parse.urlsplit(field["server"])
    ctx = ssl.create_default_context(cafile=field["certificate-authority"])
    ctx.load_cert_chain(field["client-certificate"], field["client-key"])
    return url.hostname, url.port, ctx


class Api:
    def __init__(self, kubeconfig):
        self.host, self.port, self.ctx = kubeconfig_endpoint(kubeconfig)
        self.local = threading.local()

    def call(self, method, path, body=None, ctype=JSON, accept=JSON, ok=(200, 201)):
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=120)
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Content-Type": ctype, "Accept": accept})
        resp = conn.getresponse()
        raw = resp.read()
        if resp.status not in ok:
            raise RuntimeError(f"{method} {path}: {resp.status} {raw[:300]!r}")
        return raw


def parallel(fn, items):
    """`fn` on every item from CLIENTS threads; the first error is raised once all ended."""
    with ThreadPoolExecutor(CLIENTS) as pool:
        for _ in pool.map(fn, items):
            pass


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pid_of(pattern):
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()
    if not out:
        raise SystemExit(f"no process matches {pattern!r}")
    return int(out[0])


def one_run(api, form, tag, n, pids):
    names = [f"cost-{tag}-{i:05d}" for i in range(n)]
    uids = {}

    def create(i):
        raw = api.call("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node",
                                                  "metadata": {"name": names[i], "labels": {"netcm.io/cost": tag},
                                                               "annotations": KUBELET_ANNOTATIONS}})
        uids[i] = json.loads(raw)["metadata"]["uid"]
        api.call("PATCH", f"/api/v1/nodes/{names[i]}/status", {"status": status(i)}, "application/merge-patch+json")

    parallel(create, range(n))
    ctype, build, accept, query = FORMS[form]
    before = {k: cpu_seconds(p) for k, p in pids.items()}
    start = time.monotonic()
    parallel(lambda i: api.call("PATCH", f"/api/v1/nodes/{names[i]}" + (f"?{query}" if query else ""),
                                build(uids[i], pod_cidrs(i)), ctype, accept), range(n))
    wall = time.monotonic() - start
    cpu = {k: cpu_seconds(p) - before[k] for k, p in pids.items()}
    api.call("DELETE", f"/api/v1/nodes?labelSelector=netcm.io%2Fcost%3D{tag}")
    return {"form": form, "wall": wall, **cpu}


def main(argv):
    kubeconfig, n, rounds = argv[1], int(argv[2]), int(argv[3])
    forms = argv[4:] or list(FORMS)
    api = Api(kubeconfig)
    port = api.port
    pids = {"apiserver": pid_of(f"kube-apiserver.*--secure-port[= ]{port}"), "etcd": pid_of("etcd .*--data-dir")}
    # Nodes a stopped run left behind.
    api.call("DELETE", "/api/v1/nodes?labelSelector=netcm.io%2Fcost")
    results = {f: [] for f in forms}
    for r in range(rounds):
        order = forms[r % len(forms):] + forms[:r % len(forms)]
        for f in order:
            row = one_run(api, f, f"{os.getpid()}-{r}-{forms.index(f)}", n, pids)
            results[f].append(row)
            print(f"round {r} {f}: {row['wall']:.1f} s, kube-apiserver {row['apiserver']:.2f} s CPU, "
                  f"etcd {row['etcd']:.2f} s CPU", file=sys.stderr, flush=True)
    print(f"\n{n} Nodes per run, {CLIENTS} clients, median of {rounds} rounds\n")
    print("| PATCH form | kube-apiserver CPU per write | etcd CPU per write | writes/s |")
    print("|---|---|---|---|")
    for f in forms:
        rows = results[f]
        med = lambda k: statistics.median(r[k] for r in rows)  # noqa: E731
        print(f"| {f} | {1000 * med('apiserver') / n:.2f} ms | {1000 * med('etcd') / n:.2f} ms | "
              f"{n / med('wall'):.0f} |")


if __name__ == "__main__":
    main(sys.argv)
