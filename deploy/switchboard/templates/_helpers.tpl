{{/* Names, labels and the shared pieces of the pod specs. */}}

{{- define "switchboard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's base name; components append -relay, -transceiver, … (kept short enough for that). */}}
{{- define "switchboard.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "switchboard.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "switchboard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: switchboard
{{- end -}}

{{/* Selector labels of one component: include "switchboard.selector" (list . "relay") */}}
{{- define "switchboard.selector" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ include "switchboard.name" $ }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "switchboard.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "switchboard.tokenSecret" -}}
{{- default (printf "%s-token-keys" (include "switchboard.fullname" .)) .Values.tokenKeys.existingSecret -}}
{{- end -}}

{{/* The advertised relay VIP: publicIP:relay.service.port. */}}
{{- define "switchboard.advertise" -}}
{{- $ip := required "publicIP is required: the relay VIP clients send media to (reserve a static IP, set publicIP and give the IP to the relay Service)" .Values.publicIP -}}
{{- if contains ":" $ip -}}
{{- printf "[%s]:%d" $ip (int .Values.relay.service.port) -}}
{{- else -}}
{{- printf "%s:%d" $ip (int .Values.relay.service.port) -}}
{{- end -}}
{{- end -}}

{{/* The VIP's ICE-TCP ip:port in answers (-advertise-tcp): publicIP at the relay Service's TCP port. */}}
{{- define "switchboard.advertiseTCP" -}}
{{- $ip := .Values.publicIP -}}
{{- if contains ":" $ip -}}
{{- printf "[%s]:%d" $ip (int .Values.relay.service.tcpPort) -}}
{{- else -}}
{{- printf "%s:%d" $ip (int .Values.relay.service.tcpPort) -}}
{{- end -}}
{{- end -}}

{{- define "switchboard.backendURL" -}}
{{- if .Values.transceiver.backendURL -}}
{{- .Values.transceiver.backendURL -}}
{{- else if .Values.agent.enabled -}}
{{- printf "ws://%s-agent:%d/v1/bridge" (include "switchboard.fullname" .) (int .Values.agent.port) -}}
{{- else -}}
{{- fail "transceiver.backendURL is required when agent.enabled is false: the ws:// or wss:// URL of your backend bridge" -}}
{{- end -}}
{{- end -}}

{{/* Fleet token key variables, read by relays and transceivers. */}}
{{- define "switchboard.tokenEnv" -}}
- name: SWITCHBOARD_TOKEN_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "switchboard.tokenSecret" . }}
      key: token-key
- name: SWITCHBOARD_TOKEN_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ include "switchboard.tokenSecret" . }}
      key: token-key-id
      optional: true
- name: SWITCHBOARD_TOKEN_PREVIOUS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ include "switchboard.tokenSecret" . }}
      key: token-previous-key
      optional: true
- name: SWITCHBOARD_TOKEN_PREVIOUS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ include "switchboard.tokenSecret" . }}
      key: token-previous-key-id
      optional: true
{{- end -}}

{{/* Signaling auth variables (transceivers, director), when auth.existingSecret is set. */}}
{{- define "switchboard.authEnv" -}}
{{- with .Values.auth.existingSecret }}
- name: SWITCHBOARD_AUTH_SIGNING_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: signing-key
- name: SWITCHBOARD_AUTH_API_KEYS
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: api-keys
- name: SWITCHBOARD_AUTH_PREVIOUS_SIGNING_KEY
  valueFrom:
    secretKeyRef:
      name: {{ . }}
      key: previous-signing-key
      optional: true
- name: SWITCHBOARD_AUTH_TOKEN_TTL
  value: {{ $.Values.auth.tokenTTL | quote }}
{{- end }}
{{- end -}}

{{/* Pod annotations: Prometheus scraping and a checksum that rolls pods when the chart-managed keys change. */}}
{{- define "switchboard.podAnnotations" -}}
{{- $ := index . 0 -}}
{{- $port := index . 1 -}}
{{- $extra := index . 2 -}}
{{- if $.Values.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ $port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- if not $.Values.tokenKeys.existingSecret }}
checksum/token-keys: {{ include "switchboard.tokenKeyData" $ | sha256sum }}
{{- end }}
{{- with $extra }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The chart-managed Secret's data: given keys, else the key already in the cluster, else a new random one. */}}
{{- define "switchboard.tokenKeyData" -}}
{{- $name := printf "%s-token-keys" (include "switchboard.fullname" .) -}}
{{- $key := .Values.tokenKeys.key -}}
{{- if not $key -}}
{{- $old := lookup "v1" "Secret" .Release.Namespace $name -}}
{{- if and $old $old.data (index $old.data "token-key") -}}
{{- $key = index $old.data "token-key" | b64dec -}}
{{- else -}}
{{- $key = include "switchboard.generatedKey" . -}}
{{- end -}}
{{- end -}}
token-key: {{ $key | b64enc }}
token-key-id: {{ .Values.tokenKeys.keyId | toString | b64enc }}
{{- if .Values.tokenKeys.previousKey }}
token-previous-key: {{ .Values.tokenKeys.previousKey | b64enc }}
token-previous-key-id: {{ .Values.tokenKeys.previousKeyId | toString | b64enc }}
{{- end }}
{{- end -}}

{{/* A random key (32 bytes, base64), drawn once per render and kept in .Values so that the Secret and every checksum see the same one. */}}
{{- define "switchboard.generatedKey" -}}
{{- if not (hasKey .Values.tokenKeys "_generated") -}}
{{- $_ := set .Values.tokenKeys "_generated" (randBytes 32) -}}
{{- end -}}
{{- .Values.tokenKeys._generated -}}
{{- end -}}

{{- define "switchboard.affinity" -}}
{{- $ := index . 0 -}}
{{- $component := index . 1 -}}
{{- $given := index . 2 -}}
{{- if $given -}}
{{ toYaml $given }}
{{- else -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "switchboard.selector" (list $ $component) | nindent 12 }}
{{- end -}}
{{- end -}}
