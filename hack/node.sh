#!/usr/bin/env bash
# A real single-node Kubernetes cluster on this machine, so netcm runs as users run it: as pods installed by
# its Helm chart, with `kubectl logs`, Services and kube-proxy. What it starts:
#   - a control plane of its own (hack/controlplane.sh in node mode, state in <state>/controlplane): etcd and
#     kube-apiserver served on the node address NODE_ADDRESS, which pods reach through the `kubernetes` Service;
#   - kube-controller-manager (every controller, but not netcm's jobs: --allocate-node-cidrs=false, no cloud
#     routes) and kube-scheduler;
#   - containerd + runc + CNI bridge/host-local from Debian's packages (hack/install-prereqs.sh), with a
#     pause image built here (hack/image.sh pause); kubelet and kube-proxy (iptables mode).
# Kubernetes binaries come from the k8s.io/kubernetes module, stamped and cached like the control plane's.
#
#   hack/node.sh up          start (building what is not cached); last line: KUBECONFIG=<path>
#   hack/node.sh down        stop everything `up` started and undo every machine-wide change it recorded
#   hack/node.sh load TAR IMAGE   import an OCI archive (hack/image.sh) into the node's containerd as IMAGE
#   hack/node.sh reregister  delete the Node object and restart kubelet, which registers a new one
#   hack/node.sh env         the node's facts as shell assignments (names, addresses, ranges, paths)
#
# One node per machine: kubelet's ports (10248-10250), kube-proxy's (10249, 10256), sysctls, iptables and
# cgroups are machine-wide. `up` takes the machine lock $NODE_RUN/lock and records every machine-wide change
# in $NODE_RUN before making it; `down` (from any checkout) undoes what the record names and reports anything
# else that differs from the snapshot taken at `up`. A node left by a crash is cleaned by `down`.
#
# Addresses (all in 198.18.0.0/15, never routed off the machine; pods may reach only this host):
#   198.19.255.1/32  NODE_ADDRESS, on the link ncm-node0 made for it (kube-apiserver, kubelet, InternalIP)
#   198.19.0.0/24    pod IPs handed out by the CNI bridge ncm-cni0 (a static range: netcm, which allocates
#                    pod CIDRs, runs as a pod itself and so cannot be what gives pods their addresses here)
#   198.19.16.0/24   Service ClusterIPs
#   198.18.0.0/16    free for netcm's --cluster-cidr in tests (the Node's spec.podCIDR comes from there)
#
# Environment: NETCM_CACHE_DIR (as hack/controlplane.sh), NETCM_NODE_DIR (state, logs; default
#              <checkout>/_out/node).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=hack/versions.env
source "$root/hack/versions.env"

state=${NETCM_NODE_DIR:-$root/_out/node}
NODE_RUN=/run/netcm-node
NODE_NAME=netcm-node
NODE_ADDRESS=198.19.255.1
NODE_LINK=ncm-node0
CNI_BRIDGE=ncm-cni0
POD_RANGE=198.19.0.0/24
SERVICE_CIDR=198.19.16.0/24
FREE_CLUSTER_CIDR=198.18.0.0/16
# The sysctls kubelet, kube-proxy and the bridge plugin are known to set.
SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys
  kernel.keys.root_maxbytes net.ipv4.ip_forward net.ipv4.conf.all.forwarding net.ipv6.conf.all.forwarding
  net.ipv4.conf.all.route_localnet net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables
  net.netfilter.nf_conntrack_max net.netfilter.nf_conntrack_tcp_timeout_established
  net.netfilter.nf_conntrack_tcp_timeout_close_wait net.netfilter.nf_conntrack_tcp_be_liberal)
# Paths outside the state dir that the components create whatever their flags say; removed on `down` if
# `up` found them absent.
MACHINE_DIRS=(/var/lib/kubelet /var/log/pods /var/log/containers /var/lib/cni /etc/cni /opt/cni /run/containerd
  /var/lib/containerd /opt/containerd /usr/libexec/kubernetes /etc/kubernetes /var/run/kubernetes /run/flannel)
# The pods' way out: anything from the pod bridge that is not for another pod stays on this host.
FORWARD_RULE=(FORWARD -i "$CNI_BRIDGE" ! -o "$CNI_BRIDGE" -m comment --comment "netcm-node: pods stay on this host" -j DROP)

cp_state=$state/controlplane
pki=$state/pki
sock=$state/containerd/containerd.sock

