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

{{/* kvrouter.peers: "true" when the replicas learn their place among the
router replicas from their Pods (router.yaml peers; mode serve only). */}}
{{- define "kvrouter.peers" -}}
{{- $e := toString .Values.peers.enabled -}}
{{- if and (eq .Values.mode "serve") (or (eq $e "true") (and (eq $e "auto") (gt (int .Values.replicaCount) 1))) -}}
true
{{- end -}}
{{- end -}}

{{/* kvrouter.adminPort: admin.port when the admin listener is on, else
empty; mode epp has none. */}}
{{- define "kvrouter.adminPort" -}}
{{- if and .Values.admin .Values.admin.port -}}
{{- if ne .Values.mode "serve" -}}
{{- fail "admin.port needs mode serve (kvrouter epp has no admin listener)" -}}
{{- end -}}
{{- .Values.admin.port -}}
{{- end -}}
{{- end -}}

{{/* kvrouter.config: router.yaml, routerConfig rendered with tpl plus listen. */}}
{{- define "kvrouter.config" -}}
{{- if hasKey .Values.routerConfig "listen" -}}
{{- fail "routerConfig.listen is set by the chart from service.targetPort" -}}
{{- end -}}
listen: {{ printf ":%v" .Values.service.targetPort | quote }}
{{- if hasKey .Values.routerConfig "admin_listen" -}}
{{- fail "routerConfig.admin_listen is set by the chart from admin.port" -}}
{{- end }}
{{- if include "kvrouter.adminPort" . }}
admin_listen: {{ printf ":%v" .Values.admin.port | quote }}
{{- end }}
{{- if .Values.snapshot.enabled }}
{{- if hasKey .Values.routerConfig "snapshot" -}}
{{- fail "routerConfig.snapshot is set by the chart when snapshot.enabled" -}}
{{- end }}
snapshot:
  path: /var/lib/kvrouter/index.snap
  interval: {{ .Values.snapshot.interval | quote }}
{{- end }}
{{- if include "kvrouter.peers" . }}
{{- if hasKey .Values.routerConfig "peers" -}}
{{- fail "routerConfig.peers is set by the chart when peers.enabled (set peers.enabled: false to give your own)" -}}
{{- end }}
# The router replicas are this release's Ready Pods; each one's place among
# them (stripes, docs/routing.md) follows them live (docs/kubernetes.md).
peers:
  selector: {{ printf "app.kubernetes.io/name=%s,app.kubernetes.io/instance=%s" .Chart.Name .Release.Name | quote }}
{{- end }}
{{ tpl (toYaml .Values.routerConfig) . }}
{{- end -}}
