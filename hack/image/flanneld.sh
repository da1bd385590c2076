# shellcheck shell=bash
# `hack/image.sh flanneld`: flannel's DaemonSet image (e2e/testdata/flannel), sourced by hack/image.sh for its
# helpers (add_file, add_libs, oci_image). One image carries both containers' programs:
#   /opt/bin/flanneld   `hack/controlplane.sh bin flanneld` (FLANNEL_VERSION; cgo, so with its libc)
#   /flannel            flannel's CNI plugin, `hack/flannel.sh bin flannel-cni` (static)
#   /flannel-install    the init container that copies /flannel and the node's conflist to the host
#   iptables            flanneld runs iptables, iptables-restore and their ip6 twins (its FORWARD accept
#                       rules and, with --ip-masq, its MASQUERADE rules; go-iptables execs the binaries).
#                       They are this machine's Debian iptables (nf_tables backend, the same one kube-proxy
#                       uses in each node, so both write one ruleset), with the libraries ldd lists and
#                       the xtables extensions it loads at run time (-m comment, -j MASQUERADE...).
# Runs as root: flanneld needs NET_ADMIN and NET_RAW in the node's network namespace (hostNetwork).

cmd_flanneld() {
  need umoci tar sha256sum install ldd
  mkdir -p "$out"
  local flanneld cni installer xt multi rootfs=$out/flanneld.rootfs key tool so
  flanneld=$(bash "$root/hack/controlplane.sh" bin flanneld | tail -1)
  cni=$(bash "$root/hack/flannel.sh" bin flannel-cni | tail -1)
  installer=$(bash "$root/hack/flannel.sh" bin flannel-install | tail -1)
  multi=$(readlink -f "$(command -v iptables)")
  xt=/usr/lib/x86_64-linux-gnu/xtables
  case "$multi" in
    */xtables-nft-multi) ;;
    *) die "iptables here is $multi, not the nf_tables backend kube-proxy uses (update-alternatives --set iptables /usr/sbin/iptables-nft)" ;;
  esac
  [ -d "$xt" ] || die "no xtables extensions in $xt (Debian's iptables package)"
  rm -rf "$rootfs"
  mkdir -p "$rootfs/tmp" "$rootfs/run"
  chmod 1777 "$rootfs/tmp"
  add_file "$rootfs" "$flanneld" /opt/bin/flanneld 0755
  add_libs "$rootfs" "$flanneld"
  add_file "$rootfs" "$cni" /flannel 0755
  add_file "$rootfs" "$installer" /flannel-install 0755
  # xtables-nft-multi picks its personality from argv[0], so a copy under each name is that command.
  for tool in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
    add_file "$rootfs" "$multi" "/usr/sbin/$tool" 0755
  done
  add_libs "$rootfs" "$multi"
  for so in "$xt"/*.so; do
    add_file "$rootfs" "$so" "$so" 0644
    add_libs "$rootfs" "$so"
  done
  # The tag changes with any of the programs, so a rebuilt one is never run under an old name.
  key=$(cat "$flanneld" "$cni" "$installer" "$multi" | sha256sum | cut -c1-12)
  oci_image flanneld "$FLANNEL_VERSION-$key" "$rootfs" --config.entrypoint /opt/bin/flanneld --config.user 0:0 \
    --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  rm -rf "$rootfs"
  log "built localhost/flanneld:$FLANNEL_VERSION-$key ($(du -h "$out/flanneld.tar" | cut -f1))"
  echo "IMAGE=localhost/flanneld:$FLANNEL_VERSION-$key"
  echo "TAR=$out/flanneld.tar"
}