log() { printf '[node] %s\n' "$*" >&2; }
die() { printf '[node] error: %s\n' "$*" >&2; exit 1; }

need() {
  local missing=()
  for tool in "$@"; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
  [ ${#missing[@]} -eq 0 ] || die "missing tools: ${missing[*]} (hack/install-prereqs.sh installs them)"
}

controlplane() {
  8>&- 9>&- NETCM_CONTROLPLANE_DIR=$cp_state NETCM_NODE_MODE=1 NETCM_API_HOST=$NODE_ADDRESS NETCM_SERVICE_CIDR=$SERVICE_CIDR \
    bash "$root/hack/controlplane.sh" "$@"
}

bin() { controlplane bin "$1"; }

alive() { [ -f "$state/$1.pid" ] && kill -0 "$(cat "$state/$1.pid")" 2>/dev/null; }

# start NAME COMMAND…: a daemon in its own session, its output in <state>/NAME.log.
start() {
  local name=$1
  shift
  # Without the lock's descriptors: a daemon holding them would hold the machine lock for its lifetime.
  setsid nohup "$@" >>"$state/$name.log" 2>&1 </dev/null 8>&- 9>&- &
  echo $! >"$state/$name.pid"
}

# stop NAME [GRACE]: SIGTERM, then SIGKILL after GRACE seconds.
stop() {
  local name=$1 grace=${2:-5} pid i
  [ -f "$state/$name.pid" ] || return 0
  pid=$(cat "$state/$name.pid")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 $((grace * 10))); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  fi
  rm -f "$state/$name.pid"
}

# --- the record of machine-wide changes --------------------------------------------------------------------

record() { echo "$*" >>"$NODE_RUN/record"; }

snapshot() {
  local key v
  : >"$NODE_RUN/record"
  record "owner $state"
  for key in "${SYSCTLS[@]}"; do
    if v=$(sysctl -n "$key" 2>/dev/null); then record "sysctl $key $v"; fi
  done
  sysctl -a 2>/dev/null | sort >"$NODE_RUN/sysctl.before" || true
  iptables-save 2>/dev/null | grep -v '^#' | sed 's/\[[0-9]*:[0-9]*\]//' >"$NODE_RUN/iptables.before" || true
  ip6tables-save 2>/dev/null | grep -v '^#' | sed 's/\[[0-9]*:[0-9]*\]//' >"$NODE_RUN/ip6tables.before" || true
  ls /run/netns 2>/dev/null | sort >"$NODE_RUN/netns.before" || true
  find /sys/fs/cgroup -mindepth 2 -maxdepth 2 -type d | sort >"$NODE_RUN/cgroups.before"
  local d
  for d in "${MACHINE_DIRS[@]}"; do [ -e "$d" ] || record "dir $d"; done
  [ -d /run/netns ] || record "dir /run/netns"
}

# --- certificates and kubeconfigs for the node's components -----------------------------------------------

# cert NAME SUBJECT EXT: a key pair signed by the control plane's CA.
cert() {
  local name=$1 subject=$2 ext=$3 ca=$cp_state/pki
  [ -f "$pki/$name.crt" ] && return 0
  echo "$ext" >"$pki/$name.ext"
  openssl req -newkey rsa:2048 -nodes -keyout "$pki/$name.key" -out "$pki/$name.csr" -subj "$subject" 2>/dev/null
  openssl x509 -req -in "$pki/$name.csr" -CA "$ca/ca.crt" -CAkey "$ca/ca.key" -CAcreateserial -days 3650 \
    -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
}

# kubeconfig NAME: <state>/NAME.kubeconfig with NAME's client certificate.
kubeconfig() {
  local name=$1
  # shellcheck source=/dev/null
  source "$cp_state/env"
  cat >"$state/$name.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: netcm-node
    cluster:
      server: https://$NODE_ADDRESS:$APISERVER_PORT
      certificate-authority: $cp_state/pki/ca.crt
users:
  - name: $name
    user:
      client-certificate: $pki/$name.crt
      client-key: $pki/$name.key
contexts:
  - name: netcm-node
    context: {cluster: netcm-node, user: $name}
current-context: netcm-node
EOF
}

make_certs() {
  mkdir -p "$pki"
  local client="extendedKeyUsage=clientAuth"
  cert kube-controller-manager "/CN=system:kube-controller-manager" "$client"
  cert kube-scheduler "/CN=system:kube-scheduler" "$client"
  cert kube-proxy "/CN=system:kube-proxy" "$client"
  cert kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" "$client"
  cert kubelet-serving "/CN=$NODE_NAME" "subjectAltName=IP:$NODE_ADDRESS,DNS:$NODE_NAME
extendedKeyUsage=serverAuth"
  local c
  for c in kube-controller-manager kube-scheduler kube-proxy kubelet; do kubeconfig "$c"; done
}

# --- the runtime -----------------------------------------------------------------------------------------

write_runtime_config() {
  local pause_image=$1
  mkdir -p "$state/containerd" "$state/cni/net.d" "$state/cni/ipam"
  cat >"$state/cni/net.d/10-netcm-node.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "netcm-node",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$CNI_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$state/cni/ipam",
        "ranges": [[{"subnet": "$POD_RANGE"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}, "snat": false}
  ]
}
EOF
  cat >"$state/containerd/config.toml" <<EOF
version = 2
root = "$state/containerd/root"
state = "$state/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "$sock"

[ttrpc]
  address = "$state/containerd/ttrpc.sock"

[debug]
  address = ""

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "$state/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause_image"
  # Without it every sandbox fails ("can't get final child's PID from pipe"): root here lacks
  # CAP_SYS_RESOURCE to lower oom_score_adj.
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = "$state/containerd/runc"

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "$state/cni/net.d"
  max_conf_num = 1
EOF
}

