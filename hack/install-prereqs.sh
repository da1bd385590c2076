#!/usr/bin/env bash
# Installs what the tests and local runs need on a fresh machine (Debian packages, Rust components).
# Go (>= the version in hack/tools/k8s/go.mod) must be on the machine: Debian's golang is too old to
# build Kubernetes 1.36, so its absence is reported, not papered over.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tag=install-prereqs
# shellcheck source=hack/lib.sh
source "$root/hack/lib.sh"

need_pkgs=()
# The real nodes (hack/cluster.sh, hack/image.sh): containerd, runc and the CNI plugins from Debian, umoci for
# images without a registry, iptables and conntrack for kube-proxy, nft to remove the tables iptables-nft
# makes once they are empty again; libfaketime to step one process's wall clock in the e2e fault tests;
# musl-gcc for the static kubectl-netcm (hack/plugin.sh); yamllint for chart-testing's rules.
for pair in promtool:prometheus openssl:openssl curl:curl python3:python3 ip:iproute2 flock:util-linux setpriv:util-linux kill:procps gcc:gcc \
  containerd:containerd runc:runc umoci:umoci iptables:iptables conntrack:conntrack nft:nftables \
  /usr/lib/cni/bridge:containernetworking-plugins /usr/lib/cni/host-local:containernetworking-plugins \
  /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1:libfaketime musl-gcc:musl-tools \
  yamllint:yamllint; do
  cmd=${pair%%:*} pkg=${pair##*:}
  if [[ "$cmd" == /* ]]; then
    [ -e "$cmd" ] || need_pkgs+=("$pkg")
  else
    command -v "$cmd" >/dev/null 2>&1 || need_pkgs+=("$pkg")
  fi
done
# flanneld (built by hack/controlplane.sh for the e2e tests) needs cgo: a C compiler and the libc headers.
[ -f /usr/include/stdio.h ] || need_pkgs+=(libc6-dev)
# flanneld refuses to start without br_netfilter (it checks /proc/sys/net/bridge/bridge-nf-call-iptables).
br_netfilter_missing=0
if [ ! -e /proc/sys/net/bridge/bridge-nf-call-iptables ]; then
  br_netfilter_missing=1
  command -v modprobe >/dev/null 2>&1 || need_pkgs+=(kmod)
fi
mapfile -t need_pkgs < <(printf '%s\n' "${need_pkgs[@]}" | sort -u | grep -v '^$' || true)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "installing: ${need_pkgs[*]}"
  [ "$(id -u)" -eq 0 ] || die "need root to apt-get install ${need_pkgs[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}"
fi

if [ "$br_netfilter_missing" = 1 ]; then
  echo "loading br_netfilter (flanneld checks for it)"
  modprobe br_netfilter || die "modprobe br_netfilter failed: the flannel e2e tests need it"
fi

command -v cargo >/dev/null 2>&1 || die "cargo not found: install Rust (rustup) first"
if command -v rustup >/dev/null 2>&1; then
  for c in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c"
  done
  rustup target list --installed 2>/dev/null | grep -qx x86_64-unknown-linux-musl \
    || rustup target add x86_64-unknown-linux-musl
fi
# Supply-chain tools (hack/supply-chain.sh), pinned; built once into ~/.cargo/bin (about 10 minutes cold on
# 2 cores, then reused by every checkout on the machine).
cargo_tool() {
  local crate=$1 version=$2 probe=$3
  $probe --version 2>/dev/null | grep -q " $version\$" && return 0
  echo "installing: $crate $version (cargo install)"
  cargo install --locked --quiet "$crate@$version"
}
cargo_tool cargo-deny 0.20.2 "cargo deny"
cargo_tool cargo-cyclonedx 0.5.9 "cargo cyclonedx"
command -v go >/dev/null 2>&1 ||
  die "go not found: the control plane is built from the k8s.io/kubernetes Go module and needs Go >= 1.26"
echo "prerequisites ok: $(cargo --version), $(go version)"
