"""hack/image/oci.py: python3 -m unittest discover -s hack/image"""

import hashlib
import io
import json
import os
import tarfile
import tempfile
import unittest

from oci import config_lines, digest


def put(layout, data):
    """Stores `data` (bytes) as a blob of `layout`; returns its digest."""
    hexdigest = hashlib.sha256(data).hexdigest()
    os.makedirs(os.path.join(layout, "blobs", "sha256"), exist_ok=True)
    with open(os.path.join(layout, "blobs", "sha256", hexdigest), "wb") as f:
        f.write(data)
    return "sha256:" + hexdigest


def layer(paths):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for p in paths:
            info = tarfile.TarInfo(p)
            info.size = 1
            t.addfile(info, io.BytesIO(b"x"))
    return buf.getvalue()


def image(layout, tag, config, paths):
    """Adds an image tagged `tag` with `config` (the config's "config" object) and one layer of `paths`."""
    cfg = put(layout, json.dumps({"architecture": "amd64", "os": "linux", "config": config}).encode())
    lay = put(layout, layer(paths))
    man = put(layout, json.dumps({"schemaVersion": 2, "config": {"digest": cfg},
                                  "layers": [{"digest": lay}]}).encode())
    index_path = os.path.join(layout, "index.json")
    index = {"schemaVersion": 2, "manifests": []}
    if os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
    index["manifests"].append({"digest": man,
                               "annotations": {"org.opencontainers.image.ref.name": tag}})
    with open(index_path, "w") as f:
        json.dump(index, f)


class ConfigLinesTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.layout = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def test_the_image_as_the_dockerfile_lines(self):
        image(self.layout, "0.1.0-abc", {
            "Entrypoint": ["/usr/local/bin/netcm"], "User": "65532:65532",
            "ExposedPorts": {"10271/tcp": {}, "9/udp": {}},
            "Labels": {"b": "2", "a": "one two"},
            "Env": ["PATH=/bin", "RUST_LOG=info", "SSL_CERT_FILE=/x"],
        }, ["./usr/local/bin/netcm", "./etc/passwd"])
        self.assertEqual(config_lines(self.layout, "0.1.0-abc"), [
            ("ENTRYPOINT", "/usr/local/bin/netcm"), ("USER", "65532:65532"),
            ("EXPOSE", "10271/tcp"), ("EXPOSE", "9/udp"), ("COPY", "/usr/local/bin/netcm"),
            ("LABEL", "a=one two"), ("LABEL", "b=2"), ("ENV", "RUST_LOG=info"),
        ])

    def test_no_copy_line_when_no_layer_has_the_entrypoint(self):
        image(self.layout, "t", {"Entrypoint": ["/netcm"]}, ["./other"])
        self.assertEqual(config_lines(self.layout, "t"), [("ENTRYPOINT", "/netcm"), ("USER", "")])

    def test_the_tag_picks_the_image(self):
        image(self.layout, "old", {"Entrypoint": ["/a"], "User": "1"}, ["./a"])
        image(self.layout, "new", {"Entrypoint": ["/b"], "User": "2"}, ["./b"])
        self.assertEqual(config_lines(self.layout, "new"), [("ENTRYPOINT", "/b"), ("USER", "2"), ("COPY", "/b")])

    def test_an_image_without_entrypoint_or_user(self):
        image(self.layout, "t", {}, ["./a"])
        self.assertEqual(config_lines(self.layout, "t"), [("ENTRYPOINT", ""), ("USER", "")])


class DigestTest(unittest.TestCase):
    def test_the_first_manifest(self):
        with tempfile.TemporaryDirectory() as layout:
            image(layout, "a", {}, ["./a"])
            image(layout, "b", {}, ["./b"])
            with open(os.path.join(layout, "index.json")) as f:
                first = json.load(f)["manifests"][0]["digest"]
            self.assertEqual(digest(layout), first)
            self.assertTrue(first.startswith("sha256:"))


if __name__ == "__main__":
    unittest.main()
