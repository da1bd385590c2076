"""An in-toto Statement (v1) carrying SLSA provenance (v1) for netcm's image: which source commit, lock
file and toolchain hack/image.sh built it from. Unsigned: signing needs a key or an OIDC identity, which
a registry-connected CI has (docs/supply-chain.md says how); this machine has neither.

    provenance.py --index _out/image/netcm/index.json --tag TAG --repo CHECKOUT > statement.json
"""

import argparse
import hashlib
import json
import subprocess
import sys

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://github.com/netcm/netcm/hack/image.sh@v1"


def statement(image, manifest_digest, commit, dirty, lock_sha256, rustc, builder_id):
    """The statement for `image` whose OCI manifest has `manifest_digest` ("sha256:…")."""
    algo, _, value = manifest_digest.partition(":")
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": image, "digest": {algo: value}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {"source": {"commit": commit, "dirty": dirty},
                                       "command": "hack/image.sh build"},
                "internalParameters": {"rustc": rustc},
                "resolvedDependencies": [
                    {"uri": "git+file:netcm", "digest": {"gitCommit": commit}},
                    {"uri": "Cargo.lock", "digest": {"sha256": lock_sha256}},
                ],
            },
            "runDetails": {"builder": {"id": builder_id}},
        },
    }


def run(args, cwd):
    return subprocess.run(args, cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def main(argv):
    ap = argparse.ArgumentParser(prog="provenance.py")
    ap.add_argument("--index", required=True)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--repo", required=True)
    ap.add_argument("--image", default="localhost/netcm")
    ap.add_argument("--builder", default="local:hack/image.sh")
    args = ap.parse_args(argv)
    with open(args.index) as fh:
        manifests = json.load(fh)["manifests"]
    if len(manifests) != 1:
        raise SystemExit(f"provenance: expected one manifest in {args.index}, found {len(manifests)}")
    with open(f"{args.repo}/Cargo.lock", "rb") as fh:
        lock = hashlib.sha256(fh.read()).hexdigest()
    commit = run(["git", "rev-parse", "HEAD"], args.repo)
    dirty = bool(run(["git", "status", "--porcelain", "--untracked-files=no"], args.repo))
    doc = statement(f"{args.image}:{args.tag}", manifests[0]["digest"], commit, dirty, lock,
                    run(["rustc", "--version"], args.repo), args.builder)
    json.dump(doc, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
