"""A multi-node Kubernetes cluster on this machine: one network namespace per node (hack/cluster.sh).

What `up` starts, all from the cached v1.36.3 binaries and Debian's containerd/runc/CNI plugins:
  - a control plane of its own (hack/controlplane.sh in node mode, state in <state>/controlplane): etcd and
    kube-apiserver on API_HOST, the host's address on the node bridge; kube-controller-manager (every
    controller but netcm's jobs: --allocate-node-cidrs=false, no cloud routes) and kube-scheduler, on the host;
  - NODES (default 3) nodes ncm-n1…: each containerd + kubelet + kube-proxy in the network namespace
    /run/netns/ncm-nX, started with `nsenter --net` (not `ip netns exec`, which remounts /sys).

Addresses (all in 198.18.0.0/15, never routed off the machine):
  bridge ncm-nodes0       198.19.254.1/24, fd00:198:19:254::1/64 (API_HOST; the nodes' default gateway)
  node ncm-nX             198.19.254.(10+X), fd00:198:19:254::(10+X) on eth0 (veth ncm-nXh on the bridge)
  CLUSTER_CIDR            198.19.128.0/18 (/24 per node, 64 nodes; clear of the node bridge 198.19.254.0/24),
                          fd00:198:19:1000::/56 (/64 per node): netcm's
                          --cluster-cidr; nothing gives pods an address until netcm gives the Node its CIDRs
  SERVICE_CIDR            198.19.17.0/24
Pod traffic leaving the pod network is masqueraded inside the node's namespace, so the host needs no pod
routes; a FORWARD rule drops anything from the bridge to any other host link.

Per node X (state S = <state>/nodes/ncm-nX; what must differ per node on one machine):
  kubelet     --root-dir S/kubelet, --cert-dir S/pki, cgroupRoot /ncm-nX (in every cgroup hierarchy),
              podLogsDir S/pod-logs, volumePluginDir S/volume-plugins, address/--node-ip its own addresses
  containerd  root/state/sockets/opt/runc root under S/containerd; netns_mounts_under_state_dir
  CNI         bin_dir S/cni/bin (symlinks to /usr/lib/cni/*), conf_dir S/cni/net.d, host-local S/cni/ipam;
              CNI=bridge (default): conf_template S/cni/template.json, rendered by containerd from the
              Node's pod CIDRs (bridge cni0 + host-local, both families); CNI=flannel: reserved for the
              flannel configuration (a static conflist in S/cni/net.d, written by its installer). `up`
              saves the choice in <state>/cni, so add-node gives a later node the same
  kube-proxy  --hostname-override ncm-nX, --conntrack-max-per-core 0 (nf_conntrack_max is read-only in a
              namespace), health/metrics on the namespace's 127.0.0.1
Logs: <state>/*.log (control plane side) and S/*.log.

  hack/cluster.sh up            start (NODES=N); last line: KUBECONFIG=<path>
  hack/cluster.sh down          stop everything, undo every machine-wide change recorded and clear what up
                                wrote under the state dir (every node's directory, certificates, configs)
                                but the logs
  hack/cluster.sh env           the cluster's facts as shell assignments
  hack/cluster.sh load TAR IMAGE   import an OCI archive into every node's containerd (and later nodes')
  hack/cluster.sh add-node      one more node (the next free ncm-nX)
  hack/cluster.sh node-credentials NAME   a kubelet's client certificate for the Node NAME (group
                                system:nodes), as a bootstrap token's holder can have one signed for any
                                name; last line: KUBECONFIG=<path> (the hostile-node tests register Nodes
                                with it; no kubelet runs)
  hack/cluster.sh remove-node NAME   stop the node, delete its namespace and its Node object, clear its
                                     directory but the logs

Environment: NETCM_CLUSTER_DIR (state; default <checkout>/_out/cluster), NODES, CNI, NETCM_CACHE_DIR.
"""

import os
import re
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import machine as m  # noqa: E402
import render  # noqa: E402
from machine import log, sh, try_sh  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
STATE = os.path.abspath(os.environ.get("NETCM_CLUSTER_DIR", f"{ROOT}/_out/cluster"))
BRIDGE = "ncm-nodes0"
API_HOST = "198.19.254.1"
API_HOST6 = "fd00:198:19:254::1"
CLUSTER_CIDR = "198.19.128.0/18,fd00:198:19:1000::/56"
SERVICE_CIDR = "198.19.17.0/24"
FORWARD_RULE = ["FORWARD", "-i", BRIDGE, "!", "-o", BRIDGE, "-m", "comment", "--comment",
                "netcm-cluster: nodes stay on this host", "-j", "DROP"]
