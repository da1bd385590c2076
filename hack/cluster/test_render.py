"""What the node daemons read, checked without a machine: python3 -m unittest discover -s hack/cluster"""

import json
import unittest

import render
from cluster import Node


def fill(template, cidrs, routes):
    """containerd's Go template, as it fills it, for the two constructs the template uses."""
    ranges = ", ".join(f'[{{"subnet": "{c}"}}]' for c in cidrs)
    dsts = ", ".join(f'{{"dst": "{r}"}}' for r in routes)
    head, rest = template.split("{{range $i, $r := .PodCIDRRanges}}", 1)
    _, rest = rest.split("{{end}}", 1)
    _, rest = rest.split("{{end}}", 1)
    text = head + ranges + rest
    head, rest = text.split("{{range $i, $r := .Routes}}", 1)
    _, rest = rest.split("{{end}}", 1)
    _, rest = rest.split("{{end}}", 1)
    return head + dsts + rest


class RenderTest(unittest.TestCase):
    def test_the_cni_template_becomes_a_dual_stack_bridge_config_once_filled(self):
        conf = json.loads(fill(render.cni_template("ncm-n1", "/s"), ["198.19.128.0/24", "fd00::/64"], ["0.0.0.0/0", "::/0"]))
        bridge = conf["plugins"][0]
        self.assertEqual(bridge["type"], "bridge")
        self.assertEqual(bridge["ipam"]["ranges"], [[{"subnet": "198.19.128.0/24"}], [{"subnet": "fd00::/64"}]])
        self.assertEqual(bridge["ipam"]["routes"], [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}])
        self.assertEqual(bridge["ipam"]["dataDir"], "/s/cni/ipam")

    def test_every_node_gets_its_own_cgroup_root_logs_and_addresses(self):
        one, two = (render.kubelet_config(Node(x), f"/s{x}", "/ca") for x in (1, 2))
        self.assertIn("cgroupRoot: /ncm-n1", one)
        self.assertIn("podLogsDir: /s1/pod-logs", one)
        self.assertIn("address: 198.19.254.11", one)
        self.assertIn("cgroupRoot: /ncm-n2", two)

    def test_containerd_keeps_pod_namespaces_and_cni_files_under_the_node(self):
        conf = render.containerd_config("/s", "localhost/pause:1")
        self.assertIn("netns_mounts_under_state_dir = true", conf)
        self.assertIn('conf_template = "/s/cni/template.json"', conf)
        self.assertIn('bin_dir = "/s/cni/bin"', conf)

    def test_node_macs_are_distinct_and_stable(self):
        self.assertEqual(Node(3).mac, Node(3).mac)
        self.assertNotEqual(Node(3).mac, Node(259).mac)


if __name__ == "__main__":
    unittest.main()
