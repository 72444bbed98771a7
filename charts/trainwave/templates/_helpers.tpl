{{/*
Names. Kubernetes object names and label values are limited to 63 characters
(DNS-1123 labels), so every generated name is truncated to 63 and stripped of a
trailing "-" that truncation may leave behind.
*/}}

{{/* The chart name, used in the app.kubernetes.io/name label. */}}
{{- define "trainwave.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The prefix of every object name: <release>-<chart>, or just <release> when the
release name already contains the chart name ("trainwave" rather than
"trainwave-trainwave").
*/}}
{{- define "trainwave.fullname" -}}
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

{{/* The metrics Service: truncate the prefix, not the suffix, so the name stays recognisable. */}}
{{- define "trainwave.metricsServiceName" -}}
{{- printf "%s-metrics" (include "trainwave.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end }}

{{/* The Secret with the operator's master status key; the operator creates it on first start. */}}
{{- define "trainwave.statusKeySecret" -}}
{{- printf "%s-status-key" (include "trainwave.fullname" . | trunc 52 | trimSuffix "-") }}
{{- end }}

{{/* The leader election Lease, and its Role and RoleBinding, which name it so no other Lease can be written. */}}
{{- define "trainwave.leaseName" -}}
{{- printf "%s-leader" (include "trainwave.fullname" . | trunc 56 | trimSuffix "-") }}
{{- end }}

{{/* helm.sh/chart label value; "+" from semver build metadata is not valid in a label. */}}
{{- define "trainwave.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object of the release. */}}
{{- define "trainwave.labels" -}}
helm.sh/chart: {{ include "trainwave.chart" . }}
{{ include "trainwave.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Selector labels. A Deployment's selector is immutable, so these never include
anything that changes between upgrades (version, chart). The component keeps the
operator's selector apart from other workloads of the same release.
*/}}
{{- define "trainwave.selectorLabels" -}}
app.kubernetes.io/name: {{ include "trainwave.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The ServiceAccount the operator runs as, created by the chart or not. */}}
{{- define "trainwave.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "trainwave.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The operator image; the tag follows the chart's appVersion unless pinned. */}}
{{- define "trainwave.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/*
What the operator changes in a namespace whose jobs it runs: the ClusterRole's rules
when it watches every namespace, a Role's in each of `watchNamespaces` otherwise.
*/}}
{{- define "trainwave.jobWriteRules" -}}
# Users own the spec: the operator writes only status, and deletes a job when
# ttlSecondsAfterFinished passes.
- apiGroups: ["trainwave.io"]
  resources: ["trainingjobs"]
  verbs: ["delete"]
- apiGroups: ["trainwave.io"]
  resources: ["trainingjobs/status"]
  verbs: ["patch"]
# Children carry ownerReferences with blockOwnerDeletion, which clusters with
# the OwnerReferencesPermissionEnforcement admission plugin allow only to
# those who may update the owner's finalizers.
- apiGroups: ["trainwave.io"]
  resources: ["trainingjobs/finalizers"]
  verbs: ["update"]
# Worker pods and their rendezvous Services: applied server-side (create on
# first apply, then patch), removed on gang restart and job end.
- apiGroups: [""]
  resources: ["pods", "services"]
  verbs: ["create", "patch", "delete"]
# Each Service's EndpointSlice, naming its workers: the Services have no selector,
# so kube-controller-manager does not write them (builders/service.py says why).
# deletecollection: the slices kube-controller-manager wrote for a job's Service
# while an earlier operator gave it a selector, which it leaves behind.
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["create", "patch", "deletecollection"]
# deletecollection of the Endpoints kube-controller-manager's endpoints controller wrote
# for such a Service, matched by name and its managed-by label: left behind, its
# EndpointSlice mirroring controller copies them into a slice of old addresses
# for a Service without a selector, and writes that slice again whenever it goes.
- apiGroups: [""]
  resources: ["endpoints"]
  verbs: ["deletecollection"]
# Each job's status key, mounted into its workers to sign their /status
# reports. Create only: the operator derives the key it verifies with from its
# master key and never reads these back; ownerReferences let GC remove them.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
# Events on its jobs, posted in the job's namespace: the operator's own through
# events.k8s.io, kopf's (handler errors) through the core API. With
# watchNamespaces these come from the Role in each watched namespace, so the
# operator can write no Event anywhere else; one it would post outside them is
# dropped with a log line (kube/recorder.py).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}

{{- /* What the operator reads in a namespace whose jobs it runs, from watches: granted
cluster-wide, or with watchNamespaces by the Role in each (the operator then lists and
watches each namespace through its namespaced endpoints, kube/namespaced.py). */}}
{{- define "trainwave.jobReadRules" -}}
# The jobs it reconciles and their rendezvous EndpointSlices: listed and watched
# (reconciles read the watched copy, never a GET).
- apiGroups: ["trainwave.io"]
  resources: ["trainingjobs"]
  verbs: ["list", "watch"]
- apiGroups: ["discovery.k8s.io"]
  resources: ["endpointslices"]
  verbs: ["list", "watch"]
# What could change or refuse a worker pod on its way in (a LimitRange, a
# ResourceQuota): read from watches, so a gang is placed before its pods exist
# only where nothing can. Without these the gate is always used.
- apiGroups: [""]
  resources: ["limitranges", "resourcequotas"]
  verbs: ["list", "watch"]
# The Events on a worker that sits Pending on its node (a volume that does not
# mount, a sandbox that does not start, an image still being pulled), listed by the
# pod's UID at most every 30 s while it sits, so the job says why it does not start
# (controller/pod_events.py). Never watched.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["list"]
{{- end }}

{{- define "trainwave.kueueWorkloadRules" -}}
# Kueue: each queued job's Workload, created with an ownerReference (GC removes
# it with the job) and read from a watch; its status is written to give the
# quota back after an eviction and to mark it Finished.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["create", "list", "watch", "patch"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["patch"]
{{- end }}
