# Sourced by hack/controlplane.sh: builds the binaries it runs and hands out (`bin NAME`), each from its
# pinned Go module under hack/tools/, cached by version in $cache. Needs root, cache, the versions of
# hack/versions.env and hack/lib.sh's log, die and need.

etcd_bin=$cache/etcd-$ETCD_VERSION
flannel_bin=$cache/flannel-$FLANNEL_VERSION

# Go ≥ 1.27 turns JSON v2 on by default, which breaks the API server's OpenAPI output.
go_env() {
  local minor
  minor=$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')
  if [ "${minor:-0}" -ge 27 ]; then
    echo "GOEXPERIMENT=nojsonv2"
  fi
}

# Every Kubernetes binary carries its version: without it kube-apiserver reports v0.0.0-master and
# `helm install` refuses any chart with a kubeVersion constraint.
k8s_ldflags() {
  local minor=${KUBE_VERSION#v1.}
  minor=${minor%%.*}
  echo "-X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1" \
    "-X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
}

# The cache key names everything that shapes the binaries (the tools module, the link flags, the Go
# experiment), so a binary built another way is never reused: the unstamped builds of before lived in
# k8s-<version>/ and are ignored.
k8s_bin_dir() {
  local key
  key=$(cat "$root/hack/tools/k8s/go.mod" "$root/hack/tools/k8s/go.sum" <(k8s_ldflags) <(go_env) | sha256sum | cut -c1-12)
  echo "$cache/k8s-$KUBE_VERSION-$key"
}

# The version a built binary reports, so a stale or unstamped binary is caught, not run.
check_stamp() {
  local bin=$1 name=$2 out
  case "$name" in
    kubectl) out=$("$bin" version --client 2>&1 || true) ;;
    *) out=$("$bin" --version 2>&1 || true) ;;
  esac
  case "$out" in
    *"$KUBE_VERSION"*) ;;
    *) die "$bin reports '$out', not $KUBE_VERSION (built without version stamping?)" ;;
  esac
}

# go_quietly LOG WHAT ARG...: `go ARG...` with its output (a cold module cache prints hundreds of
# `go: downloading` lines) in LOG; a failure dies with LOG's tail and path.
go_quietly() {
  local log_file=$1 what=$2
  shift 2
  mkdir -p "$(dirname "$log_file")"
  "$@" >"$log_file" 2>&1 || die "building $what failed; the last lines of $log_file: $(tail -15 "$log_file")"
}

