{{/* kvrouter.fullname: release-chart name, at most 63 characters. */}}
{{- define "kvrouter.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* kvrouter.selectorLabels: the labels that select the router's Pods. */}}
{{- define "kvrouter.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kvrouter.labels" -}}
{{ include "kvrouter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "kvrouter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kvrouter.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kvrouter.engineNamespace" -}}
{{- default .Release.Namespace .Values.rbac.namespace -}}
{{- end -}}

{{/* kvrouter.config: router.yaml, routerConfig rendered with tpl plus listen. */}}
{{- define "kvrouter.config" -}}
{{- if hasKey .Values.routerConfig "listen" -}}
{{- fail "routerConfig.listen is set by the chart from service.targetPort" -}}
{{- end -}}
listen: {{ printf ":%v" .Values.service.targetPort | quote }}
{{- if .Values.snapshot.enabled }}
{{- if hasKey .Values.routerConfig "snapshot" -}}
{{- fail "routerConfig.snapshot is set by the chart when snapshot.enabled" -}}
{{- end }}
snapshot:
  path: /var/lib/kvrouter/index.snap
  interval: {{ .Values.snapshot.interval | quote }}
{{- end }}
{{ tpl (toYaml .Values.routerConfig) . }}
{{- end -}}
