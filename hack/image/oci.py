"""Reads the OCI image layout hack/image.sh builds (umoci's: index.json, blobs/<algorithm>/<hex>).

    oci.py config LAYOUT TAG   the image tagged TAG as hack/image.sh check compares it with the Dockerfile:
                               the KEY<TAB>VALUE lines of hack/image/dockerfile.py, for ENTRYPOINT, USER,
                               EXPOSE, COPY (the entrypoint's file, if a layer has it), LABEL and ENV (the
                               Dockerfile's own: all but distroless's PATH and SSL_CERT_FILE, which come from
                               its base image)
    oci.py digest LAYOUT       the digest of the layout's (first) manifest: the image's identity, which
                               hack/supply-chain.sh reproducible compares

Tests: python3 -m unittest discover -s hack/image
"""

import json
import os
import sys
import tarfile


def blob(layout, digest):
    """The path of the blob `digest` ("sha256:…") in `layout`."""
    return os.path.join(layout, "blobs", *digest.split(":"))


def load(layout, digest):
    with open(blob(layout, digest)) as f:
        return json.load(f)


def index(layout):
    with open(os.path.join(layout, "index.json")) as f:
        return json.load(f)


def digest(layout):
    """The digest of the first manifest of `layout` (hack/image.sh's layouts hold one)."""
    return index(layout)["manifests"][0]["digest"]


def manifest(layout, tag):
    """The manifest of the image tagged `tag` (its index entry's org.opencontainers.image.ref.name)."""
    m = next(m for m in index(layout)["manifests"]
             if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag)
    return load(layout, m["digest"])


def files(layout, man):
    """Every path in the image's layers, absolute and normalised."""
    out = set()
    for layer in man["layers"]:
        with tarfile.open(blob(layout, layer["digest"])) as t:
            out |= {"/" + os.path.normpath(n.name) for n in t.getmembers()}
    return out


# The environment distroless's base image sets; the Dockerfile's final stage does not repeat it.
BASE_ENV = ("PATH=", "SSL_CERT_FILE=")


def config_lines(layout, tag):
    """The (KEY, VALUE) pairs of the image tagged `tag`, comparable with dockerfile.final_stage's."""
    man = manifest(layout, tag)
    cfg = load(layout, man["config"]["digest"])["config"]
    out = [("ENTRYPOINT", " ".join(cfg.get("Entrypoint") or [])), ("USER", cfg.get("User", ""))]
    out.extend(("EXPOSE", p) for p in sorted(cfg.get("ExposedPorts") or {}))
    ep = (cfg.get("Entrypoint") or [""])[0]
    if ep in files(layout, man):
        out.append(("COPY", ep))
    out.extend(("LABEL", k + "=" + v) for k, v in sorted((cfg.get("Labels") or {}).items()))
    out.extend(("ENV", e) for e in cfg.get("Env") or [] if not e.startswith(BASE_ENV))
    return out


def main(argv):
    if len(argv) == 3 and argv[0] == "config":
        for key, value in config_lines(argv[1], argv[2]):
            print(key + "\t" + value)
    elif len(argv) == 2 and argv[0] == "digest":
        print(digest(argv[1]))
    else:
        sys.exit("usage: oci.py config LAYOUT TAG | oci.py digest LAYOUT")


if __name__ == "__main__":
    main(sys.argv[1:])