write_kubelet_config() {
  mkdir -p "$state/kubelet" "$state/pod-logs" "$state/volume-plugins"
  cat >"$state/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroup v1 on this machine: kubelet 1.35+ refuses it unless told otherwise.
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$sock
failSwapOn: false
address: $NODE_ADDRESS
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $pki/kubelet-serving.crt
tlsPrivateKeyFile: $pki/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $cp_state/pki/ca.crt}
authorization:
  mode: Webhook
podLogsDir: $state/pod-logs
volumePluginDir: $state/volume-plugins
# A shared machine whose disk others fill: evict (and reclaim images, which would take the ones imported by
# hack/node.sh load: pods use imagePullPolicy Never) only when it is all but full. Percentages of a large
# disk would be gigabytes.
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "100Mi"
  nodefs.inodesFree: "1%"
  imagefs.available: "100Mi"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
maxPods: 30
serializeImagePulls: false
EOF
}

# --- up --------------------------------------------------------------------------------------------------

wait_ready() { # WHAT SECONDS COMMAND…
  local what=$1 secs=$2 i
  shift 2
  for i in $(seq 1 $((secs * 5))); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  die "$what not ready after ${secs}s (logs in $state)"
}

# A recorded owner none of whose daemons still runs (its session was killed, the machine restarted): its
# node is abandoned, and the record alone lets any checkout undo it. A pid counts only while it is still the
# daemon it names, since pids are reused after a restart.
owner_abandoned() { # OWNER
  local f pid
  for f in "$1"/*.pid "$1"/controlplane/*.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f" 2>/dev/null) || continue
    [ -r "/proc/$pid/cmdline" ] || continue
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "$(basename "$f" .pid)" && return 1
  done
  return 0
}

components_alive() {
  local c
  for c in containerd kubelet kube-proxy kube-controller-manager kube-scheduler; do alive "$c" || return 1; done
}

cmd_up() {
  need containerd containerd-shim-runc-v2 runc ctr iptables iptables-save ip6tables-save ip sysctl openssl \
    curl python3 flock setsid
  local p
  for p in bridge host-local loopback portmap; do
    [ -x "/usr/lib/cni/$p" ] || die "CNI plugin /usr/lib/cni/$p missing (hack/install-prereqs.sh installs it)"
  done
  [ "$(id -u)" -eq 0 ] || die "a real node needs root"
  local started=$SECONDS
  mkdir -p "$state" "$NODE_RUN"
  state=$(cd "$state" && pwd)
  # Build (or find cached) everything before touching the machine.
  local b kube_proxy kcm scheduler kubectl pause_image pause_tar
  for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl etcd; do bin "$b" >/dev/null; done
  kube_proxy=$(bin kube-proxy) kcm=$(bin kube-controller-manager)
  scheduler=$(bin kube-scheduler) kubectl=$(bin kubectl)
  local out
  out=$(NETCM_IMAGE_OUT=$state/images bash "$root/hack/image.sh" pause)
  pause_image=$(echo "$out" | sed -n 's/^IMAGE=//p') pause_tar=$(echo "$out" | sed -n 's/^TAR=//p')

  exec 9>"$NODE_RUN/lock"
  flock -w 30 9 || die "another hack/node.sh up/down holds $NODE_RUN/lock"
  if [ -f "$NODE_RUN/record" ]; then
    local owner
    owner=$(sed -n 's/^owner //p' "$NODE_RUN/record")
    if [ "$owner" != "$state" ]; then
      owner_abandoned "$owner" ||
        die "the real node of this machine belongs to $owner: stop it with 'NETCM_NODE_DIR=$owner hack/node.sh down' (any checkout)"
      log "the real node of $owner is abandoned (none of its daemons runs): undoing it first"
    elif components_alive && controlplane env >/dev/null 2>&1; then
      log "reusing the running node"
      echo "KUBECONFIG=$cp_state/kubeconfig"
      return 0
    else
      log "a node of this state dir is partly up (crashed?): cleaning it first"
    fi
    flock -u 9
    # In a subshell: down points the state dir at the record's owner, which may be another checkout's.
    (cmd_down) || die "could not undo the node recorded in $NODE_RUN/record"
    flock -w 30 9 || die "could not take $NODE_RUN/lock again"
  fi
  log "recording the machine's state in $NODE_RUN (down restores it)"
  snapshot

  # The node address: on a link of its own, so `down` removes it with the link.
  record "link $NODE_LINK"
  ip link add "$NODE_LINK" type bridge
  ip addr add "$NODE_ADDRESS/32" dev "$NODE_LINK"
  ip link set "$NODE_LINK" up
  record "link $CNI_BRIDGE"
  record "forward-rule"
  iptables -I "${FORWARD_RULE[@]}"

  local t=$SECONDS
  controlplane up | tail -1 >/dev/null
  log "control plane up in $((SECONDS - t))s"
  make_certs
  # shellcheck source=/dev/null
  source "$cp_state/env"

  start kube-controller-manager "$kcm" \
    --kubeconfig "$state/kube-controller-manager.kubeconfig" \
    --authentication-kubeconfig "$state/kube-controller-manager.kubeconfig" \
    --authorization-kubeconfig "$state/kube-controller-manager.kubeconfig" \
    --controllers '*' \
    --allocate-node-cidrs=false \
    --configure-cloud-routes=false \
    --use-service-account-credentials=true \
    --root-ca-file "$cp_state/pki/ca.crt" \
    --service-account-private-key-file "$cp_state/pki/sa.key" \
    --cluster-signing-cert-file "$cp_state/pki/ca.crt" \
    --cluster-signing-key-file "$cp_state/pki/ca.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --leader-elect=false \
    --bind-address 127.0.0.1 --secure-port "$(free_port)"
  start kube-scheduler "$scheduler" \
    --kubeconfig "$state/kube-scheduler.kubeconfig" \
    --authentication-kubeconfig "$state/kube-scheduler.kubeconfig" \
    --authorization-kubeconfig "$state/kube-scheduler.kubeconfig" \
    --leader-elect=false \
    --bind-address 127.0.0.1 --secure-port "$(free_port)"

  write_runtime_config "$pause_image"
  start containerd containerd --config "$state/containerd/config.toml"
  wait_ready containerd 30 ctr --address "$sock" version
  load "$pause_tar" "$pause_image"

  write_kubelet_config
  t=$SECONDS
  start_kubelet
  start kube-proxy "$kube_proxy" \
    --kubeconfig "$state/kube-proxy.kubeconfig" \
    --hostname-override "$NODE_NAME" \
    --proxy-mode iptables \
    --cluster-cidr "$POD_RANGE" \
    --nodeport-addresses "$NODE_ADDRESS/32" \
    --iptables-localhost-nodeports=false \
    --conntrack-max-per-core 0 \
    --conntrack-tcp-timeout-established 0s \
    --conntrack-tcp-timeout-close-wait 0s \
    --metrics-bind-address 127.0.0.1:10249 \
    --healthz-bind-address 127.0.0.1:10256
  local k=("$kubectl" --kubeconfig "$cp_state/kubeconfig")
  wait_ready "the Node $NODE_NAME" 120 "${k[@]}" wait --for=condition=Ready --timeout=1s "node/$NODE_NAME"
  log "node Ready $((SECONDS - t))s after kubelet started"
  # Pods need their namespace's ServiceAccount and the cluster CA (kube-controller-manager makes both).
  wait_ready "the default ServiceAccount" 60 "${k[@]}" -n default get serviceaccount default
  wait_ready "kube-root-ca.crt" 60 "${k[@]}" -n kube-system get configmap kube-root-ca.crt
  wait_ready "kube-proxy's rules" 60 curl -sf http://127.0.0.1:10256/healthz
  components_alive || die "a component exited; see the logs in $state"
  log "up in $((SECONDS - started))s: Node $NODE_NAME at $NODE_ADDRESS, pods from $POD_RANGE, Services from $SERVICE_CIDR"
  echo "KUBECONFIG=$cp_state/kubeconfig"
}

start_kubelet() {
  start kubelet "$(bin kubelet)" \
    --config "$state/kubelet-config.yaml" \
    --kubeconfig "$state/kubelet.kubeconfig" \
    --root-dir "$state/kubelet" \
    --hostname-override "$NODE_NAME" \
    --node-ip "$NODE_ADDRESS"
}

# A new Node object for the running kubelet (kubelet registers only when it starts): for tests that need
# a Node as it first joins, e.g. without a pod CIDR yet. Pods bound to the old Node are deleted with it.
cmd_reregister() {
  alive kubelet || die "the node is not up: hack/node.sh up"
  local kubectl t=$SECONDS
  kubectl=$(bin kubectl)
  local k=("$kubectl" --kubeconfig "$cp_state/kubeconfig")
  "${k[@]}" delete node "$NODE_NAME" --ignore-not-found --wait=true >/dev/null
  stop kubelet 10
  start_kubelet
  wait_ready "the re-registered Node $NODE_NAME" 120 "${k[@]}" wait --for=condition=Ready --timeout=1s "node/$NODE_NAME"
  log "Node $NODE_NAME registered anew and Ready in $((SECONDS - t))s"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

load() { # TAR IMAGE
  local tar=$1 image=$2
  [ -S "$sock" ] || die "the node's containerd is not running ($sock): hack/node.sh up"
  [ -f "$tar" ] || die "no such archive: $tar"
  # The archive's reference is the tag alone (umoci); --base-name makes it IMAGE's repository:tag.
  ctr --address "$sock" -n k8s.io images import --base-name "${image%:*}" "$tar" >/dev/null
  # Listed first, then searched: `grep -q` in a pipe would end ctr with SIGPIPE, failing the pipeline.
  local images
  images=$(ctr --address "$sock" -n k8s.io images ls -q)
  grep -qx "$image" <<<"$images" || die "imported $tar, but containerd has no image $image"
  log "imported $image"
}

# --- down ------------------------------------------------------------------------------------------------

# The processes the runtime left: shims and containers of our containerd (their command line names our
# state dir), which outlive containerd by design.
leftover_pids() {
  local p
  for p in /proc/[0-9]*; do
    if tr '\0' ' ' 2>/dev/null <"$p/cmdline" | grep -q -- "$state/containerd"; then echo "${p#/proc/}"; fi
  done
}

# The processes of pods: whatever runs in the cgroups kubelet made (/kubepods…), in any hierarchy.
pod_pids() {
  [ -f "$NODE_RUN/cgroups.before" ] || return 0
  local cg
  # Not the cgroup roots of hack/cluster.sh's nodes (/ncm-n*), which may run beside this node.
  for cg in $(find /sys/fs/cgroup -mindepth 2 -maxdepth 2 -type d ! -name 'ncm-n*' | sort | comm -13 "$NODE_RUN/cgroups.before" -); do
    find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null
  done | sort -u
}

cleanup_iptables() { # CMD SAVE BEFORE
  local cmd=$1 save=$2 before=$3 table line chain
  [ -f "$before" ] || return 0
  command -v "$save" >/dev/null 2>&1 || return 0
  local now
  now=$("$save" 2>/dev/null | grep -v '^#' | sed 's/\[[0-9]*:[0-9]*\]//' || true)
  # Rules that were not there at `up` and that belong to Kubernetes or CNI: delete them, then their chains.
  table=
  while IFS= read -r line; do
    case "$line" in
      \*) ;;
      \**) table=${line#\*} ;;
      -A*)
        if ! grep -qxF -- "$line" "$before" && [[ "$line" == *KUBE-* || "$line" == *CNI-* || "$line" == *netcm-node* ]]; then
          eval "$cmd -t $table -D ${line#-A }" 2>/dev/null || true
        fi
        ;;
    esac
  done <<<"$now"
  table=
  while IFS= read -r line; do
    case "$line" in
      \**) table=${line#\*} ;;
      :KUBE-* | :CNI-*)
        chain=${line#:}
        chain=${chain%% *}
        if ! grep -q "^:$chain " "$before"; then
          "$cmd" -t "$table" -F "$chain" 2>/dev/null || true
          "$cmd" -t "$table" -X "$chain" 2>/dev/null || true
        fi
        ;;
    esac
  done <<<"$now"
  # Tables that did not exist before (iptables-nft makes them on first use): gone once nothing is left in
  # them but their empty built-in chains.
  local family=ip
  [ "$cmd" = ip6tables ] && family=ip6
  now=$("$save" 2>/dev/null | grep -v '^#' | sed 's/\[[0-9]*:[0-9]*\]//' || true)
  for table in $(echo "$now" | sed -n 's/^\*//p'); do
    grep -qx "\*$table" "$before" && continue
    if ! echo "$now" | awk -v t="*$table" '$0==t{on=1;next} /^\*/{on=0} on' | grep -qE '^-A|^:[^ ]+ - '; then
      nft delete table "$family" "$table" 2>/dev/null || true
    fi
  done
}