CNI_PLUGINS = ["bridge", "host-local", "loopback", "portmap"]


class Node:
    def __init__(self, x):
        self.x = x
        self.name = f"ncm-n{x}"
        self.ipv4 = f"198.19.254.{10 + x}"
        self.ipv6 = f"fd00:198:19:254::{10 + x}"
        self.s = f"{STATE}/nodes/{self.name}"
        self.mac = f"0a:58:c6:13:{x // 256:02x}:{x % 256:02x}"

    @staticmethod
    def named(name):
        if not name.startswith("ncm-n") or not name[5:].isdigit():
            raise SystemExit(f"not a node of this cluster: {name}")
        return Node(int(name[5:]))

    @property
    def sock(self):
        return f"{self.s}/containerd/containerd.sock"

    def ns(self, *args, check=True):
        return sh("nsenter", f"--net=/run/netns/{self.name}", "--", *args, check=check)


def controlplane(*args):
    env = dict(os.environ, NETCM_CONTROLPLANE_DIR=f"{STATE}/controlplane", NETCM_NODE_MODE="1",
               NETCM_API_HOST=API_HOST, NETCM_SERVICE_CIDR=SERVICE_CIDR)
    return sh("bash", f"{ROOT}/hack/controlplane.sh", *args, env=env)


def binary(name):
    return controlplane("bin", name).splitlines()[-1]


def kubectl(*args, check=True):
    return sh(binary("kubectl"), f"--kubeconfig={STATE}/controlplane/kubeconfig", *args, check=check)


def wait(what, seconds, probe):
    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            if probe():
                return
        except Exception:  # noqa: BLE001 - not ready yet, whatever the reason
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{what} not ready after {seconds}s (logs in {STATE})")


def cert(pki, name, subject, ext):
    ca = f"{STATE}/controlplane/pki"
    if os.path.exists(f"{pki}/{name}.crt"):
        return
    os.makedirs(pki, exist_ok=True)
    with open(f"{pki}/{name}.ext", "w") as f:
        f.write(ext)
    sh("openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{pki}/{name}.key", "-out",
       f"{pki}/{name}.csr", "-subj", subject)
    sh("openssl", "x509", "-req", "-in", f"{pki}/{name}.csr", "-CA", f"{ca}/ca.crt", "-CAkey", f"{ca}/ca.key",
       "-CAcreateserial", "-days", "3650", "-extfile", f"{pki}/{name}.ext", "-out", f"{pki}/{name}.crt")


def client(pki, name, subject, out):
    cert(pki, name, subject, "extendedKeyUsage=clientAuth")
    port = dict(line.split("=", 1) for line in open(f"{STATE}/controlplane/env").read().split())["APISERVER_PORT"]
    with open(out, "w") as f:
        f.write(render.kubeconfig(f"https://{API_HOST}:{port}", f"{STATE}/controlplane/pki/ca.crt",
                                  f"{pki}/{name}.crt", f"{pki}/{name}.key", name))


def images():
    try:
        return [line.split() for line in open(f"{STATE}/images") if line.strip()]
    except FileNotFoundError:
        return []


def load(node, tar, image):
    # The archive's reference is the tag alone (umoci); --base-name makes it IMAGE's repository:tag.
    sh("ctr", "--address", node.sock, "-n", "k8s.io", "images", "import", "--base-name", image.rsplit(":", 1)[0], tar)
    if image not in sh("ctr", "--address", node.sock, "-n", "k8s.io", "images", "ls", "-q").split():
        raise RuntimeError(f"imported {tar} into {node.name}, but its containerd has no image {image}")


def cmd_load(tar, image):
    with m.Lock():
        with open(f"{STATE}/images", "a") as f:
            f.write(f"{tar} {image}\n")
        for node in nodes():
            load(node, tar, image)
            log(f"imported {image} into {node.name}")


def nodes():
    d = f"{STATE}/nodes"
    names = [n for n in os.listdir(d) if os.path.exists(f"/run/netns/{n}")] if os.path.isdir(d) else []
    return sorted((Node.named(n) for n in names), key=lambda n: n.x)


