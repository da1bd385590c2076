"""What hack/controlplane.sh writes and runs: its state file, the serving certificate's extensions, the
audit policy, kubeconfigs, and the command lines of etcd and kube-apiserver.

Pure functions of the control plane's state (the `env` file's values), so they are unit-tested
(test_render.py) without starting anything. The script calls them through the command line below; each
prints its text, or a command line one argument per line (none holds a newline), for `mapfile -t`.

  render.py env PORT...                   the state file of a new control plane (reads NETCM_NODE_MODE,
                                          NETCM_API_HOST, NETCM_SERVICE_CIDR)
  render.py free-ports N [TAKEN...]       N distinct free ports on 127.0.0.1, none of them in TAKEN
  render.py service-ip CIDR               the `kubernetes` Service's ClusterIP
  render.py serving-ext API_HOST CIDR     openssl's extensions for the serving certificate
  render.py audit-policy                  the audit policy
  render.py kubeconfig API_HOST PORT PKI  the admin kubeconfig
  render.py etcd-args STATE ETCD_PORT PEER_PORT METRICS_PORT
  render.py apiserver-args STATE ETCD_PORT PORT AUDIT NODE_MODE API_HOST SERVICE_CIDR [FLAG...]
"""

import ipaddress
import os
import socket
import sys


def env_file(ports, node_mode="0", api_host="127.0.0.1", service_cidr="10.0.0.0/24"):
    """The state file `up` writes once per state dir: four ports and the mode, read back by `source`."""
    etcd, peer, metrics, apiserver = ports
    return (
        f"ETCD_PORT={etcd}\nETCD_PEER_PORT={peer}\nETCD_METRICS_PORT={metrics}\nAPISERVER_PORT={apiserver}\n"
        f"NODE_MODE={node_mode}\nAPI_HOST={api_host}\nSERVICE_CIDR={service_cidr}\n"
    )


def choose_ports(n, taken, offered):
    """The first n distinct ports of offered that are not in taken."""
    taken = {str(p) for p in taken}
    ports = []
    for p in map(str, offered):
        if len(ports) == n:
            break
        if p not in taken and p not in ports:
            ports.append(p)
    return ports


def free_ports(n, taken=()):
    """N distinct free ports on 127.0.0.1, none in taken (ports of a stopped etcd, say). The sockets are
    held until all are chosen; one at a time, the kernel may hand out the same port twice."""
    held = []

    def offered():
        while True:
            s = socket.socket()
            held.append(s)
            s.bind(("127.0.0.1", 0))
            yield s.getsockname()[1]

    try:
        return choose_ports(n, taken, offered())
    finally:
        for s in held:
            s.close()


def service_ip(cidr):
    """The `kubernetes` Service's ClusterIP: the first address of the Service range."""
    return str(ipaddress.ip_network(cidr)[1])


def serving_ext(api_host, service_cidr):
    """The serving certificate's names: loopback, the Service's IP and names, and a node's address."""
    sans = [
        "IP:127.0.0.1",
        "DNS:localhost",
        f"IP:{service_ip(service_cidr)}",
        "DNS:kubernetes",
        "DNS:kubernetes.default",
        "DNS:kubernetes.default.svc",
        "DNS:kubernetes.default.svc.cluster.local",
    ]
    if api_host != "127.0.0.1":
        sans.append(f"IP:{api_host}")
    return f"subjectAltName={','.join(sans)}\nextendedKeyUsage=serverAuth\n"


AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    verbs: ["create", "update", "patch", "delete", "deletecollection"]
    resources:
      - group: ""
        resources: ["nodes", "nodes/status", "events"]
      - group: "coordination.k8s.io"
        resources: ["leases"]
      - group: "events.k8s.io"
        resources: ["events"]
      - group: "ipam.netcm.io"
        resources: ["podcidrclaims"]
  # How informers list Nodes: paged LISTs or one streaming watch (sendInitialEvents=true); and single
  # GETs, which a controller deciding from its cache should not need (hack/bench.sh requests counts them).
  - level: Metadata
    verbs: ["get", "list", "watch"]
    resources:
      - group: ""
        resources: ["nodes"]
  - level: None
