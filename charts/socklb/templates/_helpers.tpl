{{/* Chart name, overridable. */}}
{{- define "socklb.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified name: the release name if it contains the chart name. */}}
{{- define "socklb.fullname" -}}
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

{{- define "socklb.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "socklb.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "socklb.selectorLabels" -}}
app.kubernetes.io/name: {{ include "socklb.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "socklb.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "socklb.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "socklb.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Where the containers mount the node's bpffs: outside /sys, whose subtrees the
runtimes' default AppArmor profiles make unwritable (all but /sys/fs/cgroup). */}}
{{- define "socklb.bpffsMount" -}}
/run/socklb/bpffs
{{- end }}

{{/* The directory the agent pins its maps and links in (--bpffs, and SOCKLB_BPFFS for
commands run with `kubectl exec`): <hostPaths.bpffs>/socklb on the node. */}}
{{- define "socklb.pinDir" -}}
{{- printf "%s/socklb" (include "socklb.bpffsMount" .) }}
{{- end }}

{{/* The port of a bind address (IP:PORT or [IPv6]:PORT). */}}
{{- define "socklb.port" -}}
{{- last (splitList ":" .) }}
{{- end }}

{{/*
The host of a bind address, without brackets; empty for a wildcard address (0.0.0.0, [::]),
which probes reach on the pod's (the node's) IP.
*/}}
{{- define "socklb.host" -}}
{{- $port := include "socklb.port" . }}
{{- $host := trimSuffix (printf ":%s" $port) . | trimPrefix "[" | trimSuffix "]" }}
{{- if not (has $host (list "0.0.0.0" "::")) }}
{{- $host }}
{{- end }}
{{- end }}

{{/* Settings that cannot be expressed in values.schema.json. */}}
{{- define "socklb.validate" -}}
{{- if and .Values.agent.enabled .Values.cleanup.enabled }}
{{- fail "cleanup.enabled removes what the agent programs: set agent.enabled=false with it (see README.md, Uninstall)" }}
{{- end }}
{{- $healthzPort := include "socklb.port" .Values.healthz.bindAddress }}
{{- $metricsPort := include "socklb.port" .Values.metrics.bindAddress }}
{{- if eq $healthzPort $metricsPort }}
{{- fail (printf "healthz.bindAddress and metrics.bindAddress use the same port %s: give them different ports" $healthzPort) }}
{{- end }}
{{- if and (eq .Values.seccompProfile.type "Localhost") (not .Values.seccompProfile.localhostProfile) }}
{{- fail "seccompProfile.type=Localhost needs seccompProfile.localhostProfile: the profile's path relative to the kubelet's seccomp directory" }}
{{- end }}
{{- if .Values.serviceMonitor.enabled }}
{{- $host := include "socklb.host" .Values.metrics.bindAddress }}
{{- if or (hasPrefix "127." $host) (eq $host "::1") }}
{{- fail (printf "serviceMonitor.enabled: Prometheus cannot scrape the loopback address %s: set metrics.bindAddress to e.g. 0.0.0.0:%s" .Values.metrics.bindAddress $metricsPort) }}
{{- end }}
{{- end }}
{{- end }}

{{/* The agent container's security context: the capabilities and seccomp profile of the
values, or privileged. */}}
{{- define "socklb.securityContext" -}}
# uid 0, because Kubernetes grants added capabilities to root only;
# with everything else dropped, this root is not privileged.
runAsUser: 0
runAsGroup: 0
readOnlyRootFilesystem: true
{{- if .Values.privileged }}
privileged: true
{{- else }}
privileged: false
allowPrivilegeEscalation: false
capabilities:
  drop:
    - ALL
  add:
    {{- $capabilities := .Values.capabilities }}
    {{- if and .Values.closeSocketsInPods (not (has "SYS_ADMIN" $capabilities)) }}
    {{- $capabilities = append $capabilities "SYS_ADMIN" }}
    {{- end }}
    {{- toYaml $capabilities | nindent 4 }}
seccompProfile:
  type: {{ .Values.seccompProfile.type }}
  {{- if eq .Values.seccompProfile.type "Localhost" }}
  localhostProfile: {{ .Values.seccompProfile.localhostProfile | quote }}
  {{- end }}
{{- end }}
{{- end }}
