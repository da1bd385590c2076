#!/usr/bin/env bash
# A real Kubernetes control plane (etcd + kube-apiserver) on 127.0.0.1 for netcm's tests and local runs.
# hack/node.sh starts one of its own, for a real node, with NETCM_NODE_MODE=1 (see Environment).
#
#   hack/controlplane.sh up                 build (if not cached) and start; last line: KUBECONFIG=<path>
#   hack/controlplane.sh down               stop what `up` started
#   hack/controlplane.sh restart-apiserver  stop and start kube-apiserver, keeping data
#   hack/controlplane.sh restart-etcd       stop and start etcd, keeping data
#   hack/controlplane.sh rotate-serving-cert
#                                           a new serving key and certificate from the same CA, then
#                                           restart-apiserver; prints the new certificate's serial
#   hack/controlplane.sh stop-apiserver     stop kube-apiserver only (start it again with start-apiserver)
#   hack/controlplane.sh start-apiserver    start a stopped kube-apiserver with the same flags and ports
#   hack/controlplane.sh start-apiserver2 [FLAG...]
#                                           start a second kube-apiserver on the same etcd (own port, audit2.log,
#                                           kubeconfig2, same certificates and keys, FLAGs appended, e.g.
#                                           --feature-gates=WatchList=false); last line: KUBECONFIG=<path>
#   hack/controlplane.sh stop-apiserver2    stop the second kube-apiserver (`down` stops it too)
#   hack/controlplane.sh freeze-apiserver N SIGSTOP kube-apiserver N (1 or 2): its sockets stay open, nothing answers
#   hack/controlplane.sh thaw-apiserver N   SIGCONT kube-apiserver N
#   hack/controlplane.sh bin NAME           path of a built binary: kube-apiserver, kube-controller-manager,
#                                           kubectl, kubelet, kube-scheduler, kube-proxy, etcd, flanneld (built
#                                           first if needed; Kubernetes binaries are stamped with KUBE_VERSION)
#   hack/controlplane.sh audit              path of the audit log
#   hack/controlplane.sh audit2             path of the second kube-apiserver's audit log
#   hack/controlplane.sh env                the state (ports, paths) as shell assignments
#
# Environment:
#   NETCM_CACHE_DIR          where built binaries are cached by version (default ${XDG_CACHE_HOME:-~/.cache}/netcm)
#   NETCM_CONTROLPLANE_DIR   where certificates, data, logs and PIDs live (default <checkout>/_out/controlplane)
#   NETCM_NODE_MODE=1        (read by the first `up` of a state dir, then kept in it) kube-apiserver for a real
#                            node: served on NETCM_API_HOST (an address of the host that is not loopback, which
#                            pods reach through the `kubernetes` Service), ServiceAccount admission on, Node
#                            authorization and NodeRestriction, a client certificate for kubelets (kubectl
#                            logs), Services from NETCM_SERVICE_CIDR
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=hack/versions.env
source "$root/hack/versions.env"

cache=${NETCM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/netcm}
state=${NETCM_CONTROLPLANE_DIR:-$root/_out/controlplane}
etcd_bin=$cache/etcd-$ETCD_VERSION
flannel_bin=$cache/flannel-$FLANNEL_VERSION

log() { printf '[controlplane] %s\n' "$*" >&2; }
die() { printf '[controlplane] error: %s\n' "$*" >&2; exit 1; }