"""


def kubeconfig(api_host, port, pki):
    """The admin kubeconfig for the kube-apiserver on port."""
    return f"""apiVersion: v1
kind: Config
clusters:
  - name: netcm-test
    cluster:
      server: https://{api_host}:{port}
      certificate-authority: {pki}/ca.crt
users:
  - name: netcm-admin
    user:
      client-certificate: {pki}/admin.crt
      client-key: {pki}/admin.key
contexts:
  - name: netcm-test
    context: {{cluster: netcm-test, user: netcm-admin}}
current-context: netcm-test
"""


def etcd_args(state, port, peer_port, metrics_port):
    """etcd's flags: one member on loopback, data in the state dir, no fsync (test data only)."""
    peer = f"http://127.0.0.1:{peer_port}"
    return [
        "--name", "netcm-test",
        "--data-dir", f"{state}/etcd-data",
        "--listen-client-urls", f"http://127.0.0.1:{port}",
        "--advertise-client-urls", f"http://127.0.0.1:{port}",
        "--listen-peer-urls", peer,
        "--initial-advertise-peer-urls", peer,
        "--initial-cluster", f"netcm-test={peer}",
        "--listen-metrics-urls", f"http://127.0.0.1:{metrics_port}",
        "--unsafe-no-fsync",
        "--log-level", "warn",
    ]


def apiserver_args(state, etcd_port, port, audit, node_mode, api_host, service_cidr, extra=()):
    """kube-apiserver's flags. Node mode serves a real node: its address, ServiceAccount admission on,
    Node authorization and NodeRestriction, a client certificate towards kubelets."""
    pki = f"{state}/pki"
    mode = ["--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--authorization-mode", "RBAC",
            "--disable-admission-plugins", "ServiceAccount"]
    if node_mode == "1":
        mode = ["--bind-address", api_host, "--advertise-address", api_host, "--authorization-mode", "Node,RBAC",
                "--enable-admission-plugins", "NodeRestriction",
                "--kubelet-client-certificate", f"{pki}/kubelet-client.crt",
                "--kubelet-client-key", f"{pki}/kubelet-client.key",
                "--kubelet-preferred-address-types", "InternalIP"]
    return [
        "--etcd-servers", f"http://127.0.0.1:{etcd_port}",
        "--cert-dir", pki,
        "--tls-cert-file", f"{pki}/serving.crt",
        "--tls-private-key-file", f"{pki}/serving.key",
        "--client-ca-file", f"{pki}/ca.crt",
        "--secure-port", str(port),
        *mode,
        "--service-cluster-ip-range", service_cidr,
        "--allow-privileged=true",
        "--service-account-issuer", "https://kubernetes.default.svc",
        "--service-account-key-file", f"{pki}/sa.pub",
        "--service-account-signing-key-file", f"{pki}/sa.key",
        "--audit-policy-file", f"{state}/audit-policy.yaml",
        "--audit-log-path", audit,
        "--audit-log-maxsize", "0",
        "--audit-log-format", "json",
        "--max-requests-inflight", "800",
        "--max-mutating-requests-inflight", "400",
        *extra,
    ]


def main(argv):
    what, args = argv[1], argv[2:]
    if what == "env":
        out = env_file(
            args,
            os.environ.get("NETCM_NODE_MODE") or "0",
            os.environ.get("NETCM_API_HOST") or "127.0.0.1",
            os.environ.get("NETCM_SERVICE_CIDR") or "10.0.0.0/24",
        )
    elif what == "free-ports":
        out = " ".join(free_ports(int(args[0]), args[1:])) + "\n"
    elif what == "service-ip":
        out = service_ip(args[0]) + "\n"
    elif what == "serving-ext":
        out = serving_ext(*args)
    elif what == "audit-policy":
        out = AUDIT_POLICY
    elif what == "kubeconfig":
        out = kubeconfig(*args)
    elif what == "etcd-args":
        out = "".join(a + "\n" for a in etcd_args(*args))
    elif what == "apiserver-args":
        out = "".join(a + "\n" for a in apiserver_args(*args[:7], extra=args[7:]))
    else:
        sys.exit(f"render.py: unknown '{what}' (see its docstring)")
    sys.stdout.write(out)


if __name__ == "__main__":
    main(sys.argv)
