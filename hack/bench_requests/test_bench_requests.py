"""Tests of bench_requests.py's counting and table (python3 -m unittest discover -s hack/bench_requests)."""

import json
import unittest

import bench_requests as b


def event(verb, resource, ua="netcm/0.1.0 (linux/amd64) netcm-a", code=200, stage="ResponseComplete", sub=""):
    ref = {"resource": resource, "name": "bench-00000"}
    if sub:
        ref["subresource"] = sub
    return json.dumps(
        {"stage": stage, "verb": verb, "userAgent": ua, "objectRef": ref, "responseStatus": {"code": code}}
    )


class CountTest(unittest.TestCase):
    def test_only_completed_requests_of_the_contender_count_by_verb_and_resource(self):
        lines = [
            event("patch", "nodes"),
            event("patch", "nodes", code=409),
            event("get", "nodes"),
            event("patch", "nodes", sub="status"),
            event("patch", "nodes", stage="ResponseStarted"),
            event("create", "nodes", ua="kubectl/v1.36.3"),
            "not json",
        ]
        by_request, conflicts = b.count(lines, "netcm/")
        self.assertEqual(
            by_request,
            {("patch", "nodes"): 2, ("get", "nodes"): 1, ("patch", "nodes/status"): 1},
        )
        self.assertEqual(conflicts, {("patch", "nodes"): 1})

    def test_the_table_divides_by_the_nodes_and_shows_a_row_missing_from_one_contender_as_zero(self):
        before = b.column("before", 4, {("get", "nodes"): 4, ("patch", "nodes"): 8}, {("patch", "nodes"): 1})
        after = b.column("after", 4, {("patch", "nodes"): 8}, {})
        lines = b.table([before, after]).splitlines()
        self.assertEqual(lines[2], "| get | nodes | 1.000 (4) | 0 |")
        self.assertEqual(lines[3], "| patch | nodes | 2.000 (8, 1 × 409) | 2.000 (8) |")
        self.assertEqual(lines[4], "| **all** | | **3.000** (12) | **2.000** (8) |")


class NodesTest(unittest.TestCase):
    def test_a_node_is_done_with_a_pod_cidr_and_a_public_ip(self):
        n = b.node(7)
        self.assertEqual(n["metadata"]["name"], "bench-00007")
        self.assertFalse(b.is_done(n, "p"))
        n["spec"] = {"podCIDR": "10.0.0.0/24"}
        self.assertFalse(b.is_done(n, "p"))
        n["metadata"]["annotations"] = {"p/public-ip": "198.51.0.8"}
        self.assertTrue(b.is_done(n, "p"))

    def test_a_list_holds_count_nodes_from_first(self):
        items = b.node_list(3, 2)["items"]
        self.assertEqual([i["metadata"]["name"] for i in items], ["bench-00003", "bench-00004"])


if __name__ == "__main__":
    unittest.main()
