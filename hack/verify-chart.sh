#!/usr/bin/env bash
# The Helm chart, tested like code against the real kube-apiserver of hack/controlplane.sh:
#   1. helm lint --strict, with the default values and with every optional part on
#      (charts/netcm/ci/all-on-values.yaml);
#   2. helm template of both, and a check of what each rendering must and must not contain;
#   3. kubectl apply --server-side --dry-run=server of each rendering: strict field validation against the
#      API server's schemas, admission (PriorityClass, PodSecurity) and RBAC, without changing anything. The
#      default rendering goes to a namespace labelled with the Pod Security "restricted" profile and must
#      pass it without a warning. The ServiceMonitor CRD is a minimal stand-in from hack/testdata/.
# helm is built from its Go module (HELM_VERSION in hack/versions.env) into the same cache as the control
# plane binaries. Exits non-zero on the first failure.
#
#   hack/verify-chart.sh         run every check
#   hack/verify-chart.sh helm    print the path of the built helm (built first if needed)
#
# Environment: NETCM_CACHE_DIR (as hack/controlplane.sh), NETCM_VERIFY_OUT (renderings; default _out/chart).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=hack/versions.env
source "$root/hack/versions.env"

cache=${NETCM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/netcm}
helm_bin=$cache/helm-$HELM_VERSION/helm
helm4_bin=$cache/helm-$HELM4_VERSION/helm
chart=$root/charts/netcm
out=${NETCM_VERIFY_OUT:-$root/_out/chart}
release=netcm
ns_default=netcm-verify-restricted
ns_all_on=netcm-verify-all-on
field_manager=netcm-verify-chart
tag=verify-chart
# shellcheck source=hack/lib.sh
source "$root/hack/lib.sh"

build_helm() {
  [ -x "$helm_bin" ] && return 0
  command -v go >/dev/null 2>&1 || die "go not found: helm is built from its Go module (hack/install-prereqs.sh)"
  command -v flock >/dev/null 2>&1 || die "flock not found (util-linux)"
  mkdir -p "$(dirname "$helm_bin")"
  (
    flock 9
    [ -x "$helm_bin" ] && exit 0
    log "building helm $HELM_VERSION from the helm.sh/helm/v3 module"
    cd "$root/hack/tools/helm"
    # helm's Makefile stamps its version and the Kubernetes version `helm template` and `helm lint` assume
    # (client-go's minor, as 1.x); without them helm reports v1.20 and misses newer API deprecations.
    local k8s major minor
    k8s=$(go list -f '{{.Version}}' -m k8s.io/client-go)
    k8s=${k8s#v}
    major=$((${k8s%%.*} + 1))
    minor=$(echo "$k8s" | cut -d. -f2)
    local ldflags="-w -s -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
    for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
      ldflags="$ldflags -X $pkg.k8sVersionMajor=$major -X $pkg.k8sVersionMinor=$minor"
    done
    CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$helm_bin.tmp" helm.sh/helm/v3/cmd/helm
    mv "$helm_bin.tmp" "$helm_bin"
  ) 9>"$cache/build.lock"
}

# contains FILE REGEX WHAT / lacks FILE REGEX WHAT: a rendering must (not) have a line matching REGEX.
contains() { grep -Eq -- "$2" "$1" || die "$(basename "$1"): expected $3"; log "  ok: has $3"; }
lacks() { ! grep -Eq -- "$2" "$1" || die "$(basename "$1"): must not have $3"; log "  ok: no $3"; }

kinds() { grep -E '^kind: ' "$1" | sed 's/^kind: //' | sort | tr '\n' ' '; }
# count FILE REGEX N WHAT: a rendering has exactly N lines matching REGEX.
count() {
  local n
  n=$(grep -Ec -- "$2" "$1" || true)
  [ "$n" -eq "$3" ] || die "$(basename "$1"): expected $3 × $4, found $n"
  log "  ok: $3 × $4"
}

# Helm 4 reads the Kubernetes version it assumes from its client-go module: only its own version is stamped.
build_helm4() {
  [ -x "$helm4_bin" ] && return 0
  mkdir -p "$(dirname "$helm4_bin")"
  (
    flock 9
    [ -x "$helm4_bin" ] && exit 0
    log "building helm $HELM4_VERSION from the helm.sh/helm/v4 module"
    cd "$root/hack/tools/helm4"
    CGO_ENABLED=0 go build -trimpath -ldflags "-w -s -X helm.sh/helm/v4/internal/version.version=$HELM4_VERSION" \
      -o "$helm4_bin.tmp" helm.sh/helm/v4/cmd/helm
    mv "$helm4_bin.tmp" "$helm4_bin"
  ) 9>"$cache/build.lock"
}

mkdir -p "$cache"
build_helm
build_helm4
case "${1:-}" in
  "") ;;
  helm) echo "$helm_bin"; exit 0 ;;
  *) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
