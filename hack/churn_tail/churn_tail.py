"""Where the tail of a churn run's create → write is, from the API server's audit log.

python3 hack/churn_tail/churn_tail.py AUDIT_LOG SET_PREFIX [BASE] [UA]

For each Node of the set created after the first BASE creates (the churn's, not the backlog's): its
create in the server, create done → the contender's first PATCH received (the watch to the contender, its
queue and decision, its client), and that PATCH in the server. Prints the p50 / p99 of each, the mean of
each part over the slowest 1 %, and the distinct seconds those slowest were created in: a tail spread
over the run is the contender's or the load's; one packed into a few seconds is a stall of the server.
"""

import datetime as dt
import json
import sys

PARTS = ("create in the server", "create done → the contender's PATCH received", "the PATCH in the server")


def ts(s):
    return dt.datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


def spans(lines, prefix, base, ua):
    """[(created_at, total, create, reaction, write)] for the churned Nodes the contender wrote."""
    created, written = {}, {}
    for line in lines:
        try:
            e = json.loads(line)
        except ValueError:
            continue
        ref = e.get("objectRef") or {}
        name = ref.get("name", "")
        if e.get("stage") != "ResponseComplete" or ref.get("resource") != "nodes" or ref.get("subresource"):
            continue
        if not name.startswith(prefix) or not 200 <= (e.get("responseStatus") or {}).get("code", 0) < 300:
            continue
        received, done = ts(e["requestReceivedTimestamp"]), ts(e["stageTimestamp"])
        if e.get("verb") == "create":
            created[name] = (received, done)
        elif e.get("verb") == "patch" and e.get("userAgent", "").startswith(ua) and name not in written:
            written[name] = (received, done)
    churned = sorted(created, key=lambda n: created[n][0])[base:]
    out = []
    for name in churned:
        if name in written:
            (c0, c1), (w0, w1) = created[name], written[name]
            out.append((c0, w1 - c0, c1 - c0, w0 - c1, w1 - w0))
    return out


def quantile(values, p):
    """Nearest-rank quantile of a non-empty list."""
    v = sorted(values)
    return v[round((len(v) - 1) * p)]


def tail(rows, share=0.01):
    """The slowest `share` of rows by total, the mean of each part over them, and their seconds of creation
    counted from the first churned create."""
    slowest = sorted(rows, key=lambda r: r[1])[int(len(rows) * (1 - share)) :]
    means = [sum(r[i] for r in slowest) / len(slowest) for i in (2, 3, 4)]
    t0 = min(r[0] for r in rows)
    seconds = sorted({int(r[0] - t0) for r in slowest})
    return slowest, means, seconds


def main(argv):
    path, prefix = argv[1], argv[2]
    base = int(argv[3]) if len(argv) > 3 else 0
    ua = argv[4] if len(argv) > 4 else "netcm/"
    with open(path, encoding="utf-8") as f:
        rows = spans(f, prefix, base, ua)
    if not rows:
        sys.exit(f"no Node of {prefix!r} created after the first {base} and written by {ua!r} in {path}")
    print(f"{len(rows)} churned Nodes")
    for i, name in enumerate(("create → the PATCH done",) + PARTS):
        col = [r[1 + i] for r in rows]
        print(f"{name}: p50 {quantile(col, 0.5) * 1e3:.1f} ms, p99 {quantile(col, 0.99) * 1e3:.1f} ms")
    slowest, means, seconds = tail(rows)
    print(f"the slowest 1 % ({len(slowest)} Nodes): mean " + ", ".join(
        f"{name} {m * 1e3:.1f} ms" for name, m in zip(PARTS, means)))
    print(f"created in {len(seconds)} distinct seconds of the churn: {seconds[:40]}")


if __name__ == "__main__":
    main(sys.argv)
