#!/usr/bin/env bash
# netcm's OCI image, built here without a container engine or a registry (umoci), for the real nodes of
# hack/cluster.sh. Same layout as the Dockerfile's image (which stays for users with a container engine):
# the release binary at /usr/local/bin/netcm, run as 65532:65532, the glibc and libgcc it links plus
# distroless's /etc/passwd, /etc/group, /home/nonroot and /tmp, no shell. `check` keeps the two in step.
#
#   hack/image.sh build    cargo build --release, then the image; prints IMAGE=<ref> and TAR=<oci archive>
#   hack/image.sh pause    the pod sandbox image (hack/tools/pause, static Go); prints IMAGE= and TAR=
#   hack/image.sh probe    the network tests' pod image (hack/tools/probe, static Go, runs as root for
#                          ICMP); prints IMAGE= and TAR=
#   hack/image.sh flanneld flannel's DaemonSet image: flanneld, its CNI plugin and iptables (hack/image/
#                          flanneld.sh says what and why); prints IMAGE= and TAR=
#   hack/image.sh check    the built image's entrypoint, user, exposed ports and binary path equal the
#                          Dockerfile's (builds the image first if there is none); exits 1 naming a difference
#
# The tag is the crate version plus the binary's SHA-256 prefix, so a rebuilt binary is a new image and
# pods never run a stale one under an old name. Import with `hack/cluster.sh load TAR IMAGE`.
#
# Environment: NETCM_CACHE_DIR (as hack/controlplane.sh: the pause binary is cached there),
#              NETCM_IMAGE_OUT (default <checkout>/_out/image), CARGO_TARGET_DIR (cargo's, default
#              <checkout>/target; hack/supply-chain.sh reproducible builds in two clean ones).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${NETCM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/netcm}
out=${NETCM_IMAGE_OUT:-$root/_out/image}

# What the image is; `check` compares these, as built, with the Dockerfile's final stage.
REPOSITORY=localhost/netcm
BINARY=/usr/local/bin/netcm
IMAGE_USER=65532:65532
PORTS=(10271/tcp)
# distroless's environment and working directory (netcm's allocator settings are compiled in:
# .cargo/config.toml).
IMAGE_ENV=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt)
WORKDIR=/home/nonroot

# log, die and need; they read $tag, so an image's tag is never a variable named tag here.
tag=image
# shellcheck source=hack/lib.sh
source "$root/hack/lib.sh"

# add_file ROOTFS SRC DEST [MODE]: copies SRC to ROOTFS/DEST, resolving symlinks (the image has no others).
add_file() {
  install -D -m "${4:-0644}" "$2" "$1$3"
}

# add_libs ROOTFS BINARY: the shared libraries BINARY loads, at the paths the loader looks for them.
add_libs() {
  local rootfs=$1 bin=$2 lib
  # ldd prints "name => /path (addr)" and, for the loader, "/lib64/ld-linux-x86-64.so.2 (addr)".
  for lib in $(ldd "$bin" | awk '/=> \//{print $3} /^\t\//{print $1}'); do
    add_file "$rootfs" "$lib" "$lib" 0755
  done
}

# distroless's accounts (base-files of distroless: root, nobody, nonroot) and writable directories.
add_base() {
  local rootfs=$1
  mkdir -p "$rootfs/etc" "$rootfs/tmp" "$rootfs/home/nonroot"
  chmod 1777 "$rootfs/tmp"
  chown 65532:65532 "$rootfs/home/nonroot"
  chmod 0700 "$rootfs/home/nonroot"
  cat >"$rootfs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
  cat >"$rootfs/etc/group" <<'EOF'
root:x:0:
nobody:x:65534:
tty:x:5:
staff:x:50:
nonroot:x:65532:
EOF
  if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
    add_file "$rootfs" /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
  fi
}

# oci_image NAME TAG ROOTFS [umoci config args…]: an OCI layout with one layer made from ROOTFS, archived
# for `ctr images import`. The layer tar keeps the owners staged in ROOTFS (root, and 65532 for its home)
# and fixes order and times, so equal inputs give equal digests.
oci_image() {
  local name=$1 image_tag=$2 rootfs=$3 dir=$out/$1
  shift 3
  rm -rf "$dir" "$out/$name.layer.tar" "$out/$name.tar"
  tar --sort=name --mtime=@0 --numeric-owner --pax-option=delete=atime,delete=ctime \
    -C "$rootfs" -cf "$out/$name.layer.tar" .
  umoci init --layout "$dir"
  umoci new --image "$dir:$image_tag"
  umoci raw add-layer --image "$dir:$image_tag" --history.created 1970-01-01T00:00:00Z --history.created_by "hack/image.sh" "$out/$name.layer.tar"
  umoci config --image "$dir:$image_tag" --no-history --os linux --architecture amd64 --created 1970-01-01T00:00:00Z "$@"
  umoci gc --layout "$dir"
  tar -C "$dir" -cf "$out/$name.tar" .
  rm -f "$out/$name.layer.tar"
}

