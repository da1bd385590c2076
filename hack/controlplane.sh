#!/usr/bin/env bash
# A real Kubernetes control plane (etcd + kube-apiserver) on 127.0.0.1 for netcm's tests and local runs.
# hack/cluster.sh starts one of its own, for its real nodes, with NETCM_NODE_MODE=1 (see Environment).
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
#   hack/controlplane.sh build NAME...      build the binaries among NAMEs not yet cached, the Kubernetes
#                                           ones in one `go build` (they share most of their packages)
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
tag=controlplane
# shellcheck source=hack/lib.sh
source "$root/hack/lib.sh"
# shellcheck source=hack/controlplane/build.sh
source "$root/hack/controlplane/build.sh"

# What is written and the command lines run are rendered in Python (hack/controlplane/render.py, with
# its tests); this script only glues them to openssl, the processes and their pid files.
render() { python3 "$root/hack/controlplane/render.py" "$@"; }

# render_args VAR WHAT ARG...: array VAR becomes the command line render.py prints, one argument a line.
# Dies itself on failure: callers run inside `a || b`, where set -e does not stop them.
render_args() {
  local lines
  lines=$(render "${@:2}") || die "hack/controlplane/render.py $2 failed"
  mapfile -t "$1" <<<"$lines"
}

gen_certs() {
  local d=$state/pki
  [ -f "$d/admin.crt" ] && return 0
  need openssl
  mkdir -p "$d"
  log "generating certificates in $d"
  render serving-ext "$API_HOST" "$SERVICE_CIDR" >"$d/serving.ext"
  (
    cd "$d"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -keyout ca.key -out ca.crt -subj "/CN=netcm-test-ca" 2>/dev/null
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

# write_kubeconfig [FILE PORT]: the admin kubeconfig for kube-apiserver (or the one on PORT).
write_kubeconfig() {
  render kubeconfig "$API_HOST" "${2:-$APISERVER_PORT}" "$state/pki" >"${1:-$state/kubeconfig}"
}

load_env() {
  [ -f "$state/env" ] || die "no control plane state in $state: run 'hack/controlplane.sh up' first"
  # State dirs made before node mode existed lack these.
  API_HOST=127.0.0.1 SERVICE_CIDR=10.0.0.0/24 NODE_MODE=0
  # shellcheck source=/dev/null
  source "$state/env"
}

etcd_healthy() { curl -sf "http://127.0.0.1:$ETCD_PORT/health" >/dev/null 2>&1; }

start_etcd() {
  load_env
  local etcd etcd_args
  etcd=$(bin_path etcd)
  render_args etcd_args etcd-args "$state" "$ETCD_PORT" "$ETCD_PEER_PORT" "$ETCD_METRICS_PORT"
  setsid nohup "$etcd" "${etcd_args[@]}" >>"$state/etcd.log" 2>&1 </dev/null &
  echo $! >"$state/etcd.pid"
  wait_alive etcd 100 0.1 etcd_healthy || die "etcd not healthy after 10 s; see $state/etcd.log"
}

# apiserver_command [NAME PORT AUDIT [FLAG...]]: what launch_apiserver starts: kube-apiserver (default), or
# a second one with its own port and audit log; both share etcd, certificates and service-account keys, so
# one admin credential works on both. A restart prepares it before stopping the running one, so the API
# is down only while the process restarts.
apiserver_command() {
  load_env
  apiserver_name=${1:-kube-apiserver} apiserver_port=${2:-$APISERVER_PORT}
  local audit=${3:-$state/audit.log}
  shift $(($# < 3 ? $# : 3))
  apiserver_bin=$(bin_path kube-apiserver)
  render_args apiserver_args apiserver-args "$state" "$ETCD_PORT" "$apiserver_port" "$audit" "$NODE_MODE" "$API_HOST" "$SERVICE_CIDR" "$@"
}

launch_apiserver() {
  setsid nohup "$apiserver_bin" "${apiserver_args[@]}" >>"$state/$apiserver_name.log" 2>&1 </dev/null &
  echo $! >"$state/$apiserver_name.pid"
  wait_ready "$apiserver_name" "$apiserver_port"
}

start_apiserver() { apiserver_command "$@"; launch_apiserver; }

apiserver_ready() {
  local d=$state/pki
  curl -sf --cacert "$d/ca.crt" --cert "$d/admin.crt" --key "$d/admin.key" "https://$API_HOST:$1/readyz" >/dev/null 2>&1
}

# wait_ready [NAME PORT]
wait_ready() {
  local name=${1:-kube-apiserver} port=${2:-$APISERVER_PORT}
  wait_alive "$name" 300 0.2 apiserver_ready "$port" || die "$name not ready after 60 s; see $state/$name.log"
}

# The second kube-apiserver gets its port on first use, so state dirs made before it existed still work.
start_apiserver2() {
  load_env
  if [ -z "${APISERVER2_PORT:-}" ]; then
    echo "APISERVER2_PORT=$(render free-ports 1 "$ETCD_PORT" "$ETCD_PEER_PORT" "$ETCD_METRICS_PORT" "$APISERVER_PORT")" >>"$state/env"
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
  build_all etcd kube-apiserver
  if [ ! -f "$state/env" ]; then
    local ports env
    read -r -a ports <<<"$(render free-ports 4)"
    env=$(render env "${ports[@]}")
    echo "$env" >"$state/env"
  fi
  load_env
  gen_certs
  render audit-policy >"$state/audit-policy.yaml"
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
  restart-apiserver) apiserver_command; stop_component kube-apiserver 3; launch_apiserver; log "kube-apiserver restarted" ;;
  rotate-serving-cert) rotate_serving_cert; apiserver_command; stop_component kube-apiserver 3; launch_apiserver; log "kube-apiserver restarted with a new serving certificate" ;;
  stop-apiserver) stop_component kube-apiserver 3; log "kube-apiserver stopped" ;;
  start-apiserver) alive kube-apiserver || start_apiserver; log "kube-apiserver started" ;;
  start-apiserver2) shift; start_apiserver2 "$@" ;;
  stop-apiserver2) stop_component kube-apiserver2 3; log "second kube-apiserver stopped" ;;
  freeze-apiserver) signal_apiserver STOP "${2:-}" ;;
  thaw-apiserver) signal_apiserver CONT "${2:-}" ;;
  restart-etcd) stop_component etcd 5; start_etcd; load_env; wait_ready; log "etcd restarted" ;;
  bin) [ $# -eq 2 ] || die "usage: hack/controlplane.sh bin NAME"; bin_path "$2" ;;
  build) shift; [ $# -gt 0 ] || die "usage: hack/controlplane.sh build NAME..."; build_all "$@" ;;
  audit) echo "$state/audit.log" ;;
  audit2) echo "$state/audit2.log" ;;
  env) load_env; cat "$state/env"; echo "STATE_DIR=$state"; echo "KUBECONFIG=$state/kubeconfig"; echo "KUBECONFIG2=$state/kubeconfig2" ;;
  *) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
