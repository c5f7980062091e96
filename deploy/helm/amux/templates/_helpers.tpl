{{- define "amux.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "amux.hubName" -}}{{ include "amux.fullname" . }}-hub{{- end -}}
{{- define "amux.workerName" -}}{{ include "amux.fullname" . }}-worker{{- end -}}

{{- define "amux.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component (hub or worker): the NetworkPolicy keys on these. */}}
{{- define "amux.selectorLabels" -}}
app.kubernetes.io/name: {{ .context.Chart.Name }}
app.kubernetes.io/instance: {{ .context.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "amux.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "amux.feishuSecretName" -}}
{{ .Values.hub.feishu.existingSecret | default (printf "%s-feishu" (include "amux.fullname" .)) }}
{{- end -}}

{{- define "amux.feishuSecretUsed" -}}
{{- $f := .Values.hub.feishu -}}
{{- if or $f.existingSecret $f.appId $f.appSecret $f.encryptKey $f.verificationToken -}}true{{- end -}}
{{- end -}}

{{- define "amux.providerSecretName" -}}
{{ .Values.worker.providers.existingSecret | default (printf "%s-providers" (include "amux.fullname" .)) }}
{{- end -}}

{{- define "amux.providerSecretUsed" -}}
{{- $p := .Values.worker.providers -}}
{{- if or $p.existingSecret $p.anthropicApiKey $p.openaiApiKey -}}true{{- end -}}
{{- end -}}

{{- define "amux.tokenSecretName" -}}
{{ .Values.worker.token.existingSecret | default (printf "%s-worker-token" (include "amux.fullname" .)) }}
{{- end -}}

{{- define "amux.hubUrl" -}}
http://{{ include "amux.hubName" . }}.{{ .Release.Namespace }}.svc:{{ .Values.hub.port }}
{{- end -}}

{{- define "amux.kedaQuery" -}}
{{- .Values.worker.keda.query | default (printf "sum(amux_executions{state=~\"queued|running\",namespace=\"%s\"})" .Release.Namespace) -}}
{{- end -}}

{{/* Agents in pods of their own (worker.sandbox agent-sandbox). */}}
{{- define "amux.agentSandbox" -}}
{{- if eq .Values.worker.sandbox "agent-sandbox" -}}true{{- end -}}
{{- end -}}

{{- define "amux.agentName" -}}{{ include "amux.fullname" . }}-agent{{- end -}}

{{- define "amux.workClaimName" -}}
{{ .Values.worker.agentSandbox.workDir.existingClaim | default (printf "%s-work" (include "amux.fullname" .)) }}
{{- end -}}