cmd_build() {
  need cargo ldd umoci tar sha256sum install
  mkdir -p "$out"
  log "cargo build --release -p netcm"
  (cd "$root" && cargo build --release --locked -p netcm --bin netcm)
  local bin=${CARGO_TARGET_DIR:-$root/target}/release/netcm version sum image_tag rootfs=$out/netcm.rootfs
  version=$("$bin" --version | awk '{print $NF}')
  sum=$(sha256sum "$bin" | cut -c1-12)
  image_tag=$version-$sum
  rm -rf "$rootfs"
  mkdir -p "$rootfs"
  add_base "$rootfs"
  add_file "$rootfs" "$bin" "$BINARY" 0755
  add_libs "$rootfs" "$bin"
  # Labels as the Dockerfile sets them.
  local labels=() env=() ports=() l
  while IFS= read -r l; do labels+=(--config.label "$l"); done < <(dockerfile_labels)
  for l in "${IMAGE_ENV[@]}"; do env+=(--config.env "$l"); done
  for l in "${PORTS[@]}"; do ports+=(--config.exposedports "$l"); done
  oci_image netcm "$image_tag" "$rootfs" \
    --config.entrypoint "$BINARY" --config.user "$IMAGE_USER" --config.workingdir "$WORKDIR" \
    "${env[@]}" "${ports[@]}" "${labels[@]}"
  rm -rf "$rootfs"
  echo "$image_tag" >"$out/netcm.tag"
  # Which commit the image is (hack/supply-chain.sh reproducible compares only an image of HEAD).
  git -C "$root" rev-parse HEAD >"$out/netcm.commit"
  log "built $REPOSITORY:$image_tag ($(du -h "$out/netcm.tar" | cut -f1))"
  echo "IMAGE=$REPOSITORY:$image_tag"
  echo "TAR=$out/netcm.tar"
}

# static_go_image NAME USER: hack/tools/NAME (one static Go program, cached by its sources) as the image
# localhost/NAME whose entrypoint is /NAME.
static_go_image() {
  local name=$1 user=$2
  need go umoci tar sha256sum
  mkdir -p "$out" "$cache"
  local src=$root/hack/tools/$name key bin rootfs=$out/$name.rootfs
  key=$(cat "$src/go.mod" "$src/main.go" | sha256sum | cut -c1-12)
  bin=$cache/$name-$key/$name
  if [ ! -x "$bin" ]; then
    log "building the $name binary (hack/tools/$name)"
    mkdir -p "$(dirname "$bin")"
    (cd "$src" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$bin.tmp" .)
    mv "$bin.tmp" "$bin"
  fi
  rm -rf "$rootfs"
  mkdir -p "$rootfs"
  add_file "$rootfs" "$bin" "/$name" 0755
  oci_image "$name" "$key" "$rootfs" --config.entrypoint "/$name" --config.user "$user"
  rm -rf "$rootfs"
  echo "IMAGE=localhost/$name:$key"
  echo "TAR=$out/$name.tar"
}

cmd_pause() { static_go_image pause 65535:65535; }

cmd_probe() { static_go_image probe 0:0; }

# The final stage of the Dockerfile, as KEY<TAB>VALUE lines: ENTRYPOINT, USER, EXPOSE, COPY (destination),
# LABEL, ENV (hack/image/dockerfile.py, with its tests).
dockerfile_final() { python3 "$root/hack/image/dockerfile.py" "$root/Dockerfile"; }

dockerfile_labels() { dockerfile_final | awk -F'\t' '$1=="LABEL"{print $2}'; }

# The built image's config, as the same KEY<TAB>VALUE lines (COPY: the entrypoint's file, if present;
# hack/image/oci.py, with its tests).
image_final() { python3 "$root/hack/image/oci.py" config "$out/netcm" "$(cat "$out/netcm.tag")"; }

cmd_check() {
  need python3
  [ -f "$out/netcm.tag" ] && [ -d "$out/netcm" ] || cmd_build >/dev/null
  local want got
  want=$(dockerfile_final | sort)
  got=$(image_final | sort)
  if [ "$want" != "$got" ]; then
    diff <(echo "$want") <(echo "$got") | sed 's/^</  Dockerfile:/; s/^>/  image:     /' >&2 || true
    die "the image built by hack/image.sh and the Dockerfile differ (above): change both together"
  fi
  log "ok: the image and the Dockerfile agree on entrypoint, user, exposed ports, binary path, labels and env:"
  echo "$got" | sed 's/^/[image]   /' >&2
}

case "${1:-}" in
  build) cmd_build ;;
  pause) cmd_pause ;;
  probe) cmd_probe ;;
  flanneld) source "$root/hack/versions.env"; source "$root/hack/image/flanneld.sh"; cmd_flanneld ;;
  check) cmd_check ;;
  *) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
