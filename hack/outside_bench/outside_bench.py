"""The outside harness: netcm against kube-controller-manager's nodeipam and the API server's ceiling, set up
as an independent run is, with none of the Rust bench's code.

Each contender starts on its own backlog of NODES Nodes of ~8 KB; a watch counts the Nodes holding a pod
CIDR and the time runs from the contender's start (the ceiling's first PATCH) to the last one. Between
contenders every Node, PodCIDRClaim and netcm Lease is deleted and etcd compacted and defragmented; netcm
goes first. The ceiling is CLIENTS threads PATCHing each Node's CIDR as fast as the server answers.

    hack/bench.sh outside        (sets KUBECONFIG, NETCM_BIN, KCM_BIN and ETCD_PORT; starts the control plane)

Environment: NODES (50000), CLIENTS (16), CLUSTER_CIDR (10.0.0.0/8), CONTENDERS (ceiling,netcm,kcm),
NETCM_QPS (1000; burst twice it), KCM_QPS (1000; burst twice it), NETCM_CONTROLLERS (the chart's:
subnet-allocator,node-annotation-syncer), TIMEOUT_SECONDS (1800).
"""

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kubeapi  # noqa: E402
from model import (  # noqa: E402
    SET_LABEL,
    AllocationCounter,
    WatchGone,
    chunk_selector,
    node_body,
    pod_cidr,
    process_usage,
    render_table,
)

CHUNK = 1000
LEASE_NAMESPACE = "kube-system"


def env_int(name, default):
    value = os.environ.get(name, str(default))
    try:
        return int(value)
    except ValueError:
        sys.exit(f"error: {name}={value!r} is not a whole number")


