#!/usr/bin/env bash
# flannel's node-side binaries for the pod network of hack/cluster.sh, built from source and
# cached by version like hack/controlplane.sh's (flanneld itself is `hack/controlplane.sh bin flanneld`):
#
#   hack/flannel.sh bin flannel-cni      flannel's CNI plugin (hack/tools/flannel-cni, FLANNEL_CNI_VERSION),
#                                        static, named `flannel` as the conflist's "type" requires
#   hack/flannel.sh bin flannel-install  the DaemonSet's init container (hack/tools/flannel-install), static
#
# Each prints the binary's path. The image that carries them is `hack/image.sh flanneld`; the DaemonSet,
# its ConfigMap and RBAC are e2e/testdata/flannel/.
# Environment: NETCM_CACHE_DIR (default ${XDG_CACHE_HOME:-~/.cache}/netcm).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=hack/versions.env
source "$root/hack/versions.env"
cache=${NETCM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/netcm}
tag=flannel
# shellcheck source=hack/lib.sh
source "$root/hack/lib.sh"

# build DIR OUT [LDFLAGS...]: the static Go program in hack/tools/DIR as OUT, unless OUT exists; under the
# cache's build lock, so concurrent test processes build it once.
build() {
  local src=$root/hack/tools/$1 out=$2
  shift 2
  [ -x "$out" ] && return 0
  command -v go >/dev/null || die "go is missing (hack/install-prereqs.sh says which version)"
  mkdir -p "$(dirname "$out")"
  (
    flock 9
    [ -x "$out" ] && exit 0
    log "building $out"
    cd "$src"
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w $*" -o "$out.tmp" .
    mv "$out.tmp" "$out"
  ) 9>"$cache/build.lock"
}

case "${1:-} ${2:-}" in
  "bin flannel-cni")
    out=$cache/flannel-cni-$FLANNEL_CNI_VERSION/flannel
    build flannel-cni "$out" -X main.Program=flannel -X "main.Version=$FLANNEL_CNI_VERSION" -X main.Commit=4c87e5d4
    echo "$out" ;;
  "bin flannel-install")
    # Keyed by its source, which changes with this repository rather than with a release.
    key=$(cat "$root/hack/tools/flannel-install/go.mod" "$root/hack/tools/flannel-install/main.go" | sha256sum | cut -c1-12)
    out=$cache/flannel-install-$key/flannel-install
    build flannel-install "$out"
    echo "$out" ;;
  *) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
