#!/usr/bin/env python3
"""What the kernel alone charges for a route controller's table: N routes to /24 pod CIDRs, installed with
one `ip -batch` in a fresh network namespace, three ways:

- `distinct`: each route via its own gateway (one route per Node, what netcm, flannel's host-gw and a
  cloud route controller's Linux equivalent program);
- `shared`: every route via one gateway (the kernel shares one fib_info between them);
- `nexthop`: each route via its own gateway through a nexthop object (`ip nexthop`, Linux >= 5.3).

IPv4 keeps one fib_info per distinct gateway in a hash table whose hash leaves the gateway out, so with
a gateway per route every insert walks all earlier ones: quadratic. A nexthop object gives each route a
nexthop id the hash does include. Root only (network namespaces); prints a markdown table.

    python3 hack/bench_kernel_routes/bench_kernel_routes.py [N ...]     default 10000 20000 50000
"""

import subprocess
import sys
import tempfile
import time
import uuid

MODES = ("distinct", "shared", "nexthop")
TABLE = 100
PROTOCOL = 199


def gateway(i):
    """The i-th Node's address in 172.16.0.0/12 (172.16.0.1 is the namespace's own)."""
    n = i + 2
    return f"172.{16 + n // 65536}.{n // 256 % 256}.{n % 256}"


def destination(i):
    """The i-th Node's pod CIDR, a /24 of 10.0.0.0/8 (65,536 of them)."""
    if not 0 <= i < 65536:
        raise ValueError(f"10.0.0.0/8 holds 65,536 /24s, not {i + 1}")
    return f"10.{i // 256}.{i % 256}.0/24"


def batch(n, mode):
    """The `ip -batch` lines installing n routes the way `mode` says."""
    lines = []
    for i in range(n):
        if mode == "nexthop":
            lines.append(f"nexthop add id {i + 1} via {gateway(i)} dev d0 proto {PROTOCOL}")
            lines.append(f"route add {destination(i)} nhid {i + 1} table {TABLE} proto {PROTOCOL}")
        else:
            via = gateway(i) if mode == "distinct" else gateway(0)
            lines.append(f"route add {destination(i)} via {via} dev d0 table {TABLE} proto {PROTOCOL}")
    return lines


def ip(*args):
    subprocess.run(["ip", *args], check=True)


def timed_install(n, mode):
    """Seconds `ip -batch` takes to install n routes in a fresh namespace."""
    ns = f"kroutes-{uuid.uuid4().hex[:8]}"
    ip("netns", "add", ns)
    try:
        ip("-n", ns, "link", "add", "d0", "type", "veth", "peer", "name", "d1")
        ip("-n", ns, "link", "set", "d0", "up")
        ip("-n", ns, "link", "set", "d1", "up")
        ip("-n", ns, "addr", "add", "172.16.0.1/12", "dev", "d0")
        with tempfile.NamedTemporaryFile("w", suffix=".batch") as f:
            f.write("\n".join(batch(n, mode)) + "\n")
            f.flush()
            start = time.monotonic()
            ip("-n", ns, "-batch", f.name)
            return time.monotonic() - start
    finally:
        ip("netns", "del", ns)


def main(argv):
    sizes = [int(a) for a in argv] or [10000, 20000, 50000]
    print("| routes | " + " | ".join(f"{m} gateways (s)" if m != "nexthop" else "nexthop objects (s)" for m in MODES) + " |")
    print("|---|" + "---|" * len(MODES))
    for n in sizes:
        cells = [f"{timed_install(n, m):.2f}" for m in MODES]
        print(f"| {n:,} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
