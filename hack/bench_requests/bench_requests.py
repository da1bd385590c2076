"""hack/bench.sh requests's logic: the Nodes it creates, the wait for their leases, and the API requests
per Node counted from kube-apiserver's audit log, by verb and resource, printed side by side.

  bench_requests.py nodes FIRST COUNT            a kubectl List of Nodes bench-FIRST … (address, no CIDR)
  bench_requests.py wait KUBECTL N PREFIX SECS    until N Nodes hold a pod CIDR and PREFIX/public-ip
  bench_requests.py count AUDIT OFFSET UA N LABEL  one column: JSON on stdout
  bench_requests.py table COLUMN.json…           the markdown table
"""

import json
import subprocess
import sys
import time
from collections import Counter

NAME = "bench-{:05d}"


def node(i):
    """Node i: an InternalIP (the syncer publishes it) and no pod CIDR (the allocator gives one)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NAME.format(i), "labels": {"bench.netcm.io/set": "requests"}},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": f"198.51.{(i // 250) % 250}.{i % 250 + 1}"},
                {"type": "Hostname", "address": NAME.format(i)},
            ]
        },
    }


def node_list(first, count):
    return {"apiVersion": "v1", "kind": "List", "items": [node(i) for i in range(first, first + count)]}


def is_done(item, prefix):
    """Whether a Node holds a pod CIDR and its lease's public IP."""
    spec = item.get("spec") or {}
    annotations = (item.get("metadata") or {}).get("annotations") or {}
    return bool(spec.get("podCIDR")) and f"{prefix}/public-ip" in annotations


def wait(kubectl, n, prefix, timeout):
    """Polls the Node list until `n` Nodes are done; returns the seconds it took."""
    start = time.monotonic()
    while True:
        out = subprocess.run(
            [kubectl, "get", "nodes", "-l", "bench.netcm.io/set=requests", "-o", "json"],
            check=True,
            capture_output=True,
        ).stdout
        done = sum(is_done(item, prefix) for item in json.loads(out)["items"])
        elapsed = time.monotonic() - start
        if done >= n:
            return elapsed
        if elapsed > timeout:
            raise SystemExit(f"only {done} of {n} Nodes hold a CIDR and a lease after {timeout} s")
        time.sleep(1)


def resource(event):
    ref = event.get("objectRef") or {}
    res = ref.get("resource", "")
    return f"{res}/{ref['subresource']}" if ref.get("subresource") else res


def count(lines, user_agent):
    """Completed requests by `user_agent` (a prefix), by (verb, resource), and those answered 409."""
    by_request = Counter()
    conflicts = Counter()
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("stage") != "ResponseComplete":
            continue
        if not event.get("userAgent", "").startswith(user_agent):
            continue
        key = (event.get("verb", ""), resource(event))
        by_request[key] += 1
        if (event.get("responseStatus") or {}).get("code") == 409:
            conflicts[key] += 1
    return by_request, conflicts


def column(label, nodes, by_request, conflicts):
    """One contender's figures, as `table` reads them."""
    return {
        "label": label,
        "nodes": nodes,
        "requests": [[v, r, n, conflicts.get((v, r), 0)] for (v, r), n in sorted(by_request.items())],
    }


def table(columns):
    """A markdown table: one row per (verb, resource), per contender its requests per Node (total)."""
    rows = sorted({(v, r) for c in columns for v, r, _, _ in c["requests"]})
    out = ["| verb | resource | " + " | ".join(f"{c['label']} per Node (total)" for c in columns) + " |"]
    out.append("|---|---|" + "---|" * len(columns))

    def cell(c, key):
        for v, r, n, conflicts in c["requests"]:
            if (v, r) == key:
                note = f", {conflicts} × 409" if conflicts else ""
                return f"{n / c['nodes']:.3f} ({n}{note})"
        return "0"

    for key in rows:
        out.append(f"| {key[0]} | {key[1]} | " + " | ".join(cell(c, key) for c in columns) + " |")
    totals = []
    for c in columns:
        n = sum(x[2] for x in c["requests"])
        totals.append(f"**{n / c['nodes']:.3f}** ({n})")
    out.append("| **all** | | " + " | ".join(totals) + " |")
    return "\n".join(out)


def main(argv):
    cmd = argv[1] if len(argv) > 1 else ""
    if cmd == "nodes":
        json.dump(node_list(int(argv[2]), int(argv[3])), sys.stdout)
    elif cmd == "wait":
        print(f"{wait(argv[2], int(argv[3]), argv[4], float(argv[5])):.1f}")
    elif cmd == "count":
        audit, offset, ua, nodes, label = argv[2], int(argv[3]), argv[4], int(argv[5]), argv[6]
        with open(audit, "rb") as f:
            f.seek(offset)
            lines = f.read().decode("utf-8", "replace").splitlines()
        json.dump(column(label, nodes, *count(lines, ua)), sys.stdout)
    elif cmd == "table":
        columns = []
        for path in argv[2:]:
            with open(path) as f:
                columns.append(json.load(f))
        print(table(columns))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
