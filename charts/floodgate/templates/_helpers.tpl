{{- define "floodgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "floodgate.fullname" -}}
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

{{- define "floodgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "floodgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "floodgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "floodgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "floodgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "floodgate.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "floodgate.rulesConfigMap" -}}
{{- default (printf "%s-rules" (include "floodgate.fullname" .)) .Values.existingRulesConfigMap -}}
{{- end -}}

{{/* How many pods share Redis, for each local fallback's share. */}}
{{- define "floodgate.instances" -}}
{{- if gt (int .Values.redis.instances) 0 -}}
{{- .Values.redis.instances -}}
{{- else if .Values.autoscaling.enabled -}}
{{- .Values.autoscaling.minReplicas -}}
{{- else -}}
{{- .Values.replicaCount -}}
{{- end -}}
{{- end -}}

{{/*
The Redis URL built from redis.*: the password is spliced in by Kubernetes
from $(FLOODGATE_REDIS_PASSWORD), which the Deployment defines first.
*/}}
{{- define "floodgate.redisURL" -}}
{{- $r := .Values.redis -}}
{{- $scheme := ternary "rediss" "redis" $r.tls.enabled -}}
{{- $addrs := $r.addresses -}}
{{- $first := first $addrs -}}
{{- $q := list -}}
{{- range rest $addrs }}{{ $q = append $q (printf "addr=%s" .) }}{{ end -}}
{{- $pw := ternary "$(FLOODGATE_REDIS_PASSWORD)" "" (ne $r.passwordSecret.name "") -}}
{{- if eq $r.mode "standalone" -}}
{{- $auth := "" -}}
{{- if or $r.username $pw }}{{ $auth = printf "%s:%s@" $r.username $pw }}{{ end -}}
{{- printf "%s://%s%s/%d" $scheme $auth $first (int $r.db) -}}
{{- else if eq $r.mode "sentinel" -}}
{{- $auth := "" -}}
{{- if $r.sentinelPasswordSecret.name }}{{ $auth = ":$(FLOODGATE_REDIS_SENTINEL_PASSWORD)@" }}{{ end -}}
{{- $q = prepend $q (printf "master_name=%s" $r.masterName) -}}
{{- if $r.username }}{{ $q = append $q (printf "username=%s" $r.username) }}{{ end -}}
{{- if $pw }}{{ $q = append $q (printf "password=%s" $pw) }}{{ end -}}
{{- printf "%s+sentinel://%s%s/%d?%s" $scheme $auth $first (int $r.db) (join "&" $q) -}}
{{- else if eq $r.mode "cluster" -}}
{{- $auth := "" -}}
{{- if or $r.username $pw }}{{ $auth = printf "%s:%s@" $r.username $pw }}{{ end -}}
{{- printf "%s+cluster://%s%s" $scheme $auth $first -}}{{ if $q }}?{{ join "&" $q }}{{ end -}}
{{- else -}}
{{- fail (printf "redis.mode must be standalone, sentinel or cluster, not %q" $r.mode) -}}
{{- end -}}
{{- end -}}

{{- define "floodgate.scheme" -}}
{{- ternary "HTTPS" "HTTP" .Values.tls.enabled -}}
{{- end -}}
