{{/*
Names and labels of the node agent. Its objects share the release's labels but
carry `app.kubernetes.io/component: agent`, so the DaemonSet's selector never
matches the operator's pods, nor the operator's selector the agent's.
*/}}

{{/* <fullname>-agent, the prefix truncated so the suffix always survives the 63-char limit. */}}
{{- define "trainwave.agent.fullname" -}}
{{- printf "%s-agent" (include "trainwave.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}

{{- define "trainwave.agent.selectorLabels" -}}
{{- merge (dict "app.kubernetes.io/component" "agent") (include "trainwave.selectorLabels" . | fromYaml) | toYaml }}
{{- end }}

{{- define "trainwave.agent.labels" -}}
{{- merge (dict "app.kubernetes.io/component" "agent") (include "trainwave.labels" . | fromYaml) | toYaml }}
{{- end }}

{{/* The ServiceAccount the agent runs as, created by the chart or not. */}}
{{- define "trainwave.agent.serviceAccountName" -}}
{{- if .Values.agent.serviceAccount.create }}
{{- default (include "trainwave.agent.fullname" .) .Values.agent.serviceAccount.name }}
{{- else }}
{{- required "agent.serviceAccount.name is required when agent.serviceAccount.create is false" .Values.agent.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The agent image; the tag follows the chart's appVersion unless pinned. */}}
{{- define "trainwave.agent.image" -}}
{{- printf "%s:%s" .Values.agent.image.repository (.Values.agent.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* The agent's own-node admission policy and its binding: <fullname>-agent-own-node within 63. */}}
{{- define "trainwave.agent.ownNodePolicy" -}}
{{- printf "%s-agent-own-node" (include "trainwave.fullname" . | trunc 48 | trimSuffix "-") }}
{{- end }}