def add_node(node):
    """The node's namespace and wiring, then its daemons; returns once its kubelet runs (the Node stays
    NotReady until netcm gives it pod CIDRs: there is no CNI config before)."""
    s, n = node.s, node.name
    os.makedirs(s, exist_ok=True)
    m.record(f"netns {n}")
    sh("ip", "netns", "add", n)
    # A MAC of the node's number: a node re-created under its name is the same neighbour to its peers,
    # whose ARP/NDP caches would otherwise point at the gone veth for seconds.
    sh("ip", "link", "add", f"{n}h", "type", "veth", "peer", "name", "eth0", "netns", n, "address", node.mac)
    sh("ip", "link", "set", f"{n}h", "master", BRIDGE, "up")
    for args in (["link", "set", "lo", "up"], ["addr", "add", f"{node.ipv4}/24", "dev", "eth0"],
                 ["-6", "addr", "add", f"{node.ipv6}/64", "dev", "eth0", "nodad"], ["link", "set", "eth0", "up"],
                 ["route", "add", "default", "via", API_HOST], ["-6", "route", "add", "default", "via", API_HOST6]):
        sh("ip", "-n", n, *args)
    node.ns("sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
    v4, v6 = CLUSTER_CIDR.split(",")
    node.ns("iptables", "-t", "nat", "-A", "POSTROUTING", "-s", v4, "!", "-d", v4, "-j", "MASQUERADE")
    node.ns("ip6tables", "-t", "nat", "-A", "POSTROUTING", "-s", v6, "!", "-d", v6, "-j", "MASQUERADE")
    m.record(f"cgroup {n}")
    m.make_cgroups(n)

    pki = f"{s}/pki"
    client(pki, "kubelet", f"/O=system:nodes/CN=system:node:{n}", f"{s}/kubelet.kubeconfig")
    cert(pki, "kubelet-serving", f"/CN={n}", f"subjectAltName=IP:{node.ipv4},IP:{node.ipv6},DNS:{n}\n"
         "extendedKeyUsage=serverAuth")
    for d in ("containerd", "cni/net.d", "cni/ipam", "cni/bin", "kubelet", "pod-logs", "volume-plugins"):
        os.makedirs(f"{s}/{d}", exist_ok=True)
    for p in CNI_PLUGINS:
        if not os.path.islink(f"{s}/cni/bin/{p}"):
            os.symlink(f"/usr/lib/cni/{p}", f"{s}/cni/bin/{p}")
    pause_image, pause_tar = pause()
    with open(f"{s}/containerd/config.toml", "w") as f:
        f.write(render.containerd_config(s, pause_image))
    if cni_of(STATE, os.environ) == "bridge":
        with open(f"{s}/cni/template.json", "w") as f:
            f.write(render.cni_template(n, s))
    with open(f"{s}/kubelet-config.yaml", "w") as f:
        f.write(render.kubelet_config(node, s, f"{STATE}/controlplane/pki/ca.crt"))

    m.start("containerd", ["containerd", "--config", f"{s}/containerd/config.toml"], s, netns=n)
    wait(f"{n}'s containerd", 30, lambda: try_sh("ctr", "--address", node.sock, "version"))
    load(node, pause_tar, pause_image)
    for tar, image in images():
        load(node, tar, image)
    m.start("kubelet", [binary("kubelet"), "--config", f"{s}/kubelet-config.yaml", "--kubeconfig",
                        f"{s}/kubelet.kubeconfig", "--root-dir", f"{s}/kubelet", "--cert-dir", pki,
                        "--hostname-override", n, "--node-ip", f"{node.ipv4},{node.ipv6}"], s, netns=n)
    m.start("kube-proxy", [binary("kube-proxy"), "--kubeconfig", f"{STATE}/kube-proxy.kubeconfig",
                           "--hostname-override", n, "--proxy-mode", "iptables", "--cluster-cidr", CLUSTER_CIDR,
                           "--nodeport-addresses", "primary", "--iptables-localhost-nodeports=false",
                           "--conntrack-max-per-core", "0", "--conntrack-tcp-timeout-established", "0s",
                           "--conntrack-tcp-timeout-close-wait", "0s",
                           "--metrics-bind-address", "127.0.0.1:10249", "--healthz-bind-address",
                           "127.0.0.1:10256"], s, netns=n)


_pause = []


def pause():
    if not _pause:
        out = sh("bash", f"{ROOT}/hack/image.sh", "pause", env=dict(os.environ, NETCM_IMAGE_OUT=f"{STATE}/images.d"))
        facts = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        _pause.extend([facts["IMAGE"], facts["TAR"]])
    return _pause


def stop_node(node, delete_node):
    """Everything of one node gone, even while its pods are still terminating."""
    s, n = node.s, node.name
    if delete_node and m.alive(s, "kubelet"):
        # Through the API first, so kubelet tears the sandboxes down (CNI DEL) while it still runs.
        kubectl("delete", "pods", "-A", f"--field-selector=spec.nodeName={n}", "--force", "--grace-period=0",
                "--wait=false", check=False)
        wait_tasks_gone(node, 15)
    for d in ("kube-proxy", "kubelet"):
        m.stop(s, d)
    if os.path.exists(node.sock):
        for task in sh("ctr", "--address", node.sock, "-n", "k8s.io", "tasks", "ls", "-q", check=False).split():
            try_sh("ctr", "--address", node.sock, "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", task)
    m.stop(s, "containerd")
    for pid in set(m.pids_naming(s)) | m.cgroup_pids(n):
        m.kill(pid)
    m.unmount_under(s)
    if os.path.exists(f"/run/netns/{n}"):
        m.delete_netns(n)
    m.remove_cgroups(n)
    if delete_node:
        kubectl("delete", "node", n, "--ignore-not-found", check=False)
    clear_node_dir(s)


def clear_node_dir(s):
    """Everything `up` and the node's pods wrote under the node's directory goes (containerd's and
    kubelet's state, the CNI config, template and IPAM, flannel's subnet.env, certificates, configs), so
    a later node of this name starts from nothing; its logs (*.log) stay for a post-mortem. The directory
    itself stays too: add-node never reuses a number whose directory exists."""
    try:
        entries = os.listdir(s)
    except FileNotFoundError:
        return
    for e in entries:
        path = f"{s}/{e}"
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        elif not e.endswith(".log"):
            os.remove(path)


def wait_tasks_gone(node, seconds):
    deadline = time.time() + seconds
    while time.time() < deadline:
        # Stopped tasks stay listed until kubelet removes their containers; only running ones matter.
        tasks = sh("ctr", "--address", node.sock, "-n", "k8s.io", "tasks", "ls", check=False).splitlines()[1:]
        if not any(t.split()[-1] != "STOPPED" for t in tasks if t.split()):
            return
        time.sleep(0.3)


def cmd_up():
    if os.getuid() != 0:
        raise SystemExit("a multi-node cluster needs root")
    count = int(os.environ.get("NODES", "3"))
    started = time.time()
    os.makedirs(STATE, exist_ok=True)
    for b in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl", "etcd"):
        binary(b)
    pause()
    with m.Lock():
        owner = next((r[1] for r in m.recorded() if r[0] == "owner"), None)
        if owner:
            if owner != STATE:
                raise SystemExit(f"the cluster of this machine belongs to {owner}: NETCM_CLUSTER_DIR={owner} hack/cluster.sh down")
            if all(m.alive(STATE, d) for d in ("kube-controller-manager", "kube-scheduler")) and \
                    len(nodes()) >= count and all(m.alive(n.s, "kubelet") for n in nodes()):
                cni_of(STATE, os.environ)
                log("reusing the running cluster")
                print(f"KUBECONFIG={STATE}/controlplane/kubeconfig")
                return
            log("a cluster of this state dir is partly up (crashed?): cleaning it first")
            down()
        cni = cni_of(STATE, os.environ)
        with open(f"{STATE}/cni", "w") as f:
            f.write(cni + "\n")
        m.snapshot(STATE)
        m.record(f"link {BRIDGE}")
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", f"{API_HOST}/24", "dev", BRIDGE)
        sh("ip", "-6", "addr", "add", f"{API_HOST6}/64", "dev", BRIDGE, "nodad")
        sh("ip", "link", "set", BRIDGE, "up")
        m.record("forward-rule")
        sh("iptables", "-I", *FORWARD_RULE)
        sh("ip6tables", "-I", *FORWARD_RULE)
        controlplane("up")
        start_host_components()
        for x in range(1, count + 1):
            add_node(Node(x))
        for node in nodes():
            wait(f"the Node {node.name}", 120, lambda n=node: kubectl("get", "node", n.name))
        wait("the default ServiceAccount", 60, lambda: kubectl("-n", "default", "get", "serviceaccount", "default"))
        wait("kube-root-ca.crt", 60, lambda: kubectl("-n", "kube-system", "get", "configmap", "kube-root-ca.crt"))
    log(f"up in {time.time() - started:.0f}s: {count} nodes registered (NotReady until netcm gives them pod CIDRs)")
    print(f"KUBECONFIG={STATE}/controlplane/kubeconfig")


def start_host_components():
    pki = f"{STATE}/pki"
    cp = f"{STATE}/controlplane/pki"
    for c, subject in (("kube-controller-manager", "/CN=system:kube-controller-manager"),
                       ("kube-scheduler", "/CN=system:kube-scheduler"), ("kube-proxy", "/CN=system:kube-proxy")):
        client(pki, c, subject, f"{STATE}/{c}.kubeconfig")
    kc = f"{STATE}/kube-controller-manager.kubeconfig"
    m.start("kube-controller-manager", [
        binary("kube-controller-manager"), "--kubeconfig", kc, "--authentication-kubeconfig", kc,
        "--authorization-kubeconfig", kc, "--controllers", "*", "--allocate-node-cidrs=false",
        "--configure-cloud-routes=false", "--use-service-account-credentials=true", "--root-ca-file", f"{cp}/ca.crt",
        "--service-account-private-key-file", f"{cp}/sa.key", "--cluster-signing-cert-file", f"{cp}/ca.crt",
        "--cluster-signing-key-file", f"{cp}/ca.key", "--service-cluster-ip-range", SERVICE_CIDR,
        "--leader-elect=false", "--bind-address", "127.0.0.1", "--secure-port", "0"], STATE)
    ks = f"{STATE}/kube-scheduler.kubeconfig"
    m.start("kube-scheduler", [binary("kube-scheduler"), "--kubeconfig", ks, "--authentication-kubeconfig", ks,
                               "--authorization-kubeconfig", ks, "--leader-elect=false", "--bind-address",
                               "127.0.0.1", "--secure-port", "0"], STATE)


def down():
    """Undo the record (the caller holds the lock)."""
    global STATE
    rec = m.recorded()
    # The record alone is enough: the owner's state dir names every node's paths.
    STATE = next((r[1] for r in rec if r[0] == "owner"), STATE)
    m.stop(STATE, "kube-controller-manager", 3)
    m.stop(STATE, "kube-scheduler", 3)
    live = [Node.named(r[1]) for r in rec if r[0] == "netns"]
    if any(m.alive(n.s, "kubelet") for n in live) and os.path.exists(f"{STATE}/controlplane/kubeconfig"):
        kubectl("delete", "pods", "-A", "--all", "--force", "--grace-period=0", "--wait=false", check=False)
        for n in live:
            if os.path.exists(n.sock):
                wait_tasks_gone(n, 10)
    failed = []
    for n in live:
        # One node that will not go must not keep the others, or the machine-wide undo, from happening.
        try:
            stop_node(n, delete_node=False)
        except RuntimeError as e:
            failed.append(f"{n.name}: {e}")
    try:
        controlplane("down")
    except RuntimeError as e:
        log(f"control plane: {e}")
    for r in rec:
        if r[0] == "sysctl":
            try_sh("sysctl", "-qw", f"{r[1]}={' '.join(r[2:])}")
        elif r[0] == "link":
            try_sh("ip", "link", "del", r[1])
        elif r[0] == "forward-rule":
            while try_sh("iptables", "-D", *FORWARD_RULE):
                pass
            while try_sh("ip6tables", "-D", *FORWARD_RULE):
                pass
        elif r[0] == "dir" and r[1] == "/run/netns":
            # Other programs' namespaces may live there by now: only an empty dir goes.
            try:
                os.rmdir(r[1])
            except OSError:
                pass
        elif r[0] == "dir" and os.path.exists(r[1]):
            m.unmount_under(r[1])
            shutil.rmtree(r[1], ignore_errors=True)
    if failed:
        # The record stays, so the next `down` retries what is left.
        raise RuntimeError("could not stop every node (run down again): " + "; ".join(failed))
    try:
        os.remove(f"{m.RUN}/record")
    except FileNotFoundError:
        pass
    shutil.rmtree(f"{STATE}/controlplane/etcd-data", ignore_errors=True)
    clear_state_dir(STATE)
    log("stopped; the machine is as it was before 'up'")


def cni_of(state, env):
    """The cluster's CNI: the one `up` saved in the state dir, so that a node added later (add-node, whose
    caller need not repeat CNI=) gets the same as the others; before `up`, CNI from env, else bridge."""
    try:
        with open(f"{state}/cni") as f:
            saved = f.read().strip()
    except FileNotFoundError:
        saved = ""
    wanted = env.get("CNI", "")
    if saved and wanted and wanted != saved:
        raise SystemExit(f"this cluster runs CNI={saved}, not CNI={wanted}: hack/cluster.sh down first")
    cni = saved or wanted or "bridge"
    if cni not in ("bridge", "flannel"):
        raise SystemExit(f"CNI={cni}: bridge or flannel")
    return cni


def clear_state_dir(state):
    """What `up` wrote under the state dir outside the control plane's own (hack/controlplane.sh down
    clears that): every node's directory (see clear_node_dir), the host components' certificates and
    kubeconfigs, node-credentials' certificates (signed by a CA the next `up` replaces), the list of loaded
    images, the CNI choice. Logs stay, and images.d (the pause image, a build cache)."""
    nodes_dir = f"{state}/nodes"
    for name in os.listdir(nodes_dir) if os.path.isdir(nodes_dir) else []:
        clear_node_dir(f"{nodes_dir}/{name}")
    shutil.rmtree(f"{state}/pki", ignore_errors=True)
    shutil.rmtree(f"{state}/credentials", ignore_errors=True)
    for f in os.listdir(state) if os.path.isdir(state) else []:
        if f.endswith(".kubeconfig") or f in ("images", "cni"):
            os.remove(f"{state}/{f}")


def cmd_env():
    print(f"""STATE_DIR={STATE}
KUBECONFIG={STATE}/controlplane/kubeconfig
NODES="{' '.join(n.name for n in nodes())}"
API_HOST={API_HOST}
BRIDGE={BRIDGE}
CLUSTER_CIDR={CLUSTER_CIDR}
NODE_CIDR_MASK_SIZE_IPV4=24
NODE_CIDR_MASK_SIZE_IPV6=64
SERVICE_CIDR={SERVICE_CIDR}""")
    for n in nodes():
        print(f"NODE_{n.x}={n.name},{n.ipv4},{n.ipv6},{n.s}")


def main(argv):
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd == "up":
        cmd_up()
    elif cmd == "down":
        os.makedirs(m.RUN, exist_ok=True)
        with m.Lock():
            if not m.recorded():
                log("nothing to stop")
                return
            down()
    elif cmd == "env":
        cmd_env()
    elif cmd == "load" and len(argv) == 4:
        cmd_load(argv[2], argv[3])
    elif cmd == "add-node":
        with m.Lock():
            # A number never used by this cluster: a Node re-created under a gone one's name would inherit
            # the pods the DaemonSet controller bound to the old one before it was deleted.
            used = [Node.named(d).x for d in os.listdir(f"{STATE}/nodes") if d.startswith("ncm-n")]
            node = Node(max(used + [0]) + 1)
            add_node(node)
            wait(f"the Node {node.name}", 120, lambda: kubectl("get", "node", node.name))
        print(f"NODE={node.name}")
    elif cmd == "node-credentials" and len(argv) == 3:
        name = argv[2]
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", name):
            raise RuntimeError(f"node-credentials: {name!r} is not a valid Node name")
        pki = f"{STATE}/credentials/{name}"
        client(pki, "kubelet", f"/O=system:nodes/CN=system:node:{name}", f"{pki}/kubeconfig")
        print(f"KUBECONFIG={pki}/kubeconfig")
    elif cmd == "remove-node" and len(argv) == 3:
        with m.Lock():
            stop_node(Node.named(argv[2]), delete_node=True)
    else:
        print(__doc__)
        sys.exit(2)


if __name__ == "__main__":
    try:
        main(sys.argv)
    except (RuntimeError, subprocess.CalledProcessError) as e:
        log(f"error: {e}")
        sys.exit(1)
