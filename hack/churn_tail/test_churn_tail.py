"""Tests of churn_tail.py (python3 -m unittest discover -s hack/churn_tail)."""

import json
import unittest

import churn_tail as c


def event(verb, name, received, done, ua="bench/", code=200):
    return json.dumps({
        "stage": "ResponseComplete", "verb": verb, "userAgent": ua, "responseStatus": {"code": code},
        "objectRef": {"resource": "nodes", "name": name},
        "requestReceivedTimestamp": f"2026-11-28T00:00:{received}Z", "stageTimestamp": f"2026-11-28T00:00:{done}Z",
    })


class SpansTest(unittest.TestCase):
    def test_a_churned_node_is_split_into_its_create_the_reaction_and_the_patch(self):
        lines = [
            event("create", "set-0", "00.000000", "00.001000"),  # the backlog's
            event("create", "set-1", "01.000000", "01.010000"),
            event("patch", "set-1", "01.040000", "01.045000", ua="netcm/0.1"),
            event("patch", "set-1", "02.000000", "02.500000", ua="netcm/0.1"),  # not the allocation
            event("patch", "set-0", "00.100000", "00.200000", ua="netcm/0.1"),
            event("create", "other-1", "01.000000", "01.001000"),
            event("create", "set-2", "01.000000", "01.001000", code=409),
            "not json",
        ]
        rows = c.spans(lines, "set-", 1, "netcm/")
        self.assertEqual(len(rows), 1)
        total, create, reaction, write = (round(x * 1e3) for x in rows[0][1:])
        self.assertEqual((total, create, reaction, write), (45, 10, 30, 5))


class TailTest(unittest.TestCase):
    def test_the_slowest_are_told_by_the_seconds_they_were_created_in(self):
        # 200 Nodes one every 0.5 s; the two slowest both created in second 50.
        rows = [(i * 0.5, 0.01, 0.003, 0.004, 0.003) for i in range(200)]
        rows[100] = (50.0, 0.3, 0.1, 0.1, 0.1)
        rows[101] = (50.5, 0.2, 0.05, 0.1, 0.05)
        slowest, means, seconds = c.tail(rows)
        self.assertEqual(len(slowest), 2)
        self.assertEqual(seconds, [50])
        self.assertAlmostEqual(means[1], 0.1)

    def test_quantile_is_nearest_rank(self):
        self.assertEqual(c.quantile([3, 1, 2], 0.5), 2)
        self.assertEqual(c.quantile(list(range(101)), 0.99), 99)


if __name__ == "__main__":
    unittest.main()
