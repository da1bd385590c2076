"""CycloneDX SBOM of netcm's image: the binary's SBOM (cargo cyclonedx) plus what hack/image.sh copies in
beside it — the shared libraries the binary loads and the CA bundle — as the Debian packages they come
from, so a scanner sees glibc's version as well as every crate's.

    sbom.py image --binary-sbom netcm.cdx.json --binary target/release/netcm --out netcm-image.cdx.json
    sbom.py count FILE...          components per SBOM
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import uuid

# Files hack/image.sh adds that are not libraries of the binary (add_base).
EXTRA_FILES = ["/etc/ssl/certs/ca-certificates.crt"]


def deb_component(name, version, arch):
    """A Debian package as a CycloneDX component with its package URL."""
    return {
        "type": "library" if name != "ca-certificates" else "data",
        "name": name,
        "version": version,
        "purl": f"pkg:deb/debian/{name}@{version}?arch={arch}",
        "bom-ref": f"pkg:deb/debian/{name}@{version}?arch={arch}",
    }


def image_sbom(binary_sbom, packages, image_name, image_version, binary_sha256):
    """The image's SBOM: the binary's metadata component becomes a component of the image, its crates
    stay, and each Debian package in `packages` ((name, version, arch), any order, repeats allowed) is
    added once."""
    crates = list(binary_sbom.get("components", []))
    binary = dict(binary_sbom.get("metadata", {}).get("component", {}))
    binary.setdefault("type", "application")
    binary["hashes"] = [{"alg": "SHA-256", "content": binary_sha256}]
    debs = {}
    for name, version, arch in packages:
        debs[(name, version, arch)] = deb_component(name, version, arch)
    image_ref = f"{image_name}:{image_version}"
    return {
        "bomFormat": "CycloneDX",
        "specVersion": binary_sbom.get("specVersion", "1.5"),
        "serialNumber": f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, image_ref + '#' + binary_sha256)}",
        "version": 1,
        "metadata": {
            "component": {
                "type": "container",
                "name": image_name,
                "version": image_version,
                "bom-ref": image_ref,
            },
            "tools": binary_sbom.get("metadata", {}).get("tools", []),
        },
        "components": [binary] + crates + [debs[k] for k in sorted(debs)],
        "dependencies": binary_sbom.get("dependencies", []),
    }


def shared_libraries(binary):
    """Paths of the libraries the loader maps for `binary`, as hack/image.sh's add_libs finds them."""
    out = subprocess.run(["ldd", binary], check=True, capture_output=True, text=True).stdout
    libs = []
    for line in out.splitlines():
        parts = line.split()
        if "=>" in parts and len(parts) >= 3 and parts[2].startswith("/"):
            libs.append(parts[2])
        elif parts and parts[0].startswith("/"):
            libs.append(parts[0])
    return libs


def owning_package(path):
    """(name, version, arch) of the Debian package that installed `path` (tried as given and resolved)."""
    for candidate in dict.fromkeys([path, os.path.realpath(path), "/usr" + path]):
        found = subprocess.run(["dpkg-query", "-S", candidate], capture_output=True, text=True)
        if found.returncode == 0:
            name = found.stdout.split(":")[0].strip()
            fields = subprocess.run(
                ["dpkg-query", "-W", "-f=${Package} ${Version} ${Architecture}", f"{name}:amd64"],
                capture_output=True, text=True)
            if fields.returncode != 0:
                fields = subprocess.run(
                    ["dpkg-query", "-W", "-f=${Package} ${Version} ${Architecture}", name],
                    check=True, capture_output=True, text=True)
            pkg, version, arch = fields.stdout.split()
            return pkg, version, arch
    raise SystemExit(f"sbom: no Debian package owns {path}; the image's SBOM would miss it")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main(argv):
    ap = argparse.ArgumentParser(prog="sbom.py")
    sub = ap.add_subparsers(dest="cmd", required=True)
    img = sub.add_parser("image")
    img.add_argument("--binary-sbom", required=True)
    img.add_argument("--binary", required=True)
    img.add_argument("--image", default="localhost/netcm")
    img.add_argument("--out", required=True)
    cnt = sub.add_parser("count")
    cnt.add_argument("files", nargs="+")
    args = ap.parse_args(argv)
    if args.cmd == "count":
        for f in args.files:
            with open(f) as fh:
                print(f"{f}: {len(json.load(fh).get('components', []))} components")
        return 0
    with open(args.binary_sbom) as fh:
        binary_sbom = json.load(fh)
    digest = sha256(args.binary)
    version = binary_sbom.get("metadata", {}).get("component", {}).get("version", "0.0.0")
    files = shared_libraries(args.binary) + [f for f in EXTRA_FILES if os.path.exists(f)]
    packages = [owning_package(f) for f in files]
    doc = image_sbom(binary_sbom, packages, args.image, f"{version}-{digest[:12]}", digest)
    with open(args.out, "w") as fh:
        json.dump(doc, fh, indent=2, sort_keys=True)
        fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
