{{/* The CPU image every service runs. */}}
{{- define "graylane.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end }}

{{/* Labels of the chart's own objects. */}}
{{- define "graylane.labels" -}}
app.kubernetes.io/name: graylane
app.kubernetes.io/part-of: graylane
{{- end }}

{{/* A model's stable version, the router's start: models[].stable, else its first version. */}}
{{- define "graylane.stableVersion" -}}
{{ .stable | default (index .versions 0).version | toString }}
{{- end }}

{{/* Every version of a model, comma-separated: the topics the topic Job creates. */}}
{{- define "graylane.versionList" -}}
{{- $versions := list }}
{{- range .versions }}
{{- $versions = append $versions (toString .version) }}
{{- end }}
{{- join "," $versions }}
{{- end }}
