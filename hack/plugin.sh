#!/usr/bin/env bash
# `kubectl netcm` as krew ships it: a static (musl) build of netcm named kubectl-netcm, archived with the
# licence the way krew-index expects, the manifest rendered from .krew.yaml for that archive, and the
# archive installed by the real krew into a scratch KREW_ROOT and run through kubectl.
#
#   hack/plugin.sh build   prints ARCHIVE=… and MANIFEST=… (under _out/plugin/)
#   hack/plugin.sh test    build, then krew install --manifest --archive, then kubectl netcm version
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tag=plugin
source "$root/hack/lib.sh"
out=$root/_out/plugin
target=x86_64-unknown-linux-musl
cache=${NETCM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/netcm}
cd "$root"

cmd_build() {
  need cargo musl-gcc python3 tar gzip
  rustup target list --installed 2>/dev/null | grep -qx "$target" \
    || die "the Rust target $target is missing (hack/install-prereqs.sh adds it)"
  log "cargo build --profile plugin --target $target (static)"
  cargo build --quiet --profile plugin --locked --target "$target" -p netcm --bin netcm
  local bin=${CARGO_TARGET_DIR:-$root/target}/$target/plugin/netcm version stage
  # A static binary names no interpreter and no shared library.
  if readelf -l "$bin" | grep -q 'Requesting program interpreter' || readelf -d "$bin" | grep -q NEEDED; then
    die "$bin is not static"
  fi
  version=v$("$bin" --version | awk '{print $NF}')
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' RETURN
  install -m 0755 "$bin" "$stage/kubectl-netcm"
  install -m 0644 LICENSE "$stage/LICENSE"
  mkdir -p "$out"
  local archive=$out/kubectl-netcm_${version}_linux_amd64.tar.gz
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$stage" -cf - kubectl-netcm LICENSE \
    | gzip -n >"$archive"
  python3 hack/supply_chain/krew_manifest.py .krew.yaml "$version" "$archive" >"$out/netcm.yaml"
  log "static kubectl-netcm $version: $(du -h "$archive" | cut -f1) archive"
  echo "ARCHIVE=$archive"
  echo "MANIFEST=$out/netcm.yaml"
}

krew_bin() {
  local version=v0.4.3 bin=$cache/krew-v0.4.3/krew
  if [ ! -x "$bin" ]; then
    need go
    log "building krew $version (sigs.k8s.io/krew)"
    GOBIN=$(dirname "$bin") go install "sigs.k8s.io/krew/cmd/krew@$version"
  fi
  echo "$bin"
}

cmd_test() {
  local lines archive manifest krew krew_root kubectl got
  lines=$(cmd_build)
  archive=$(sed -n 's/^ARCHIVE=//p' <<<"$lines")
  manifest=$(sed -n 's/^MANIFEST=//p' <<<"$lines")
  krew=$(krew_bin)
  kubectl=$(bash hack/controlplane.sh bin kubectl)
  krew_root=$(mktemp -d)
  trap 'rm -rf "$krew_root"' RETURN
  KREW_ROOT=$krew_root "$krew" install --manifest="$manifest" --archive="$archive" </dev/null >&2
  got=$(PATH=$krew_root/bin:$PATH "$kubectl" netcm version)
  [ "$got" = "kubectl-netcm $(sed -n 's/^  version: v//p' "$manifest")" ] \
    || die "krew installed the plugin, but kubectl netcm version printed: $got"
  log "krew installed $manifest; kubectl netcm version: $got"
  # The static build talks to a real API server (musl's resolver and rustls, not glibc's): a report comes
  # back. Exit 1 is a report with a failed check (this control plane has no netcm leader); 2+ is not.
  local kubeconfig report code=0
  kubeconfig=$(bash hack/controlplane.sh up | tail -1)
  report=$(KUBECONFIG=${kubeconfig#KUBECONFIG=} PATH=$krew_root/bin:$PATH "$kubectl" netcm check -o json) || code=$?
  [ "$code" -le 1 ] || die "kubectl netcm check exited $code"
  python3 -c 'import json,sys; r=json.load(sys.stdin); assert any(c["check"]=="api" and c["status"]=="ok" for c in r["checks"]), r' <<<"$report" \
    || die "kubectl netcm check (static, krew-installed) did not reach the API server: $report"
  log "the krew-installed static plugin reached the API server: kubectl netcm check exited $code"
}

case "${1:-}" in
  build | test) "cmd_$1" ;;
  *) die "usage: hack/plugin.sh build|test" ;;
esac
