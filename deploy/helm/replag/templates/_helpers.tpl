{{/* The release's base name: RELEASE-replag, or RELEASE when it already says replag. */}}
{{- define "replag.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "replag.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "replag.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "replag.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "replag.secretName" -}}
{{- .Values.existingSecret | default (include "replag.fullname" .) -}}
{{- end -}}

{{/* Volumes every replag pod has: the config, the secrets, a writable home and /tmp
(the root file system is read-only). */}}
{{- define "replag.volumes" -}}
- name: config
  configMap:
    name: {{ include "replag.fullname" . }}
- name: secrets
  secret:
    secretName: {{ include "replag.secretName" . }}
    defaultMode: 0440
    items:
      - key: store-password
        path: store-password
- name: tmp
  emptyDir: {}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "replag.volumeMounts" -}}
- name: config
  mountPath: /etc/replag/config
  readOnly: true
- name: secrets
  mountPath: /etc/replag/secrets
  readOnly: true
- name: tmp
  mountPath: /tmp
- name: home
  mountPath: /var/lib/replag
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "replag.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "replag.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{/* What every replag pod's spec starts with. */}}
{{- define "replag.podSpec" -}}
serviceAccountName: {{ include "replag.serviceAccountName" . }}
automountServiceAccountToken: {{ .Values.serviceAccount.automountServiceAccountToken }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end -}}

{{/* The label the ServiceMonitor's and PodMonitor's jobLabel names: the Prometheus
Operator sets `job` from it, which the mixin's rules select (metrics.job). */}}
{{- define "replag.jobLabel" -}}
replag.io/job
{{- end -}}
