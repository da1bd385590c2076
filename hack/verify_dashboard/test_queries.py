"""hack/verify_dashboard/queries.py: python3 -m unittest discover -s hack/verify_dashboard"""

import json
import os
import re
import unittest

from queries import check, targets

HERE = os.path.dirname(os.path.abspath(__file__))
DASHBOARD = os.path.join(HERE, "..", "..", "charts", "netcm", "files", "dashboard.json")

DASH = {"panels": [
    {"title": "Rate", "targets": [{"refId": "A", "expr": "rate(x[$__rate_interval])"},
                                  {"refId": "B", "expr": "y"}]},
    {"title": "Row without queries"},
]}


def answers(table):
    return lambda expr: table[expr]


class TargetsTest(unittest.TestCase):
    def test_every_target_of_every_panel_with_the_rate_interval_as_one_minute(self):
        self.assertEqual(list(targets(DASH)), [("Rate", "A", "rate(x[1m])"), ("Rate", "B", "y")])

    def test_the_chart_dashboard_queries_use_no_other_grafana_variable(self):
        # Prometheus cannot parse a $variable: the check resolves $__rate_interval only.
        with open(DASHBOARD) as f:
            dash = json.load(f)
        exprs = [expr for _, _, expr in targets(dash)]
        self.assertTrue(exprs)
        for expr in exprs:
            self.assertNotRegex(expr, re.compile(r"\$\w"))


class CheckTest(unittest.TestCase):
    def test_all_with_series(self):
        ok = {"status": "success", "data": {"result": [{}, {}]}}
        lines = []
        failed = check(DASH, answers({"rate(x[1m])": ok, "y": ok}), lines.append)
        self.assertEqual(failed, 0)
        self.assertEqual(lines, ["ok   Rate [A]: 2 series", "ok   Rate [B]: 2 series",
                                 "2/2 dashboard queries return series"])

    def test_no_series_and_an_error_both_fail(self):
        empty = {"status": "success", "data": {"result": []}}
        bad = {"status": "error", "error": "HTTP Error 400: Bad Request"}
        lines = []
        failed = check(DASH, answers({"rate(x[1m])": empty, "y": bad}), lines.append)
        self.assertEqual(failed, 2)
        self.assertEqual(lines, ["FAIL Rate [A]: no series\n     rate(x[1m])",
                                 "FAIL Rate [B]: HTTP Error 400: Bad Request\n     y",
                                 "0/2 dashboard queries return series"])


if __name__ == "__main__":
    unittest.main()
