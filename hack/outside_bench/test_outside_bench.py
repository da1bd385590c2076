import json
import os
import sys
import threading
import unittest

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

KUBECONFIG = """apiVersion: v1
kind: Config
clusters:
  - name: netcm-test
    cluster:
      server: https://127.0.0.1:36443
      certificate-authority: /s/pki/ca.crt
users:
  - name: netcm-admin
    user:
      client-certificate: /s/pki/admin.crt
      client-key: /s/pki/admin.key
"""


def node(name, cidr=None):
    return {"metadata": {"name": name, "resourceVersion": "7"}, "spec": {"podCIDR": cidr} if cidr else {}}


class KubeconfigTest(unittest.TestCase):
    def test_the_server_and_the_three_certificate_files_are_read(self):
        ep = kubeapi.parse_kubeconfig(KUBECONFIG)
        self.assertEqual((ep.host, ep.port), ("127.0.0.1", 36443))
        self.assertEqual((ep.ca_file, ep.cert_file, ep.key_file), ("/s/pki/ca.crt", "/s/pki/admin.crt", "/s/pki/admin.key"))

    def test_a_kubeconfig_with_inline_certificates_is_refused_by_name(self):
        text = KUBECONFIG.replace("client-key: /s/pki/admin.key", "client-key-data: AAAA")
        with self.assertRaisesRegex(ValueError, "client-key"):
            kubeapi.parse_kubeconfig(text)

    def test_a_plain_http_server_is_refused(self):
        with self.assertRaisesRegex(ValueError, "not an https URL"):
            kubeapi.parse_kubeconfig(KUBECONFIG.replace("https://", "http://"))


class NodeBodyTest(unittest.TestCase):
    def test_a_node_is_about_eight_kilobytes_before_the_server_adds_its_fields(self):
        size = len(json.dumps(node_body("outside-netcm-1", 49_999, 1000)))
        self.assertGreater(size, 6_000)
        self.assertLess(size, 9_000)

    def test_a_node_carries_its_set_and_its_chunk_and_no_pod_cidr(self):
        body = node_body("outside-kcm-2", 2_345, 1000)
        labels = body["metadata"]["labels"]
        self.assertEqual(body["metadata"]["name"], "outside-kcm-2-02345")
        self.assertEqual(labels[SET_LABEL], "outside-kcm-2")
        self.assertEqual(chunk_selector(labels[f"{SET_LABEL}-chunk"]), f"{SET_LABEL}-chunk=2")
        self.assertNotIn("spec", body)

    def test_nodes_of_one_set_have_distinct_addresses_up_to_62500(self):
        addresses = {node_body("s", i, 1000)["status"]["addresses"][0]["address"] for i in range(0, 62_500, 7)}
        self.assertEqual(len(addresses), len(range(0, 62_500, 7)))


class PodCidrTest(unittest.TestCase):
    def test_the_ceiling_writes_consecutive_24s_of_the_cluster_cidr(self):
        self.assertEqual(pod_cidr("10.0.0.0/8", 0), "10.0.0.0/24")
        self.assertEqual(pod_cidr("10.0.0.0/8", 257), "10.1.1.0/24")
        self.assertEqual(pod_cidr("10.0.0.0/8", 65_535), "10.255.255.0/24")

    def test_a_node_past_the_cluster_cidrs_last_24_is_an_error(self):
        with self.assertRaisesRegex(ValueError, "holds 65536 /24s"):
            pod_cidr("10.0.0.0/8", 65_536)

    def test_an_ipv6_cluster_cidr_gives_64s(self):
        self.assertEqual(pod_cidr("fd00::/48", 3, prefix=64), "fd00:0:0:3::/64")