mkdir -p "$out"
log "helm: $("$helm_bin" version --short)"

# --- 1. lint -------------------------------------------------------------------------------------------
log "helm lint --strict (default values)"
"$helm_bin" lint --strict "$chart"
log "helm lint --strict (all on: ci/all-on-values.yaml)"
"$helm_bin" lint --strict "$chart" -f "$chart/ci/all-on-values.yaml"
# chart-testing's own lint (`ct lint`) is helm lint plus yamllint with its rules over the chart's YAML;
# ct's Go module is not served here, so its rules are reproduced (hack/testdata/chart-lintconf.yaml).
log "yamllint with chart-testing's rules (Chart.yaml, values.yaml, ci/)"
yamllint -s -c "$root/hack/testdata/chart-lintconf.yaml" "$chart/Chart.yaml" "$chart/values.yaml" "$chart"/ci/*.yaml

# --- 2. render ------------------------------------------------------------------------------------------
render() { # NAME NAMESPACE [helm args…]
  local name=$1 ns=$2
  shift 2
  "$helm_bin" template "$release" "$chart" --namespace "$ns" "$@" >"$out/$name.yaml"
  log "rendered $name: $(kinds "$out/$name.yaml")-> $out/$name.yaml"
}
render default "$ns_default"
render all-on "$ns_all_on" -f "$chart/ci/all-on-values.yaml"

log "checking the default rendering"
d=$out/default.yaml
for kind in ServiceAccount ClusterRole ClusterRoleBinding Role RoleBinding Service Deployment PodDisruptionBudget; do
  contains "$d" "^kind: $kind\$" "a $kind"
done
lacks "$d" '^kind: (DaemonSet|ServiceMonitor)$' "DaemonSet or ServiceMonitor (off by default)"
lacks "$d" '^kind: (PrometheusRule|ConfigMap)$' "PrometheusRule or dashboard ConfigMap (off by default)"
lacks "$d" '^kind: ValidatingAdmissionPolicy' "ValidatingAdmissionPolicy (only for the DaemonSet, off by default)"
contains "$d" '^  replicas: 2$' "2 replicas"
contains "$d" 'priorityClassName: system-cluster-critical' "priorityClassName system-cluster-critical"
contains "$d" 'key: node-role.kubernetes.io/control-plane' "a control-plane toleration"
contains "$d" 'podAntiAffinity:' "pod anti-affinity"
contains "$d" '- --leader-elect=true' "leader election on"
contains "$d" "- --leader-elect-resource-namespace=$ns_default\$" "the Lease in the release namespace"
contains "$d" 'path: /livez' "a liveness probe on /livez"
contains "$d" 'path: /readyz' "a readiness probe on /readyz"
contains "$d" 'fieldPath: metadata.name' "POD_NAME from the downward API"
lacks "$d" 'hostNetwork|NET_ADMIN|runAsUser: 0' "hostNetwork, NET_ADMIN or root"
lacks "$d" 'node.kubernetes.io/(not-ready|network-unavailable)' "tolerations of Nodes without a pod network (off the host network, netcm needs one)"
lacks "$d" 'nodes/status' "RBAC for features that are off"
lacks "$d" '--route-mode' "a route mode (the route controller is off)"
count "$d" '- --cluster-cidr=10\.244\.0\.0/16$' 1 "--cluster-cidr for the allocator"
count "$d" '- --annotation-prefix=flannel\.alpha\.coreos\.com$' 1 "--annotation-prefix for the syncer"
lacks "$d" '--route-lease-annotation-prefix' "the deprecated --route-lease-annotation-prefix"
contains "$d" '- --cidr-release-hold-rejoin-by-provider-id=false$' "release holds given back by name only (a providerID is the node's own word)"
contains "$d" '- --secure-port=10270' "secure metrics on by default"
contains "$d" 'resources: \[tokenreviews\]' "tokenreviews for secure metrics"
contains "$d" 'resources: \[subjectaccessreviews\]' "subjectaccessreviews for secure metrics"
contains "$d" 'nonResourceURLs: \[/metrics\]' "a metrics-reader ClusterRole for scrapers"
contains "$d" 'helm.sh/hook: test' "the helm test pod (netcm check)"
# Artifact Hub lists the image users will pull: it must be the one the chart renders.
listed_image=$(sed -n 's/^ *image: //p' "$chart/Chart.yaml" | head -1)
contains "$d" "image: ${listed_image//./\\.}\$" "the image artifacthub.io/images lists ($listed_image)"

log "checking the all-on rendering"
a=$out/all-on.yaml
for kind in DaemonSet ServiceMonitor; do contains "$a" "^kind: $kind\$" "a $kind"; done
for kind in PrometheusRule ConfigMap; do contains "$a" "^kind: $kind\$" "a $kind"; done
contains "$a" 'runbook_url: https://runbooks.example.com/netcm.md#netcmnoleader' "runbook URLs under metrics.prometheusRule.runbookURL"
contains "$a" 'grafana_dashboard: "1"' "the Grafana sidecar's dashboard label"
contains "$a" 'hostNetwork: true' "hostNetwork for the route modes"
contains "$a" 'key: node.kubernetes.io/network-unavailable' "on the host network, a toleration of network-unavailable Nodes"
contains "$a" 'key: node.kubernetes.io/not-ready' "on the host network, a toleration of not-ready Nodes"
contains "$a" 'add: \[NET_ADMIN\]' "NET_ADMIN for the route modes"
contains "$a" '- --cidr-release-hold-rejoin-by-provider-id=true$' "release holds given back by providerID when asked"
contains "$a" '- --leader-elect=false' "the DaemonSet without leader election"
contains "$a" 'fieldPath: spec.nodeName' "NODE_NAME from the downward API in the DaemonSet"
contains "$a" 'resources: \[nodes/status\]' "nodes/status patch for the route controller"
# Root on any Node reads the DaemonSet's token: it runs as an account of its own, held to its own Node's
# NetworkUnavailable by a ValidatingAdmissionPolicy.
count "$a" '^      serviceAccountName: netcm$' 1 "the controller's ServiceAccount (the Deployment only)"
count "$a" '^      serviceAccountName: netcm-node$' 1 "the DaemonSet's own ServiceAccount"
count "$a" '^    resources: \[nodes/status\]$' 2 "RBAC rules for nodes/status: the Deployment's (gateway mode) and the DaemonSet's"
for kind in ValidatingAdmissionPolicy ValidatingAdmissionPolicyBinding; do contains "$a" "^kind: $kind\$" "a $kind"; done
contains "$a" 'request.userInfo.username == "system:serviceaccount:netcm-verify-all-on:netcm-node"' "the policy matching the DaemonSet's account"
contains "$a" "- --daemonset-as=system:serviceaccount:$ns_all_on:netcm-node\$" "helm test reviewing the DaemonSet's account"
render daemonset-only "$ns_default" --set daemonSet.enabled=true
o=$out/daemonset-only.yaml
count "$o" '^    resources: \[nodes/status\]$' 1 "RBAC rule for nodes/status, the DaemonSet's only (the Deployment routes nothing)"
count "$a" '- --route-mode=gateway$' 1 "--route-mode=gateway (the Deployment)"
count "$a" '- --route-mode=node$' 1 "--route-mode=node (the DaemonSet)"
count "$a" '- --cluster-cidr=10\.244\.0\.0/16,fd00:10:244::/56$' 2 "--cluster-cidr in the Deployment and the DaemonSet (the routes' boundary)"
count "$a" '- --annotation-prefix=example\.com$' 2 "--annotation-prefix in the Deployment and the DaemonSet (the leases' keys)"
count "$a" '- --cluster-cidr-objects=true$' 2 "--cluster-cidr-objects in the Deployment and the DaemonSet (pools' ranges are routed)"
count "$a" '    resources: \[clustercidrs\]$' 2 "clustercidrs rules for the controller and (list, watch) the DaemonSet"
lacks "$a" '--route-lease-annotation-prefix' "the deprecated --route-lease-annotation-prefix"
contains "$a" 'resources: \[tokenreviews\]' "tokenreviews for secure metrics"
contains "$a" 'resources: \[subjectaccessreviews\]' "subjectaccessreviews for secure metrics"

# Without leader election nothing fences a replica's writes: never two allocating pods at once.
log "checking the renderings without leader election"
refuses() { # WHAT REGEX [helm args…]: helm template fails, saying REGEX
  local what=$1 want=$2 err
  shift 2
  if err=$("$helm_bin" template "$release" "$chart" "$@" 2>&1 >/dev/null); then
    die "rendered $what; it must be refused"
  fi
  grep -Eq -- "$want" <<<"$err" || die "refused $what without saying /$want/: $err"
  log "  ok: refuses $what"
}
refuses "two replicas without leader election" 'leaderElection.enabled=false with replicaCount=2' \
  --set leaderElection.enabled=false
refuses "the DaemonSet on the controller's ServiceAccount" "is the controller's ServiceAccount" \
  --set daemonSet.enabled=true --set daemonSet.serviceAccount.name=netcm
lacks "$d" 'type: Recreate' "Recreate with leader election (a surge pod only stands by)"
render unelected "$ns_default" --set leaderElection.enabled=false --set replicaCount=1
u=$out/unelected.yaml
contains "$u" '- --leader-elect=false' "leader election off"
contains "$u" '^    type: Recreate$' "a Recreate rollout: no second pod while the old one runs or drains"

# --- 3. server-side dry-run against the real control plane -------------------------------------------------
log "starting (or reusing) the control plane"
kubeconfig_line=$(bash "$root/hack/controlplane.sh" up | tail -1)
export KUBECONFIG=${kubeconfig_line#KUBECONFIG=}
[ -f "$KUBECONFIG" ] || die "hack/controlplane.sh up did not print a kubeconfig path (got '$kubeconfig_line')"
kubectl=$(bash "$root/hack/controlplane.sh" bin kubectl)
log "kubectl: $kubectl; API server: $(grep -m1 'server:' "$KUBECONFIG" | awk '{print $2}') (Kubernetes $KUBE_VERSION)"

# The API server reports its version (hack/controlplane.sh stamps it), so helm checks the chart's
# kubeVersion against the real cluster, as it does for users: no --kube-version stand-in.
server_version=$("$kubectl" version -o json | python3 -c 'import json, sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')
[ "$server_version" = "$KUBE_VERSION" ] || die "the API server reports $server_version, not $KUBE_VERSION"
log "helm install --dry-run=server (the chart's kubeVersion against the API server's $server_version)"
# A release name of its own: the e2e tests leave the chart's cluster-scoped RBAC (named after "netcm") in
# place, which a dry-run install of release "netcm" would refuse to adopt.
"$helm_bin" install netcm-verify-version "$chart" --namespace "$ns_default" --dry-run=server >/dev/null \
  || die "helm install --dry-run=server refused the chart"
log "  ok: helm accepts the chart on Kubernetes $server_version"

# The namespaces must exist for namespaced dry-runs. The default rendering's namespace enforces and warns on
# the "restricted" profile: PodSecurity admission checks Deployment/DaemonSet pod templates with warnings.
"$kubectl" apply --server-side --field-manager="$field_manager" -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata:
  name: $ns_default
  labels:
    pod-security.kubernetes.io/enforce: restricted
    pod-security.kubernetes.io/warn: restricted
    pod-security.kubernetes.io/audit: restricted
---
apiVersion: v1
kind: Namespace
metadata:
  name: $ns_all_on
EOF
log "namespaces $ns_default (Pod Security: restricted) and $ns_all_on exist"

log "installing the minimal ServiceMonitor CRD (hack/testdata/servicemonitor-crd.yaml)"
"$kubectl" apply --server-side --field-manager="$field_manager" -f "$root/hack/testdata/servicemonitor-crd.yaml" >/dev/null
kubectl_wait 60 "$kubectl" --for=condition=Established crd/servicemonitors.monitoring.coreos.com
log "installing the minimal PrometheusRule CRD (hack/testdata/prometheusrule-crd.yaml)"
"$kubectl" apply --server-side --field-manager="$field_manager" -f "$root/hack/testdata/prometheusrule-crd.yaml" >/dev/null
kubectl_wait 60 "$kubectl" --for=condition=Established crd/prometheusrules.monitoring.coreos.com

dry_run() { # NAME: every object of the rendering, server-side applied in dry-run mode
  local name=$1 file=$out/$1.yaml err=$out/$1.dry-run.stderr
  log "kubectl apply --server-side --dry-run=server -f $file"
  # --force-conflicts: cluster-scoped objects of the same name may exist (e2e/tests/e2e/chart_rbac.rs installs
  # the RBAC for real); whoever manages them is irrelevant to whether this rendering is valid.
  if ! "$kubectl" apply --server-side --dry-run=server --force-conflicts --field-manager="$field_manager" \
    --validate=strict -f "$file" 2>"$err" | sed 's/^/[verify-chart]   /' >&2; then
    cat "$err" >&2
    die "the API server rejected the $name rendering"
  fi
  [ ! -s "$err" ] || sed 's/^/[verify-chart]   stderr: /' "$err" >&2
}
dry_run default
if grep -qi 'violate PodSecurity' "$out/default.dry-run.stderr"; then
  die "the default rendering does not pass the Pod Security \"restricted\" profile (see above)"
fi
log "  ok: the default rendering passes Pod Security \"restricted\""
dry_run all-on

# --- 4. a real install, upgrade and uninstall with Helm 3 and with Helm 4 ---------------------------------
# No node runs the pods (the chart on a real node is e2e/tests/e2e/chart_on_a_real_node.rs): this is what each
# Helm makes of the chart's objects. An upgrade changes one value and must reach the Deployment's args.
helm_lifecycle() { # HELM_BIN NAMESPACE-PREFIX
  # A namespace of its own per run: with no kube-controller-manager on the test control plane, a deleted
  # namespace stays Terminating, and a second run on the same state dir could not install into it.
  local h=$1 ns=$2-$(date +%s) rel=netcm-lifecycle args
  log "$("$h" version --short): install, upgrade, uninstall in $ns"
  "$h" install "$rel" "$chart" -n "$ns" --create-namespace >/dev/null || die "$h install failed"
  "$kubectl" -n "$ns" get deployment "$rel" >/dev/null || die "$h install made no Deployment"
  "$h" upgrade "$rel" "$chart" -n "$ns" --reuse-values --set logging.format=json >/dev/null || die "$h upgrade failed"
  args=$("$kubectl" -n "$ns" get deployment "$rel" -o jsonpath='{.spec.template.spec.containers[0].args}')
  grep -q -- "--log-format=json" <<<"$args" || die "$h upgrade did not reach the Deployment: $args"
  [ "$("$h" history "$rel" -n "$ns" -o json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')" = 2 ] \
    || die "$h history does not show two revisions"
  "$h" uninstall "$rel" -n "$ns" --wait >/dev/null || die "$h uninstall failed"
  ! "$kubectl" -n "$ns" get deployment "$rel" >/dev/null 2>&1 || die "$h uninstall left the Deployment"
  "$kubectl" delete namespace "$ns" --wait=false >/dev/null
  log "  ok: $("$h" version --short) installs, upgrades and uninstalls the chart"
}
helm_lifecycle "$helm_bin" netcm-verify-helm3
helm_lifecycle "$helm4_bin" netcm-verify-helm4

log "PASS: lint (2 value sets), render checks, server-side dry-run of $(grep -c '^kind: ' "$d") + $(grep -c '^kind: ' "$a") objects, Helm 3 and Helm 4 lifecycles"
