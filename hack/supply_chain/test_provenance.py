import unittest

from provenance import PREDICATE_TYPE, statement


class StatementTest(unittest.TestCase):
    def test_the_subject_is_the_image_by_its_manifest_digest_and_the_source_is_pinned(self):
        doc = statement("localhost/netcm:0.1.0-abc", "sha256:" + "d" * 64, "c" * 40, False,
                        "e" * 64, "rustc 1.95.0", "local:hack/image.sh")
        self.assertEqual(doc["subject"], [{"name": "localhost/netcm:0.1.0-abc",
                                           "digest": {"sha256": "d" * 64}}])
        self.assertEqual(doc["predicateType"], PREDICATE_TYPE)
        deps = doc["predicate"]["buildDefinition"]["resolvedDependencies"]
        self.assertIn({"uri": "git+file:netcm", "digest": {"gitCommit": "c" * 40}}, deps)
        self.assertIn({"uri": "Cargo.lock", "digest": {"sha256": "e" * 64}}, deps)
        self.assertFalse(doc["predicate"]["buildDefinition"]["externalParameters"]["source"]["dirty"])


if __name__ == "__main__":
    unittest.main()
