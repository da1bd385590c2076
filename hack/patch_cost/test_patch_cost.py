"""Tests of patch_cost.py's pure parts: the PATCH bodies it compares and the Nodes it writes them to."""

import json
import unittest

import patch_cost


class Forms(unittest.TestCase):
    def test_netcms_form_tests_the_uid_and_the_fence_annotation_before_setting_both_fields(self):
        body = patch_cost.json_patch("u1", ["10.0.1.0/24"])
        self.assertEqual([op["op"] for op in body], ["test", "test", "add", "add"])
        self.assertEqual(body[0], {"op": "test", "path": "/metadata/uid", "value": "u1"})
        self.assertEqual(body[1]["path"], "/metadata/annotations/ipam.netcm.io~1fenced-at")
        self.assertEqual(body[3], {"op": "add", "path": "/spec/podCIDRs", "value": ["10.0.1.0/24"]})

    def test_kube_controller_managers_form_sets_only_spec_and_asks_for_protobuf(self):
        ctype, build, accept, query = patch_cost.FORMS["kcm-strategic-merge"]
        self.assertEqual(ctype, "application/strategic-merge-patch+json")
        self.assertEqual(build("u1", ["10.0.1.0/24"]), {"spec": {"podCIDR": "10.0.1.0/24", "podCIDRs": ["10.0.1.0/24"]}})
        self.assertEqual(accept, patch_cost.PROTOBUF)
        self.assertEqual(query, "")

    def test_netcms_form_is_sent_as_netcm_sends_it(self):
        _, _, accept, query = patch_cost.FORMS["netcm-json-patch"]
        self.assertTrue(accept.startswith("application/json;as=PartialObjectMetadata"))
        self.assertIn("fieldManager=netcm", query)


class Nodes(unittest.TestCase):
    def test_a_node_status_is_kubelet_sized_and_each_node_gets_its_own_cidr(self):
        self.assertGreater(len(json.dumps(patch_cost.status(7))), 3000)
        self.assertNotEqual(patch_cost.pod_cidrs(1), patch_cost.pod_cidrs(257))


if __name__ == "__main__":
    unittest.main()