def log(msg):
    print(f"[outside] {time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)


def in_threads(count, work):
    """Runs work(k) for k in 0..count on `count` threads; re-raises the first error."""
    errors = []

    def run(k):
        try:
            work(k)
        except Exception as err:  # noqa: BLE001 - handed to the caller below
            errors.append(err)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def create_backlog(client, set_name, nodes, clients):
    def work(k):
        for i in range(k, nodes, clients):
            client.request("POST", "/api/v1/nodes", node_body(set_name, i, CHUNK))

    start = time.monotonic()
    in_threads(clients, work)
    return time.monotonic() - start


def delete_everything(client, etcd_port, nodes):
    """Every harness Node (a chunk per request, so none outlives the request timeout), PodCIDRClaim and
    netcm Lease; then etcd compacted and defragmented. Returns etcd's size before and after, MiB."""
    chunks = range((nodes + CHUNK - 1) // CHUNK)
    everything = urllib.parse.quote(SET_LABEL)
    for _ in range(20):
        in_threads(8, lambda k: [
            client.request("DELETE", f"/api/v1/nodes?labelSelector={urllib.parse.quote(chunk_selector(c))}")
            for c in chunks[k::8]
        ])
        # Whatever no chunk held (a larger NODES before): small by now.
        client.request("DELETE", f"/api/v1/nodes?labelSelector={everything}")
        _, body = client.request("GET", f"/api/v1/nodes?labelSelector={everything}&limit=1")
        if not body.get("items"):
            break
    else:
        raise kubeapi.ApiError("harness Nodes are left after 20 delete rounds")
    client.request("DELETE", "/apis/ipam.netcm.io/v1alpha1/podcidrclaims")
    not_apiserver = urllib.parse.quote("!apiserver.kubernetes.io/identity")
    client.request("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases?labelSelector={not_apiserver}")
    return compact_etcd(etcd_port)


def compact_etcd(port):
    def post(path, body):
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=300) as resp:
            return json.loads(resp.read())

    before = post("/v3/maintenance/status", {})
    post("/v3/kv/compaction", {"revision": before["header"]["revision"], "physical": True})
    post("/v3/maintenance/defragment", {})
    after = post("/v3/maintenance/status", {})
    return int(before["dbSize"]) / 2**20, int(after["dbSize"]) / 2**20


def follow(client, set_name, counter, version):
    """Feeds the watch of the set's Nodes into counter until it is done, relisting when the watch is gone."""
    selector = urllib.parse.quote(f"{SET_LABEL}={set_name}")
    base = f"/api/v1/nodes?labelSelector={selector}"
    while not counter.done.is_set():
        try:
            path = f"{base}&watch=1&allowWatchBookmarks=true&timeoutSeconds=600&resourceVersion={version}"
            for event in client.watch(path):
                version = counter.apply(event, time.monotonic()) or version
                if counter.done.is_set():
                    return
        except (WatchGone, OSError, ValueError, http.client.HTTPException, kubeapi.ApiError) as err:
            log(f"watch ended ({err}); relisting")
            items, version = client.list_all(base, page=1000)
            counter.reset(items, time.monotonic())


def start_watch(client, set_name, nodes):
    counter = AllocationCounter(nodes)
    _, body = client.request("GET", f"/api/v1/nodes?labelSelector={urllib.parse.quote(f'{SET_LABEL}={set_name}')}&limit=1")
    version = body["metadata"]["resourceVersion"]
    threading.Thread(target=follow, args=(client, set_name, counter, version), daemon=True).start()
    return counter


def run_ceiling(client, set_name, nodes, clients, cluster_cidr, timeout):
    counter = start_watch(client, set_name, nodes)

    def work(k):
        for i in range(k, nodes, clients):
            cidr = pod_cidr(cluster_cidr, i)
            client.request(
                "PATCH",
                f"/api/v1/nodes/{set_name}-{i:05d}",
                {"spec": {"podCIDR": cidr, "podCIDRs": [cidr]}},
                content_type="application/merge-patch+json",
            )

    start = time.monotonic()
    in_threads(clients, work)
    if not counter.done.wait(timeout):
        raise TimeoutError(f"the ceiling's watch saw {counter.count()} of {nodes} Nodes with a CIDR")
    return {"seconds": counter.last - start, "spread": counter.last - counter.first}


def run_process(client, label, argv, set_name, nodes, timeout):
    counter = start_watch(client, set_name, nodes)
    log_path = f"/tmp/outside-{label}.log"
    with open(log_path, "w") as out:
        start = time.monotonic()
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    log(f"started {label} (pid {proc.pid}, log {log_path})")
    try:
        deadline = start + timeout
        while not counter.done.wait(1):
            if proc.poll() is not None:
                raise RuntimeError(f"{label} exited ({proc.returncode}) with {counter.count()} of {nodes} Nodes holding a CIDR; see {log_path}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{label}: the watch saw {counter.count()} of {nodes} Nodes with a CIDR after {timeout} s")
        with open(f"/proc/{proc.pid}/stat") as stat, open(f"/proc/{proc.pid}/status") as status:
            cpu, rss = process_usage(stat.read(), status.read(), os.sysconf("SC_CLK_TCK"))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return {"seconds": counter.last - start, "spread": counter.last - counter.first, "cpu": cpu, "rss_mib": rss}


def contender_argv(name, kubeconfig, cluster_cidr):
    if name == "netcm":
        qps = env_int("NETCM_QPS", 1000)
        controllers = os.environ.get("NETCM_CONTROLLERS", "subnet-allocator,node-annotation-syncer")
        return [
            os.environ["NETCM_BIN"], f"--kubeconfig={kubeconfig}", f"--controllers={controllers}",
            f"--cluster-cidr={cluster_cidr}", f"--leader-elect-resource-namespace={LEASE_NAMESPACE}",
            "--port=0", f"--kube-api-qps={qps}", f"--kube-api-burst={2 * qps}",
        ]
    qps = env_int("KCM_QPS", 1000)
    return [
        os.environ["KCM_BIN"], f"--kubeconfig={kubeconfig}", "--controllers=nodeipam",
        "--allocate-node-cidrs=true", f"--cluster-cidr={cluster_cidr}", "--node-cidr-mask-size=24",
        "--leader-elect=false", "--secure-port=0", "--use-service-account-credentials=false",
        f"--kube-api-qps={qps}", f"--kube-api-burst={2 * qps}",
    ]


def main():
    nodes, clients = env_int("NODES", 50000), env_int("CLIENTS", 16)
    timeout = env_int("TIMEOUT_SECONDS", 1800)
    cluster_cidr = os.environ.get("CLUSTER_CIDR", "10.0.0.0/8")
    contenders = [c.strip() for c in os.environ.get("CONTENDERS", "ceiling,netcm,kcm").split(",") if c.strip()]
    unknown = [c for c in contenders if c not in ("ceiling", "netcm", "kcm")]
    if unknown:
        sys.exit(f"error: CONTENDERS names {unknown}; known: ceiling, netcm, kcm")
    kubeconfig, etcd_port = os.environ["KUBECONFIG"], os.environ["ETCD_PORT"]
    with open(kubeconfig) as f:
        client = kubeapi.Client(kubeapi.parse_kubeconfig(f.read()))

    rows, notes = {}, []
    for name in contenders:
        before, after = delete_everything(client, etcd_port, nodes)
        set_name = f"outside-{name}-{int(time.time()) % 100000}"
        log(f"{name}: etcd {before:.1f} → {after:.1f} MiB; creating {nodes} Nodes")
        created = create_backlog(client, set_name, nodes, clients)
        status, stored = client.request("GET", f"/api/v1/nodes/{set_name}-00000")
        size = len(json.dumps(stored)) if status == 200 else 0
        notes.append(f"{name}: backlog created in {created:.1f} s ({size} bytes per Node as served)")
        log(notes[-1])
        if name == "ceiling":
            rows[name] = run_ceiling(client, set_name, nodes, clients, cluster_cidr, timeout)
        else:
            rows[name] = run_process(client, name, contender_argv(name, kubeconfig, cluster_cidr), set_name, nodes, timeout)
        log(f"{name}: every Node holds a CIDR after {rows[name]['seconds']:.1f} s")
    delete_everything(client, etcd_port, nodes)
    print(f"\nNODES={nodes} CLIENTS={clients} on {os.cpu_count()} cores, {time.strftime('%Y-%m-%d %H:%M')}")
    print("\n".join(notes) + "\n")
    print(render_table(rows))


if __name__ == "__main__":
    try:
        main()
    except (RuntimeError, TimeoutError, kubeapi.ApiError) as err:
        sys.exit(f"error: {err}")