need() {
  local missing=()
  for tool in "$@"; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
  [ ${#missing[@]} -eq 0 ] || die "missing tools: ${missing[*]} (hack/test.sh installs them)"
}

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

build_k8s() {
  local name=$1 k8s_bin
  k8s_bin=$(k8s_bin_dir)
  [ -x "$k8s_bin/$name" ] && return 0
  need go flock sha256sum
  mkdir -p "$k8s_bin"
  (
    flock 9
    [ -x "$k8s_bin/$name" ] && exit 0
    log "building $name $KUBE_VERSION from the k8s.io/kubernetes module into $k8s_bin (cold: kube-apiserver ~8 min, kubelet ~2, kube-proxy ~1.5 on 2 cores)"
    cd "$root/hack/tools/k8s"
    # shellcheck disable=SC2046
    env $(go_env) go build -trimpath -ldflags "$(k8s_ldflags)" -o "$k8s_bin/$name.tmp" "k8s.io/kubernetes/cmd/$name"
    check_stamp "$k8s_bin/$name.tmp" "$name"
    mv "$k8s_bin/$name.tmp" "$k8s_bin/$name"
  ) 9>"$cache/build.lock"
}

build_etcd() {
  [ -x "$etcd_bin/etcd" ] && return 0
  need go flock
  mkdir -p "$etcd_bin"
  (
    flock 9
    [ -x "$etcd_bin/etcd" ] && exit 0
    log "building etcd $ETCD_VERSION from the go.etcd.io/etcd/server/v3 module"
    cd "$root/hack/tools/etcd"
    go build -trimpath -o "$etcd_bin/etcd.tmp" go.etcd.io/etcd/server/v3
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
    log "building flanneld $FLANNEL_VERSION from the github.com/flannel-io/flannel module"
    cd "$root/hack/tools/flannel"
    # The cache is keyed by FLANNEL_VERSION, so the module must build exactly that version.
    grep -q "^require github.com/flannel-io/flannel $FLANNEL_VERSION\$" go.mod ||
      die "hack/tools/flannel/go.mod does not require github.com/flannel-io/flannel $FLANNEL_VERSION (hack/versions.env)"
    CGO_ENABLED=1 go build -trimpath \
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

# free_ports N [TAKEN...]: N distinct free ports, none of them in TAKEN. The sockets are held together
# until all are chosen; one at a time, the kernel may hand out the same port twice.
free_ports() {
  python3 - "$@" <<'PY'
import socket, sys
n, taken = int(sys.argv[1]), set(sys.argv[2:])
held, ports = [], []
while len(ports) < n:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    held.append(s)
    p = str(s.getsockname()[1])
    if p not in taken:
        ports.append(p)
print(" ".join(ports))
PY
}

alive() { [ -f "$state/$1.pid" ] && kill -0 "$(cat "$state/$1.pid")" 2>/dev/null; }

gen_certs() {
  local d=$state/pki
  [ -f "$d/admin.crt" ] && return 0
  need openssl
  mkdir -p "$d"
  log "generating certificates in $d"
  (
    cd "$d"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -keyout ca.key -out ca.crt -subj "/CN=netcm-test-ca" 2>/dev/null
    local sans="IP:127.0.0.1,DNS:localhost,IP:$(service_ip),DNS:kubernetes,DNS:kubernetes.default"
    sans="$sans,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    [ "$API_HOST" = 127.0.0.1 ] || sans="$sans,IP:$API_HOST"
    cat >serving.ext <<EOF
subjectAltName=$sans
extendedKeyUsage=serverAuth
EOF
    openssl req -newkey rsa:2048 -nodes -keyout serving.key -out serving.csr -subj "/CN=kube-apiserver" 2>/dev/null
    openssl x509 -req -in serving.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -extfile serving.ext -out serving.crt 2>/dev/null
    echo "extendedKeyUsage=clientAuth" >client.ext
    openssl req -newkey rsa:2048 -nodes -keyout admin.key -out admin.csr -subj "/O=system:masters/CN=netcm-admin" 2>/dev/null
    openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -extfile client.ext -out admin.crt 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    if [ "$NODE_MODE" = 1 ]; then
      # kube-apiserver's client certificate towards kubelets (logs, exec, port-forward).
      openssl req -newkey rsa:2048 -nodes -keyout kubelet-client.key -out kubelet-client.csr \
        -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" 2>/dev/null
      openssl x509 -req -in kubelet-client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
        -extfile client.ext -out kubelet-client.crt 2>/dev/null
    fi
  )
}

# The `kubernetes` Service's ClusterIP: the first address of the Service range.
# A new serving key and certificate from the same CA (a cert-manager renewal), written over the old ones.
rotate_serving_cert() {
  local d=$state/pki
  [ -f "$d/serving.ext" ] || die "no certificates yet: run up first"
  (
    cd "$d"
    openssl req -newkey rsa:2048 -nodes -keyout serving.key.new -out serving.csr -subj "/CN=kube-apiserver" 2>/dev/null
    openssl x509 -req -in serving.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -extfile serving.ext -out serving.crt.new 2>/dev/null
    mv serving.key.new serving.key
    mv serving.crt.new serving.crt
  )
  openssl x509 -in "$d/serving.crt" -noout -serial
}

service_ip() {
  python3 -c 'import ipaddress, sys; print(ipaddress.ip_network(sys.argv[1])[1])' "$SERVICE_CIDR"
}

write_audit_policy() {
  cat >"$state/audit-policy.yaml" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    verbs: ["create", "update", "patch", "delete", "deletecollection"]
    resources:
      - group: ""
        resources: ["nodes", "nodes/status", "events"]
      - group: "coordination.k8s.io"
        resources: ["leases"]
      - group: "events.k8s.io"
        resources: ["events"]
      - group: "ipam.netcm.io"
        resources: ["podcidrclaims"]
  # How informers list Nodes: paged LISTs or one streaming watch (sendInitialEvents=true); and single
  # GETs, which a controller deciding from its cache should not need (hack/bench-requests.sh counts them).
  - level: Metadata
    verbs: ["get", "list", "watch"]
    resources:
      - group: ""
        resources: ["nodes"]
  - level: None
EOF
}

# write_kubeconfig [FILE PORT]: the admin kubeconfig for kube-apiserver (or the one on PORT).
write_kubeconfig() {
  local d=$state/pki file=${1:-$state/kubeconfig} port=${2:-$APISERVER_PORT}
  cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: netcm-test
    cluster:
      server: https://$API_HOST:$port
      certificate-authority: $d/ca.crt
users:
  - name: netcm-admin
    user:
      client-certificate: $d/admin.crt
      client-key: $d/admin.key
contexts:
  - name: netcm-test
    context: {cluster: netcm-test, user: netcm-admin}
current-context: netcm-test
EOF
}

load_env() {
  [ -f "$state/env" ] || die "no control plane state in $state: run 'hack/controlplane.sh up' first"
  # State dirs made before node mode existed lack these.
  API_HOST=127.0.0.1 SERVICE_CIDR=10.0.0.0/24 NODE_MODE=0
  # shellcheck source=/dev/null
  source "$state/env"
}

start_etcd() {
  load_env
  local etcd
  etcd=$(bin_path etcd)
  setsid nohup "$etcd" \
    --name netcm-test \
    --data-dir "$state/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "netcm-test=http://127.0.0.1:$ETCD_PEER_PORT" \
    --listen-metrics-urls "http://127.0.0.1:$ETCD_METRICS_PORT" \
    --unsafe-no-fsync \
    --log-level warn \
    >>"$state/etcd.log" 2>&1 </dev/null &
  echo $! >"$state/etcd.pid"
  local i
  for i in $(seq 1 100); do
    if curl -sf "http://127.0.0.1:$ETCD_PORT/health" >/dev/null 2>&1; then return 0; fi
    alive etcd || die "etcd exited; see $state/etcd.log: $(tail -3 "$state/etcd.log")"
    sleep 0.1
  done
  die "etcd not healthy after 10 s; see $state/etcd.log"
}

# start_apiserver [NAME PORT AUDIT]: kube-apiserver (default), or a second one with its own port and audit
# log; both share etcd, certificates and service-account keys, so one admin credential works on both.
start_apiserver() {
  load_env
  local apiserver d=$state/pki name=${1:-kube-apiserver} port=${2:-$APISERVER_PORT} audit=${3:-$state/audit.log}
  shift $(($# < 3 ? $# : 3))
  local extra=("$@")
  apiserver=$(bin_path kube-apiserver)
  local mode=(--bind-address 127.0.0.1 --advertise-address 127.0.0.1 --authorization-mode RBAC
    --disable-admission-plugins ServiceAccount)
  if [ "$NODE_MODE" = 1 ]; then
    mode=(--bind-address "$API_HOST" --advertise-address "$API_HOST" --authorization-mode Node,RBAC
      --enable-admission-plugins NodeRestriction
      --kubelet-client-certificate "$d/kubelet-client.crt" --kubelet-client-key "$d/kubelet-client.key"
      --kubelet-preferred-address-types InternalIP)
  fi
  setsid nohup "$apiserver" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --cert-dir "$d" \
    --tls-cert-file "$d/serving.crt" \
    --tls-private-key-file "$d/serving.key" \
    --client-ca-file "$d/ca.crt" \
    --secure-port "$port" \
    "${mode[@]}" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --allow-privileged=true \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$d/sa.pub" \
    --service-account-signing-key-file "$d/sa.key" \
    --audit-policy-file "$state/audit-policy.yaml" \
    --audit-log-path "$audit" \
    --audit-log-maxsize 0 \
    --audit-log-format json \
    --max-requests-inflight 800 \
    --max-mutating-requests-inflight 400 \
    "${extra[@]}" \
    >>"$state/$name.log" 2>&1 </dev/null &
  echo $! >"$state/$name.pid"
  wait_ready "$name" "$port"
}

# wait_ready [NAME PORT]
wait_ready() {
  local i d=$state/pki name=${1:-kube-apiserver} port=${2:-$APISERVER_PORT}
  for i in $(seq 1 300); do
    if curl -sf --cacert "$d/ca.crt" --cert "$d/admin.crt" --key "$d/admin.key" \
      "https://$API_HOST:$port/readyz" >/dev/null 2>&1; then
      return 0
    fi
    alive "$name" || die "$name exited; see $state/$name.log: $(tail -3 "$state/$name.log")"
    sleep 0.2
  done
  die "$name not ready after 60 s; see $state/$name.log"
}

# The second kube-apiserver gets its port on first use, so state dirs made before it existed still work.
start_apiserver2() {
  load_env
  if [ -z "${APISERVER2_PORT:-}" ]; then
    echo "APISERVER2_PORT=$(free_ports 1 "$ETCD_PORT" "$ETCD_PEER_PORT" "$ETCD_METRICS_PORT" "$APISERVER_PORT")" >>"$state/env"
    load_env
  fi
  write_kubeconfig "$state/kubeconfig2" "$APISERVER2_PORT"
  if ! alive kube-apiserver2; then
    log "starting a second kube-apiserver $KUBE_VERSION on $API_HOST:$APISERVER2_PORT"
    start_apiserver kube-apiserver2 "$APISERVER2_PORT" "$state/audit2.log" "$@"
  fi
  echo "KUBECONFIG=$state/kubeconfig2"
}

# signal_apiserver SIG N: sends SIG to kube-apiserver N (1 or 2).
signal_apiserver() {
  local sig=$1 name
  case "${2:-}" in
    1) name=kube-apiserver ;;
    2) name=kube-apiserver2 ;;
    *) die "usage: hack/controlplane.sh freeze-apiserver|thaw-apiserver 1|2" ;;
  esac
  alive "$name" || die "$name is not running"
  kill -s "$sig" "$(cat "$state/$name.pid")"
}

# kube-apiserver takes ~60 s to exit on SIGTERM while watches are open: give it a short grace, then SIGKILL.
stop_component() {
  local name=$1 grace=${2:-3} pid i
  alive "$name" || { rm -f "$state/$name.pid"; return 0; }
  pid=$(cat "$state/$name.pid")
  # A frozen (SIGSTOPped) process would not act on SIGTERM until continued.
  kill -CONT "$pid" 2>/dev/null || true
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 $((grace * 10))); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
  fi
  rm -f "$state/$name.pid"
}

cmd_up() {
  need curl openssl python3
  mkdir -p "$state" "$cache"
  if alive etcd && alive kube-apiserver; then
    load_env
    wait_ready
    log "reusing the running control plane in $state"
    echo "KUBECONFIG=$state/kubeconfig"
    return 0
  fi
  # Build before starting anything, so a cold cache fails early and clearly.
  bin_path etcd >/dev/null
  bin_path kube-apiserver >/dev/null
  if [ ! -f "$state/env" ]; then
    local ports
    read -r -a ports <<<"$(free_ports 4)"
    cat >"$state/env" <<EOF
ETCD_PORT=${ports[0]}
ETCD_PEER_PORT=${ports[1]}
ETCD_METRICS_PORT=${ports[2]}
APISERVER_PORT=${ports[3]}
NODE_MODE=${NETCM_NODE_MODE:-0}
API_HOST=${NETCM_API_HOST:-127.0.0.1}
SERVICE_CIDR=${NETCM_SERVICE_CIDR:-10.0.0.0/24}
EOF
  fi
  load_env
  gen_certs
  write_audit_policy
  write_kubeconfig
  alive etcd || { log "starting etcd $ETCD_VERSION on 127.0.0.1:$ETCD_PORT"; start_etcd; }
  if ! alive kube-apiserver; then
    log "starting kube-apiserver $KUBE_VERSION on $API_HOST:$APISERVER_PORT"
    # A fresh control plane starts fresh audit logs: readers scan from a mark, and a log grown by
    # earlier runs (benchmarks write gigabytes) only makes every scan slower. Restarts mid-test keep it.
    : >"$state/audit.log"
    : >"$state/audit2.log"
    start_apiserver
  fi
  log "ready; audit log: $state/audit.log"
  echo "KUBECONFIG=$state/kubeconfig"
}

cmd_down() {
  stop_component kube-apiserver2 3
  stop_component kube-apiserver 3
  stop_component etcd 5
  log "stopped"
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  restart-apiserver) stop_component kube-apiserver 3; start_apiserver; log "kube-apiserver restarted" ;;
  rotate-serving-cert) rotate_serving_cert; stop_component kube-apiserver 3; start_apiserver; log "kube-apiserver restarted with a new serving certificate" ;;
  stop-apiserver) stop_component kube-apiserver 3; log "kube-apiserver stopped" ;;
  start-apiserver) alive kube-apiserver || start_apiserver; log "kube-apiserver started" ;;
  start-apiserver2) shift; start_apiserver2 "$@" ;;
  stop-apiserver2) stop_component kube-apiserver2 3; log "second kube-apiserver stopped" ;;
  freeze-apiserver) signal_apiserver STOP "${2:-}" ;;
  thaw-apiserver) signal_apiserver CONT "${2:-}" ;;
  restart-etcd) stop_component etcd 5; start_etcd; load_env; wait_ready; log "etcd restarted" ;;
  bin) [ $# -eq 2 ] || die "usage: hack/controlplane.sh bin NAME"; bin_path "$2" ;;
  audit) echo "$state/audit.log" ;;
  audit2) echo "$state/audit2.log" ;;
  env) load_env; cat "$state/env"; echo "STATE_DIR=$state"; echo "KUBECONFIG=$state/kubeconfig"; echo "KUBECONFIG2=$state/kubeconfig2" ;;
  *) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
