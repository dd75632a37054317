{{/*
The chart name, or nameOverride.
*/}}
{{- define "lanepool.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of the chart's resources: fullnameOverride, else "<release>-<name>", or the
release name alone when it already contains the chart name. Cut to 52 characters so that
suffixed names ("-leader-election") stay within 63.
*/}}
{{- define "lanepool.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The chart label: name-version.
*/}}
{{- define "lanepool.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels: stable for the release's life (a Deployment's selector is immutable).
*/}}
{{- define "lanepool.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lanepool.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Labels of every resource.
*/}}
{{- define "lanepool.labels" -}}
helm.sh/chart: {{ include "lanepool.chart" . }}
{{ include "lanepool.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: lanepool
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
The operator's ServiceAccount name.
*/}}
{{- define "lanepool.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "lanepool.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The user name the API server gives the operator's ServiceAccount: what the admission policies
match, so that they bind the operator and nobody else.
*/}}
{{- define "lanepool.serviceAccountUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "lanepool.serviceAccountName" . }}
{{- end }}

{{/*
The operator image: repository@digest, or repository:tag (the appVersion by default).
*/}}
{{- define "lanepool.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/*
The rules the operator needs in every namespace it watches; shared by the ClusterRole and the
per-namespace Roles so that both modes grant exactly the same.
*/}}
{{- define "lanepool.rules" -}}
- apiGroups: ["lanepool.dev"]
  resources: ["lanepools"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["lanepool.dev"]
  resources: ["lanepools/status"]
  verbs: ["get", "patch", "update"]
# The pool's Deployments; the admission policy (rbac.podAdmissionPolicy) lets the operator write
# only those a LanePool controls, so these verbs reach no other Deployment of the namespace.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "update", "delete"]
# A Pod is a pool's worker only when a ReplicaSet of one of the pool's Deployments controls it:
# the ReplicaSets' metadata is listed to follow those ownerReferences (watch: for a later cache).
- apiGroups: ["apps"]
  resources: ["replicasets"]
  verbs: ["list", "watch"]
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "list", "watch"]
# The Pods labelled with a pool, watched into a cache (worker reads, drains, ranking); only the
# busy ones of a Deployment about to shrink are annotated with
# controller.kubernetes.io/pod-deletion-cost, so idle workers go first (--idle-workers-first).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "patch"]
# The readiness gate lanepool.dev/takeover of workers whose template serves a metrics port: set
# once a new worker may count as available (during a template change, once an old one drained).
- apiGroups: [""]
  resources: ["pods/status"]
  verbs: ["patch"]
# Secrets by name only: those a LanePool names in spec.prometheus (bearerTokenSecret, basicAuth,
# caSecret, clientCertificateSecret) are read, and each pool's worker credential
# <pool>-worker-credential is read, created and merge-patched (rotations). RBAC cannot narrow a
# verb to names not known in advance: the admission policy lets the operator create and patch
# only an Opaque <pool>-worker-credential its LanePool controls. No list, watch, update or delete.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}
