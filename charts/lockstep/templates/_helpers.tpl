{{/* Names and labels shared by every template. */}}

{{- define "lockstep.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The prefix of every object name: fullnameOverride, else the release name (plus the chart
name unless the release name already contains it). */}}
{{- define "lockstep.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "lockstep.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
app.kubernetes.io/name: {{ include "lockstep.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: lockstep
{{- end -}}

{{/* Selects the operator pods (Deployment, metrics Service; the rendezvous Service adds the
leader label). */}}
{{- define "lockstep.operatorSelectorLabels" -}}
app.kubernetes.io/name: {{ include "lockstep.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "lockstep.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "lockstep.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "lockstep.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag -}}
{{- end -}}

{{- define "lockstep.operatorImage" -}}
{{- printf "%s/%s:%s" .Values.image.registry .Values.operator.repository (include "lockstep.imageTag" .) -}}
{{- end -}}

{{- define "lockstep.workerImage" -}}
{{- printf "%s/%s:%s" .Values.image.registry .Values.worker.repository (include "lockstep.imageTag" .) -}}
{{- end -}}

{{- define "lockstep.agentImage" -}}
{{- printf "%s/%s:%s" .Values.image.registry .Values.agent.repository (include "lockstep.imageTag" .) -}}
{{- end -}}
