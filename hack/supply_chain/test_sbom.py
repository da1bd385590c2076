import unittest

from sbom import image_sbom

BINARY = {
    "bomFormat": "CycloneDX",
    "specVersion": "1.5",
    "metadata": {"component": {"type": "application", "name": "netcm", "version": "0.1.0",
                               "bom-ref": "netcm"}},
    "components": [{"type": "library", "name": "kube", "version": "5.0.0",
                    "purl": "pkg:cargo/kube@5.0.0"}],
    "dependencies": [{"ref": "netcm", "dependsOn": ["pkg:cargo/kube@5.0.0"]}],
}


class ImageSbomTest(unittest.TestCase):
    def test_the_image_holds_the_binary_its_crates_and_each_debian_package_once(self):
        doc = image_sbom(BINARY, [("libc6", "2.36-9", "amd64"), ("libgcc-s1", "12.2.0-14", "amd64"),
                                  ("libc6", "2.36-9", "amd64")],
                         "localhost/netcm", "0.1.0-abc", "ab" * 32)
        names = [c["name"] for c in doc["components"]]
        self.assertEqual(names, ["netcm", "kube", "libc6", "libgcc-s1"])
        self.assertEqual(doc["metadata"]["component"]["type"], "container")
        self.assertEqual(doc["components"][0]["hashes"][0]["content"], "ab" * 32)
        self.assertIn("pkg:deb/debian/libc6@2.36-9?arch=amd64", [c.get("purl") for c in doc["components"]])
        self.assertEqual(doc["dependencies"], BINARY["dependencies"])

    def test_the_same_inputs_give_the_same_document_so_the_sbom_is_reproducible_too(self):
        a = image_sbom(BINARY, [("libc6", "2.36-9", "amd64")], "localhost/netcm", "v", "00" * 32)
        b = image_sbom(BINARY, [("libc6", "2.36-9", "amd64")], "localhost/netcm", "v", "00" * 32)
        self.assertEqual(a, b)
        c = image_sbom(BINARY, [("libc6", "2.36-9", "amd64")], "localhost/netcm", "v", "11" * 32)
        self.assertNotEqual(a["serialNumber"], c["serialNumber"])


if __name__ == "__main__":
    unittest.main()