class AllocationCounterTest(unittest.TestCase):
    def test_it_is_done_at_the_moment_the_last_node_gets_its_cidr(self):
        counter = AllocationCounter(2)
        counter.apply({"type": "ADDED", "object": node("a")}, 1.0)
        counter.apply({"type": "MODIFIED", "object": node("a", "10.0.0.0/24")}, 2.0)
        self.assertFalse(counter.done.is_set())
        counter.apply({"type": "MODIFIED", "object": node("b", "10.0.1.0/24")}, 3.5)
        self.assertTrue(counter.done.is_set())
        self.assertEqual((counter.first, counter.last), (2.0, 3.5))

    def test_a_second_write_to_a_node_is_not_counted_twice(self):
        counter = AllocationCounter(2)
        for t in (1.0, 2.0, 3.0):
            counter.apply({"type": "MODIFIED", "object": node("a", "10.0.0.0/24")}, t)
        self.assertEqual(counter.count(), 1)
        self.assertFalse(counter.done.is_set())

    def test_a_deleted_node_no_longer_counts(self):
        counter = AllocationCounter(2)
        counter.apply({"type": "MODIFIED", "object": node("a", "10.0.0.0/24")}, 1.0)
        counter.apply({"type": "DELETED", "object": node("a", "10.0.0.0/24")}, 2.0)
        counter.apply({"type": "MODIFIED", "object": node("b", "10.0.1.0/24")}, 3.0)
        self.assertFalse(counter.done.is_set())

    def test_a_bookmark_moves_the_resume_point_and_counts_nothing(self):
        counter = AllocationCounter(1)
        version = counter.apply({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "99"}}}, 1.0)
        self.assertEqual(version, "99")
        self.assertEqual(counter.count(), 0)

    def test_an_expired_watch_asks_for_a_relist(self):
        with self.assertRaisesRegex(WatchGone, "410"):
            AllocationCounter(1).apply({"type": "ERROR", "object": {"code": 410, "message": "too old"}}, 1.0)

    def test_a_relist_replaces_what_the_lost_watch_had_counted(self):
        counter = AllocationCounter(3)
        counter.apply({"type": "MODIFIED", "object": node("gone", "10.0.9.0/24")}, 1.0)
        counter.reset([node("a", "10.0.0.0/24"), node("b"), node("c", "10.0.2.0/24")], 2.0)
        self.assertEqual(counter.count(), 2)
        self.assertFalse(counter.done.is_set())

    def test_a_waiter_wakes_when_another_thread_completes_the_count(self):
        counter = AllocationCounter(1)
        threading.Timer(0.05, counter.apply, args=({"type": "ADDED", "object": node("a", "10.0.0.0/24")}, 1.0)).start()
        self.assertTrue(counter.done.wait(5))


class ProcessUsageTest(unittest.TestCase):
    STAT = "4242 (kube-controller (x)) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 12 0 1 0 0"

    def test_cpu_is_user_plus_system_and_rss_is_the_peak(self):
        cpu, rss = process_usage(self.STAT, "Name:\tnetcm\nVmRSS:\t  1024 kB\nVmHWM:\t 51200 kB\n", 100)
        self.assertEqual(cpu, 3.0)
        self.assertEqual(rss, 50.0)

    def test_a_status_without_a_peak_is_an_error(self):
        with self.assertRaisesRegex(ValueError, "VmHWM"):
            process_usage(self.STAT, "Name:\tnetcm\n", 100)


class RenderTableTest(unittest.TestCase):
    def test_ratios_are_against_the_ceiling_and_kube_controller_manager(self):
        table = render_table({
            "ceiling": {"seconds": 70.0, "spread": 69.0},
            "netcm": {"seconds": 84.0, "spread": 80.0, "cpu": 12.9, "rss_mib": 49.0},
            "kcm": {"seconds": 105.0, "spread": 100.0, "cpu": 30.0, "rss_mib": 1027.0},
        })
        rows = table.splitlines()
        self.assertIn("| netcm | 84.0 s | 1.20 | 0.80 | 80.0 s | 49.0 MiB | 12.9 s |", rows)
        self.assertIn("| 70.0 s | 1.00 | 0.67 |", rows[2])

    def test_a_run_without_kube_controller_manager_prints_a_dash_for_its_ratio(self):
        table = render_table({"netcm": {"seconds": 84.0, "spread": 80.0, "cpu": 1.0, "rss_mib": 2.0}})
        self.assertIn("| netcm | 84.0 s | – | – |", table)


if __name__ == "__main__":
    unittest.main()