# build_k8s NAME...: the Kubernetes binaries among NAMEs not yet cached, in one `go build`, so the
# packages they share compile once and one binary links while another's packages compile.
build_k8s() {
  local k8s_bin missing=() name
  k8s_bin=$(k8s_bin_dir)
  for name in "$@"; do [ -x "$k8s_bin/$name" ] || missing+=("$name"); done
  [ ${#missing[@]} -gt 0 ] || return 0
  need go flock sha256sum
  mkdir -p "$k8s_bin"
  (
    flock 9
    local todo=() pkgs=() tmp
    for name in "${missing[@]}"; do [ -x "$k8s_bin/$name" ] || todo+=("$name"); done
    [ ${#todo[@]} -gt 0 ] || exit 0
    for name in "${todo[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$name"); done
    log "building ${todo[*]} $KUBE_VERSION from the k8s.io/kubernetes module (cold on 2 cores: ~8 min for kube-apiserver, ~12 for all seven; log: $cache/logs/k8s.log)"
    tmp=$(mktemp -d "$k8s_bin/.build.XXXXXX")
    cd "$root/hack/tools/k8s"
    # `go build -o DIR` with one package writes DIR/<name> only for a main package; with several, each.
    # shellcheck disable=SC2046
    go_quietly "$cache/logs/k8s.log" "${todo[*]}" \
      env $(go_env) go build -trimpath -ldflags "$(k8s_ldflags)" -o "$tmp/" "${pkgs[@]}"
    for name in "${todo[@]}"; do
      check_stamp "$tmp/$name" "$name"
      mv "$tmp/$name" "$k8s_bin/$name"
    done
    rmdir "$tmp"
  ) 9>"$cache/build.lock"
}

build_etcd() {
  [ -x "$etcd_bin/etcd" ] && return 0
  need go flock
  mkdir -p "$etcd_bin"
  (
    flock 9
    [ -x "$etcd_bin/etcd" ] && exit 0
    log "building etcd $ETCD_VERSION from the go.etcd.io/etcd/server/v3 module (cold on 2 cores: ~2 min; log: $cache/logs/etcd.log)"
    cd "$root/hack/tools/etcd"
    go_quietly "$cache/logs/etcd.log" etcd go build -trimpath -o "$etcd_bin/etcd.tmp" go.etcd.io/etcd/server/v3
    mv "$etcd_bin/etcd.tmp" "$etcd_bin/etcd"
  ) 9>"$cache/build.lock"
}

# flanneld for the e2e tests that run netcm beside real flannel agents. hack/tools/flannel replaces two
# Tencent Cloud SDK modules the proxy refuses with local stand-ins; cgo, because its udp backend is C.
build_flanneld() {
  [ -x "$flannel_bin/flanneld" ] && return 0
  need go flock gcc
  mkdir -p "$flannel_bin"
  (
    flock 9
    [ -x "$flannel_bin/flanneld" ] && exit 0
    log "building flanneld $FLANNEL_VERSION from the github.com/flannel-io/flannel module (cold on 2 cores: ~3 min; log: $cache/logs/flanneld.log)"
    cd "$root/hack/tools/flannel"
    # The cache is keyed by FLANNEL_VERSION, so the module must build exactly that version.
    grep -q "^require github.com/flannel-io/flannel $FLANNEL_VERSION\$" go.mod ||
      die "hack/tools/flannel/go.mod does not require github.com/flannel-io/flannel $FLANNEL_VERSION (hack/versions.env)"
    go_quietly "$cache/logs/flanneld.log" flanneld env CGO_ENABLED=1 go build -trimpath \
      -ldflags "-X github.com/flannel-io/flannel/pkg/version.Version=$FLANNEL_VERSION" \
      -o "$flannel_bin/flanneld.tmp" github.com/flannel-io/flannel
    mv "$flannel_bin/flanneld.tmp" "$flannel_bin/flanneld"
  ) 9>"$cache/build.lock"
}

bin_path() {
  case "$1" in
    kube-apiserver | kube-controller-manager | kubectl | kubelet | kube-scheduler | kube-proxy)
      mkdir -p "$cache"; build_k8s "$1"; echo "$(k8s_bin_dir)/$1" ;;
    etcd) mkdir -p "$cache"; build_etcd; echo "$etcd_bin/etcd" ;;
    flanneld) mkdir -p "$cache"; build_flanneld; echo "$flannel_bin/flanneld" ;;
    *) die "unknown binary '$1' (kube-apiserver, kube-controller-manager, kubectl, kubelet, kube-scheduler, kube-proxy, etcd, flanneld)" ;;
  esac
}

# build_all NAME...: every binary among NAMEs cached, the Kubernetes ones in one build.
build_all() {
  local k8s=() name
  for name in "$@"; do
    case "$name" in
      kube-apiserver | kube-controller-manager | kubectl | kubelet | kube-scheduler | kube-proxy) k8s+=("$name") ;;
      etcd | flanneld) ;;
      *) die "unknown binary '$name' (kube-apiserver, kube-controller-manager, kubectl, kubelet, kube-scheduler, kube-proxy, etcd, flanneld)" ;;
    esac
  done
  mkdir -p "$cache"
  [ ${#k8s[@]} -eq 0 ] || build_k8s "${k8s[@]}"
  for name in "$@"; do
    case "$name" in
      etcd) build_etcd ;;
      flanneld) build_flanneld ;;
    esac
  done
}
