#!/usr/bin/env bash
# Supply-chain checks and artefacts for netcm's binary and image:
#
#   hack/supply-chain.sh deny          cargo deny check licenses bans sources with deny.toml, then the same
#                                      policy against a crate it must refuse (a test of the policy itself)
#   hack/supply-chain.sh sbom          CycloneDX SBOMs: of the binary (cargo cyclonedx) and of the image
#                                      (the binary's components plus the Debian packages of the libraries
#                                      hack/image.sh copies in); prints the files and component counts
#   hack/supply-chain.sh reproducible [--against-checkout]
#                                      builds the image from two clean clones of HEAD (different paths and
#                                      target dirs) and compares the manifest digests; exit 1 on a difference
#   hack/supply-chain.sh provenance    an in-toto statement (SLSA provenance v1) for the built image
#
# Output under _out/supply-chain/. The Python beside it (hack/supply_chain/) does the merging and
# rendering, with unit tests.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tag=supply-chain
source "$root/hack/lib.sh"
out=$root/_out/supply-chain
cd "$root"

cmd_deny() {
  need cargo-deny
  log "cargo deny check licenses bans sources (deny.toml)"
  cargo deny --locked check --hide-inclusion-graph licenses bans sources
  # The policy must refuse what it says it refuses: a crate under a copyleft licence, from a git source.
  local scratch
  scratch=$(mktemp -d)
  trap 'rm -rf "$scratch"' RETURN
  mkdir -p "$scratch/src"
  printf '[package]\nname = "gpl-probe"\nversion = "0.1.0"\nedition = "2021"\nlicense = "GPL-3.0-only"\n[workspace]\n' \
    >"$scratch/Cargo.toml"
  : >"$scratch/src/lib.rs"
  (cd "$scratch" && cargo generate-lockfile --offline -q)
  if cargo deny --manifest-path "$scratch/Cargo.toml" --config "$root/deny.toml" check licenses \
    >"$scratch/deny.log" 2>&1; then
    die "deny.toml accepted a GPL-3.0-only crate: the licence policy is not in force"
  fi
  grep -q 'GPL-3.0-only' "$scratch/deny.log" || die "cargo deny failed the probe for another reason: $(tail -5 "$scratch/deny.log")"
  log "policy in force: a GPL-3.0-only crate is refused"
}

cmd_sbom() {
  need cargo-cyclonedx dpkg-query python3
  mkdir -p "$out"
  log "cargo cyclonedx (the netcm binary's crates)"
  cargo cyclonedx --manifest-path cmd/netcm/Cargo.toml --format json --spec-version 1.5 \
    --override-filename netcm.cdx >/dev/null
  mv cmd/netcm/netcm.cdx.json "$out/netcm.cdx.json"
  # cargo cyclonedx writes one beside every workspace member's Cargo.toml; only the binary's is kept.
  find "$root/cmd" "$root/pkg" "$root/controllers" "$root/e2e" -name netcm.cdx.json -delete
  local bin=$root/target/release/netcm
  [ -x "$bin" ] || die "no release binary: run hack/image.sh build first"
  python3 hack/supply_chain/sbom.py image --binary-sbom "$out/netcm.cdx.json" --binary "$bin" \
    --out "$out/netcm-image.cdx.json"
  python3 hack/supply_chain/sbom.py count "$out/netcm.cdx.json" "$out/netcm-image.cdx.json"
}

# digest_of LAYOUT: the manifest digest of the OCI layout LAYOUT (hack/image.sh's _out/image/netcm).
digest_of() { python3 "$root/hack/image/oci.py" digest "$1"; }

# clean_build DIR: clones HEAD into DIR/src (nothing of the working tree's changes, another path) and
# builds the image there with a target dir of its own; prints the manifest digest.
clean_build() {
  git clone --quiet --no-local "$root" "$1/src"
  (cd "$1/src" && git checkout --quiet "$(git -C "$root" rev-parse HEAD)")
  (cd "$1/src" && CARGO_TARGET_DIR=$1/target NETCM_IMAGE_OUT=$1/image bash hack/image.sh build >/dev/null)
  digest_of "$1/image/netcm"
}

# reproducible [--against-checkout]: two images from clean clones of HEAD at different paths must have
# one digest. With --against-checkout (hack/test.sh, whose checkout is itself clean and has just built
# _out/image), one clean clone is compared with the checkout's image: one extra build instead of two.
cmd_reproducible() {
  mkdir -p "$out"
  local a b first second
  a=$(mktemp -d /tmp/netcm-repro-a.XXXX) b=$(mktemp -d /tmp/netcm-repro-b.XXXX)
  trap 'rm -rf "$a" "$b"' RETURN
  if [ "${1:-}" = --against-checkout ]; then
    # What goes into the image: the workspace's sources, lock file and cargo settings, and the image recipe.
    git diff --quiet HEAD -- .cargo Cargo.toml Cargo.lock cmd pkg controllers hack/image.sh hack/image \
      || die "the checkout's sources differ from HEAD: its image is not HEAD's (commit them, or run without --against-checkout)"
    [ -f "$root/_out/image/netcm/index.json" ] || die "no image in _out/image: run hack/image.sh build first"
    local built_from
    built_from=$(cat "$root/_out/image/netcm.commit" 2>/dev/null || echo "an unrecorded commit")
    [ "$built_from" = "$(git rev-parse HEAD)" ] \
      || die "the image in _out/image was built from $built_from, not HEAD $(git rev-parse HEAD): run hack/image.sh build first"
    first=$(digest_of "$root/_out/image/netcm")
  else
    first=$(clean_build "$a")
  fi
  second=$(clean_build "$b")
  printf 'first build:  %s\nsecond build: %s\n' "$first" "$second"
  [ "$first" = "$second" ] || die "two builds of $(git rev-parse --short HEAD) gave different image digests"
  echo "$first" >"$out/reproducible-digest"
  log "reproducible: both builds give $first"
}

cmd_provenance() {
  need python3
  mkdir -p "$out"
  local index=$root/_out/image/netcm/index.json
  [ -f "$index" ] || die "no image: run hack/image.sh build first"
  python3 hack/supply_chain/provenance.py --index "$index" --tag "$(cat "$root/_out/image/netcm.tag")" \
    --repo "$root" >"$out/netcm.provenance.json"
  log "wrote $out/netcm.provenance.json"
}

case "${1:-}" in
  deny | sbom | provenance) "cmd_$1" ;;
  reproducible) shift; cmd_reproducible "$@" ;;
  *) die "usage: hack/supply-chain.sh deny|sbom|reproducible|provenance" ;;
esac
