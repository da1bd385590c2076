import os
import unittest

from krew_manifest import render

TEMPLATE = os.path.join(os.path.dirname(__file__), "..", "..", ".krew.yaml")


class RenderTest(unittest.TestCase):
    def test_the_repositorys_template_renders_the_tag_uri_and_checksum_and_nothing_else_is_left(self):
        with open(TEMPLATE) as fh:
            out = render(fh.read(), "v0.1.0", "a" * 64)
        self.assertIn("  version: v0.1.0\n", out)
        self.assertIn("      uri: https://github.com/netcm/netcm/releases/download/v0.1.0/"
                      "kubectl-netcm_v0.1.0_linux_amd64.tar.gz\n      sha256: " + "a" * 64 + "\n", out)
        self.assertNotIn("{{", out)

    def test_an_unknown_template_action_is_refused(self):
        with self.assertRaises(SystemExit):
            render("version: {{ .Other }}\n", "v1", "0" * 64)


if __name__ == "__main__":
    unittest.main()
