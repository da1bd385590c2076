#!/usr/bin/env bash
# Installs what the tests and local runs need on a fresh machine (Debian packages, Rust components, the
# supply-chain tools), each mode only what it uses, so the run command waits for nothing it does not run.
# Go (>= the version in hack/tools/k8s/go.mod) must be on the machine: Debian's golang is too old to
# build Kubernetes 1.36, so its absence is reported, not papered over.
#
#   hack/install-prereqs.sh [all]        everything: test and supply-chain (the default)
#   hack/install-prereqs.sh test         the packages and Rust components hack/test.sh's checks use
#   hack/install-prereqs.sh supply-chain cargo-deny and cargo-cyclonedx, built from crates.io (~10 min cold;
#                                        hack/test.sh builds them at low priority beside its e2e steps)
#   hack/install-prereqs.sh nodes        what real nodes need (hack/local-up.sh --chart, NODES=3 hack/local-up.sh)
#   hack/install-prereqs.sh run          what netcm against a local control plane needs (hack/local-up.sh)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tag=install-prereqs
# shellcheck source=hack/lib.sh
source "$root/hack/lib.sh"
mode=${1:-all}
case "$mode" in
  all) bash "$root/hack/install-prereqs.sh" test && exec bash "$root/hack/install-prereqs.sh" supply-chain ;;
  run | nodes | test | supply-chain) ;;
  *) die "unknown mode '$mode': all, test, supply-chain, nodes or run" ;;
esac

need_pkgs=()
# The real nodes (hack/cluster.sh, hack/image.sh): containerd, runc and the CNI plugins from Debian, umoci for
# images without a registry, iptables and conntrack for kube-proxy, nft to remove the tables iptables-nft
# makes once they are empty again; libfaketime to step one process's wall clock in the e2e fault tests;
# musl-gcc for the static kubectl-netcm (hack/plugin.sh); yamllint for chart-testing's rules.
supply_chain_tools() {
  # Pinned, built once into ~/.cargo/bin and reused by every checkout on the machine.
  local crate version probe
  for crate in cargo-deny:0.20.2:deny cargo-cyclonedx:0.5.9:cyclonedx; do
    IFS=: read -r crate version probe <<<"$crate"
    cargo "$probe" --version 2>/dev/null | grep -q " $version\$" && continue
    echo "installing: $crate $version (cargo install; ~5 min cold on 2 cores)"
    cargo install --locked --quiet "$crate@$version"
  done
  echo "prerequisites (supply-chain) ok: $(cargo deny --version), $(cargo cyclonedx --version)"
}
if [ "$mode" = supply-chain ]; then
  command -v cargo >/dev/null 2>&1 || die "cargo not found: install Rust (rustup) first"
  supply_chain_tools
  exit 0
fi

pairs=(openssl:openssl curl:curl python3:python3 flock:util-linux setpriv:util-linux kill:procps)
[ "$mode" = run ] || pairs+=(ip:iproute2 gcc:gcc containerd:containerd runc:runc umoci:umoci iptables:iptables
  conntrack:conntrack nft:nftables /usr/lib/cni/bridge:containernetworking-plugins
  /usr/lib/cni/host-local:containernetworking-plugins)
[ "$mode" != test ] || pairs+=(promtool:prometheus /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1:libfaketime
  musl-gcc:musl-tools yamllint:yamllint)
for pair in "${pairs[@]}"; do
  cmd=${pair%%:*} pkg=${pair##*:}
  if [[ "$cmd" == /* ]]; then
    [ -e "$cmd" ] || need_pkgs+=("$pkg")
  else
    command -v "$cmd" >/dev/null 2>&1 || need_pkgs+=("$pkg")
  fi
done
# flanneld (built by hack/controlplane.sh for the e2e tests) needs cgo: a C compiler and the libc headers.
[ "$mode" != test ] || [ -f /usr/include/stdio.h ] || need_pkgs+=(libc6-dev)
# flanneld refuses to start without br_netfilter (it checks /proc/sys/net/bridge/bridge-nf-call-iptables).
br_netfilter_missing=0
if [ "$mode" = test ] && [ ! -e /proc/sys/net/bridge/bridge-nf-call-iptables ]; then
  br_netfilter_missing=1
  command -v modprobe >/dev/null 2>&1 || need_pkgs+=(kmod)
fi
mapfile -t need_pkgs < <(printf '%s\n' "${need_pkgs[@]}" | sort -u | grep -v '^$' || true)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "installing Debian packages (apt-get; about a minute): ${need_pkgs[*]}"
  [ "$(id -u)" -eq 0 ] || die "need root to apt-get install ${need_pkgs[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}"
fi

if [ "$br_netfilter_missing" = 1 ]; then
  echo "loading br_netfilter (flanneld checks for it)"
  modprobe br_netfilter || die "modprobe br_netfilter failed: the flannel e2e tests need it"
fi

command -v cargo >/dev/null 2>&1 || die "cargo not found: install Rust (rustup) first"
if [ "$mode" = test ] && command -v rustup >/dev/null 2>&1; then
  for c in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c"
  done
  rustup target list --installed 2>/dev/null | grep -qx x86_64-unknown-linux-musl \
    || rustup target add x86_64-unknown-linux-musl
fi
command -v go >/dev/null 2>&1 ||
  die "go not found: the control plane is built from the k8s.io/kubernetes Go module and needs Go >= 1.26"
echo "prerequisites ($mode) ok: $(cargo --version), $(go version)"
