{{/* Names, labels, the image and netcm's arguments, shared by every template. */}}

{{- define "netcm.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "netcm.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "netcm.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "netcm.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The route DaemonSet's ServiceAccount. Root on any Node reads the tokens of the pods there, so it must
never be the controller's, whose token may rewrite every Node, the PodCIDRClaims, the pools and the Lease. */}}
{{- define "netcm.daemonSetServiceAccountName" -}}
{{- $sa := .Values.daemonSet.serviceAccount }}
{{- $name := "" }}
{{- if $sa.create }}
{{- $name = default (include "netcm.daemonSetName" .) $sa.name }}
{{- else }}
{{- $name = required "daemonSet.serviceAccount.name is required when daemonSet.serviceAccount.create is false" $sa.name }}
{{- end }}
{{- if eq $name (include "netcm.serviceAccountName" .) }}
{{- fail (printf "daemonSet.serviceAccount.name %q is the controller's ServiceAccount: root on any Node could read its token and rewrite every Node's pod CIDR, the PodCIDRClaims and the Lease; give the DaemonSet an account of its own" $name) }}
{{- end }}
{{- $name }}
{{- end }}

{{/* The route DaemonSet's ServiceAccount as the API server names its requests. */}}
{{- define "netcm.daemonSetUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "netcm.daemonSetServiceAccountName" .) }}
{{- end }}

{{/* The name of the route DaemonSet's objects (ClusterRole, Roles, bindings): <fullname>-node. */}}
{{- define "netcm.daemonSetName" -}}
{{- printf "%s-node" (include "netcm.fullname" . | trunc 58 | trimSuffix "-") }}
{{- end }}

{{- define "netcm.selectorLabels" -}}
app.kubernetes.io/name: {{ include "netcm.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "netcm.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "netcm.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: netcm
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "netcm.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Whether the Deployment programs kernel routes itself (gateway mode): hostNetwork + NET_ADMIN. */}}
{{- define "netcm.gatewayMode" -}}
{{- if and .Values.routeController.enabled (eq .Values.routeController.backend "netlink") }}true{{ end }}
{{- end }}

{{/* Whether the Deployment writes the NetworkUnavailable condition (nodes/status): only in gateway mode;
the DaemonSet writes it with its own account. */}}
{{- define "netcm.writesNodeStatus" -}}
{{- if and .Values.routeController.setNodeNetworkUnavailable .Values.routeController.enabled }}true{{ end }}
{{- end }}

{{/* Whether the DaemonSet writes its own Node's NetworkUnavailable condition (nodes/status). */}}
{{- define "netcm.daemonSetWritesNodeStatus" -}}
{{- if and .Values.routeController.setNodeNetworkUnavailable .Values.daemonSet.enabled }}true{{ end }}
{{- end }}

{{/* The Deployment's --controllers: exactly the enabled ones, by canonical name. */}}
{{- define "netcm.controllers" -}}
{{- $c := list }}
{{- if .Values.allocator.enabled }}{{ $c = append $c "subnet-allocator" }}{{ end }}
{{- if .Values.annotationSyncer.enabled }}{{ $c = append $c "node-annotation-syncer" }}{{ end }}
{{- if .Values.routeController.enabled }}{{ $c = append $c "route-controller" }}{{ end }}
{{- if .Values.podCIDRMigration.enabled }}{{ $c = append $c "pod-cidr-migration" }}{{ end }}
{{- if not $c }}{{ fail "enable at least one of allocator, annotationSyncer, routeController" }}{{ end }}
{{- join "," $c }}
{{- end }}

{{/* Flags every netcm process takes: API client and logging. Integers go through int64: Helm reads
numbers from values files as floats and would print 1000000 as 1e+06. */}}
{{- define "netcm.args.common" -}}
- --kube-api-qps={{ .Values.kubeAPI.qps }}
- --kube-api-burst={{ .Values.kubeAPI.burst | int64 }}
- --log-format={{ .Values.logging.format }}
- --v={{ .Values.logging.verbosity | int64 }}
{{- end }}

{{- define "netcm.args.allocator" -}}
- --allocate-node-cidrs={{ .Values.allocator.allocateNodeCIDRs }}
{{- with .Values.allocator.nodeCIDRMaskSize }}
- --node-cidr-mask-size={{ . | int64 }}
{{- end }}
{{- with .Values.allocator.nodeCIDRMaskSizeIPv4 }}
- --node-cidr-mask-size-ipv4={{ . | int64 }}
{{- end }}
{{- with .Values.allocator.nodeCIDRMaskSizeIPv6 }}
- --node-cidr-mask-size-ipv6={{ . | int64 }}
{{- end }}
{{- if .Values.allocator.nodeCIDRSizeFromPods }}
- --node-cidr-size-from-pods=true
{{- with .Values.allocator.nodeCIDRMaskSizeIPv4Min }}
- --node-cidr-mask-size-ipv4-min={{ . | int64 }}
{{- end }}
{{- with .Values.allocator.nodeCIDRMaskSizeIPv4Max }}
- --node-cidr-mask-size-ipv4-max={{ . | int64 }}
{{- end }}
{{- end }}
{{- with .Values.allocator.serviceClusterIPRange }}
- --service-cluster-ip-range={{ . }}
{{- end }}
- --record-cidr-assigned-events={{ .Values.allocator.recordCIDRAssignedEvents }}
- --cluster-cidr-objects={{ .Values.allocator.clusterCIDRObjects }}
- --concurrent-node-cidr-syncs={{ .Values.allocator.concurrentSyncs | int64 }}
- --cidr-release-hold={{ .Values.allocator.cidrReleaseHold }}
- --cidr-release-hold-rejoin-by-provider-id={{ .Values.allocator.cidrReleaseHoldRejoinByProviderID }}
{{- end }}

{{/* --annotation-prefix: the syncer writes lease annotations under it, the route controller reads
gateways from them. */}}
{{- define "netcm.args.annotationPrefix" -}}
- --annotation-prefix={{ .Values.annotationSyncer.annotationPrefix }}
{{- end }}

{{- define "netcm.args.annotationSyncer" -}}
- --backend-type={{ .Values.annotationSyncer.backendType }}
- --public-ip-address-types={{ join "," .Values.annotationSyncer.publicIPAddressTypes }}
- --concurrent-node-annotation-syncs={{ .Values.annotationSyncer.concurrentSyncs | int64 }}
{{- end }}

{{/* --cluster-cidr: the allocator's pool and the route controller's boundary (it creates and deletes only
routes inside it). */}}
{{- define "netcm.args.clusterCIDR" -}}
- --cluster-cidr={{ .Values.allocator.clusterCIDR }}
{{- end }}

{{/* The route controller's flags; the caller passes --route-mode (gateway in the Deployment, node in the
DaemonSet). */}}
{{- define "netcm.args.routeController" -}}
- --route-backend={{ .Values.routeController.backend }}
- --route-table={{ with .Values.routeController.table }}{{ if kindIs "string" . }}{{ . }}{{ else }}{{ . | int64 }}{{ end }}{{ end }}
- --route-protocol={{ .Values.routeController.protocol | int64 }}
- --route-reconciliation-period={{ .Values.routeController.reconciliationPeriod }}
- --concurrent-route-syncs={{ .Values.routeController.concurrentSyncs | int64 }}
- --set-node-network-unavailable={{ .Values.routeController.setNodeNetworkUnavailable }}
{{- end }}

{{/* POD_NAME and POD_NAMESPACE: the Lease namespace default and the node lookup (pods get). */}}
{{- define "netcm.env.pod" -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- end }}

{{/* restricted-profile pod security context; root only in the host-network route modes. */}}
{{- define "netcm.podSecurityContext.restricted" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "netcm.containerSecurityContext.restricted" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end }}

{{/* Route programming: NET_ADMIN only. Kubernetes gives added capabilities to root processes only (no
ambient capabilities), so these pods run as UID 0 with every other capability dropped. */}}
{{- define "netcm.podSecurityContext.netAdmin" -}}
runAsNonRoot: false
runAsUser: 0
runAsGroup: 0
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "netcm.containerSecurityContext.netAdmin" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
  add: [NET_ADMIN]
{{- end }}

{{/* The controller-manager pods' tolerations: the user's, plus — on the host network, where netcm is what
brings the pod network up — Nodes that are not ready (no CNI config yet) or whose network is unavailable,
as flannel's and Cilium's operators tolerate them. Shared by the Deployment and the helm test pod. */}}
{{- define "netcm.tolerations" -}}
{{- $hostNetwork := or .Values.hostNetwork (include "netcm.gatewayMode" .) }}
{{- $tolerations := .Values.tolerations | default list }}
{{- if $hostNetwork }}
{{- $tolerations = concat $tolerations (list (dict "key" "node.kubernetes.io/not-ready" "operator" "Exists") (dict "key" "node.kubernetes.io/network-unavailable" "operator" "Exists" "effect" "NoSchedule")) }}
{{- end }}
{{- with $tolerations }}
{{- toYaml . }}
{{- end }}
{{- end }}
