{{/* The CPU image every service runs. */}}
{{- define "graylane.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end }}

{{/* Labels of the chart's own objects. */}}
{{- define "graylane.labels" -}}
app.kubernetes.io/name: graylane
app.kubernetes.io/part-of: graylane
{{- end }}
