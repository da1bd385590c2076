"""hack/verify-dashboard.sh's check: every query of the Grafana dashboard returns series from a Prometheus
scraping a live netcm. Prints one line a query ("ok …: N series" or "FAIL …: why" and the query), then
"M/N dashboard queries return series"; exits 1 if any query failed.

    PROM=http://127.0.0.1:PORT queries.py DASHBOARD_JSON

Tests: python3 -m unittest discover -s hack/verify_dashboard
"""

import json
import os
import sys
import urllib.parse
import urllib.request


def targets(dash):
    """(panel title, refId, PromQL) of every query of the dashboard, Grafana's $__rate_interval as 1m."""
    for panel in dash["panels"]:
        for t in panel.get("targets", []):
            yield panel["title"], t["refId"], t["expr"].replace("$__rate_interval", "1m")


def fetch(prom, expr):
    """Prometheus's answer to an instant query, or a failed answer saying why it did not come."""
    url = prom + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        return json.load(urllib.request.urlopen(url, timeout=10))
    except Exception as e:  # an HTTP 400 is a query Prometheus cannot parse
        return {"status": "error", "error": str(e)}


def check(dash, answer, report):
    """Asks answer(expr) (Prometheus's answer) each query in turn and reports (report(line)) each
    verdict as it comes, then the count; returns the number of failed queries."""
    failed, checked = 0, 0
    for title, ref, expr in targets(dash):
        body = answer(expr)
        result = body.get("data", {}).get("result", [])
        checked += 1
        if body.get("status") != "success" or not result:
            failed += 1
            report(f"FAIL {title} [{ref}]: {body.get('error', 'no series')}\n     {expr}")
        else:
            report(f"ok   {title} [{ref}]: {len(result)} series")
    report(f"{checked - failed}/{checked} dashboard queries return series")
    return failed


def main(argv):
    if len(argv) != 1 or "PROM" not in os.environ:
        sys.exit("usage: PROM=http://HOST:PORT queries.py DASHBOARD_JSON")
    with open(argv[0]) as f:
        dash = json.load(f)
    prom = os.environ["PROM"]
    failed = check(dash, lambda expr: fetch(prom, expr), print)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main(sys.argv[1:])