cmd_down() {
  mkdir -p "$NODE_RUN"
  exec 8>"$NODE_RUN/lock"
  flock -w 60 8 || die "another hack/node.sh up/down holds $NODE_RUN/lock"
  if [ -f "$NODE_RUN/record" ]; then
    local owner
    owner=$(sed -n 's/^owner //p' "$NODE_RUN/record")
    # Another checkout's node is not ours to stop (its tests may be running): say how, do nothing.
    if [ -n "$owner" ] && [ "$owner" != "$(cd "$state" 2>/dev/null && pwd || echo "$state")" ] &&
      ! owner_abandoned "$owner"; then
      die "the real node of this machine belongs to $owner: 'NETCM_NODE_DIR=$owner hack/node.sh down' stops it"
    fi
  elif [ ! -d "$state" ]; then
    log "nothing to stop"
    return 0
  fi
  # The state dir may be gone (a removed checkout): the record alone is enough to undo the machine.
  state=${owner:-$state}
  cp_state=$state/controlplane
  sock=$state/containerd/containerd.sock

  # Pods first, through the API while it answers, so kubelet tears their sandboxes down (CNI DEL).
  stop kube-controller-manager 3
  stop kube-scheduler 3
  local kubectl
  kubectl=$(bin kubectl 2>/dev/null || true)
  if alive kubelet && [ -n "$kubectl" ] && [ -f "$cp_state/kubeconfig" ]; then
    timeout 20 "$kubectl" --kubeconfig "$cp_state/kubeconfig" delete pods --all-namespaces --all \
      --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
    local i
    for i in $(seq 1 100); do
      [ -z "$(ctr --address "$sock" -n k8s.io tasks ls -q 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
  stop kubelet 5
  stop kube-proxy 3
  # What is still running in the runtime: killed, then removed.
  if [ -S "$sock" ]; then
    local id
    for id in $(ctr --address "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr --address "$sock" -n k8s.io tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
    done
    sleep 0.5
    for id in $(ctr --address "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
      ctr --address "$sock" -n k8s.io tasks delete -f "$id" >/dev/null 2>&1 || true
    done
  fi
  stop containerd 5
  local pid
  for pid in $(leftover_pids) $(pod_pids); do kill -KILL "$pid" 2>/dev/null || true; done
  # kube-proxy's own cleanup of its iptables chains, then anything it or CNI left.
  local kube_proxy
  kube_proxy=$(bin kube-proxy 2>/dev/null || true)
  [ -z "$kube_proxy" ] || timeout 30 "$kube_proxy" --cleanup >/dev/null 2>&1 || true
  cleanup_iptables iptables iptables-save "$NODE_RUN/iptables.before"
  cleanup_iptables ip6tables ip6tables-save "$NODE_RUN/ip6tables.before"
  controlplane down >/dev/null 2>&1 || true

  # Mounts under the state dir (container rootfs, shm, secrets), deepest first.
  local m
  for m in $(awk '{print $5}' /proc/self/mountinfo | grep -F "$state/" | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  # Network namespaces the runtime made.
  local ns
  for ns in $(ls /run/netns 2>/dev/null); do
    if ! grep -qxF "$ns" "$NODE_RUN/netns.before" 2>/dev/null && [[ "$ns" == cni-* ]]; then
      ip netns delete "$ns" 2>/dev/null || true
    fi
  done
  # Cgroups kubelet and the runtime made (kubepods…), deepest first.
  if [ -f "$NODE_RUN/cgroups.before" ]; then
    local cg
    for cg in $(find /sys/fs/cgroup -mindepth 2 -maxdepth 2 -type d ! -name 'ncm-n*' | sort); do
      grep -qxF "$cg" "$NODE_RUN/cgroups.before" && continue
      find "$cg" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    done
  fi
  if [ -f "$NODE_RUN/record" ]; then
    local kind a b rest
    while read -r kind a b rest; do
      case "$kind" in
        sysctl) sysctl -qw "$a=$b${rest:+ $rest}" >/dev/null 2>&1 || log "could not restore $a=$b $rest" ;;
        link) ip link del "$a" 2>/dev/null || true ;;
        forward-rule) while iptables -D "${FORWARD_RULE[@]}" 2>/dev/null; do :; done ;;
        dir)
          if [ -e "$a" ]; then
            for m in $(awk '{print $5}' /proc/self/mountinfo | grep -F "$a" | sort -r); do umount -l "$m" 2>/dev/null || true; done
            rm -rf "$a"
          fi
          ;;
      esac
    done <"$NODE_RUN/record"
    report_leftovers
    rm -f "$NODE_RUN/record" "$NODE_RUN"/*.before
  fi
  # The runtime's files (root-owned snapshots) and the cluster's data, so the next `up` is a new cluster;
  # not the logs.
  rm -rf "$state/containerd" "$state/kubelet" "$state/cni/ipam" "$cp_state/etcd-data"
  log "stopped; the machine is as it was before 'up'"
}

# Anything else that differs from the snapshot: reported, not touched (it may be someone else's).
report_leftovers() {
  local diff
  if [ -f "$NODE_RUN/sysctl.before" ]; then
    diff=$(comm -13 "$NODE_RUN/sysctl.before" <(sysctl -a 2>/dev/null | sort) \
      | grep -vE '^(fs\.(dentry-state|file-nr|inode-nr|inode-state|quota)|kernel\.(random|ns_last_pid|pty\.nr|sched_domain|tainted|perf_event)|net\.netfilter\.nf_conntrack_count|net\.ipv[46]\.(conf|neigh)\.(veth|ncm-|cni)|net\.ipv6\.route\.|net\.ipv4\.route\.|vm\.(nr_|stat)|kernel\.(keys\.(maxkeys|maxbytes)|msg|sem|shm)|fs\.(aio-nr|binfmt|epoll|mqueue))' || true)
    [ -z "$diff" ] || log "sysctls that differ from before 'up' (not restored: not known to be ours): $(echo "$diff" | tr '\n' ';')"
  fi
  local t now
  for t in iptables ip6tables; do
    [ -f "$NODE_RUN/$t.before" ] || continue
    now=$("$t-save" 2>/dev/null | grep -v '^#' | sed 's/\[[0-9]*:[0-9]*\]//' | grep -E '^-A|^:' || true)
    diff=$(comm -13 <(grep -E '^-A|^:' "$NODE_RUN/$t.before" | sort) <(echo "$now" | sort) | grep -v '^$' || true)
    [ -z "$diff" ] || log "$t entries not there before 'up': $(echo "$diff" | tr '\n' ';')"
  done
}

cmd_env() {
  cat <<EOF
NODE_NAME=$NODE_NAME
NODE_ADDRESS=$NODE_ADDRESS
POD_RANGE=$POD_RANGE
SERVICE_CIDR=$SERVICE_CIDR
FREE_CLUSTER_CIDR=$FREE_CLUSTER_CIDR
STATE_DIR=$state
KUBECONFIG=$cp_state/kubeconfig
CONTAINERD_SOCKET=$sock
EOF
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  load) [ $# -eq 3 ] || die "usage: hack/node.sh load TAR IMAGE"; load "$2" "$3" ;;
  reregister) cmd_reregister ;;
  env) cmd_env ;;
  *) sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
