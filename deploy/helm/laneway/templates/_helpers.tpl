{{/* Names: the release name when it already says laneway, else "<release>-laneway". */}}
{{- define "laneway.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else if contains "laneway" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-laneway" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "laneway.labels" -}}
app.kubernetes.io/name: laneway
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: laneway
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: (dict "ctx" $ "component" "broker"). */}}
{{- define "laneway.selector" -}}
app.kubernetes.io/name: laneway
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/*
Names the NATS subchart's values also use (through its $tplYaml): they are derived from the
release name only, because the subchart cannot call this chart's helpers with this chart's values.
*/}}
{{- define "laneway.natsAuthName" -}}{{ .Release.Name }}-nats-auth{{- end -}}
{{- define "laneway.natsKeyName" -}}{{ .Release.Name }}-nats-js-key{{- end -}}
{{- define "laneway.natsRoleSecret" -}}{{ .ctx.Release.Name }}-nats-{{ .role }}{{- end -}}
{{- define "laneway.bridgeSecret" -}}{{ include "laneway.fullname" . }}-bridge-secrets{{- end -}}
{{- define "laneway.natsTenantSecret" -}}{{ .Release.Name }}-nats-tenants{{- end -}}

{{/* The settings TOML: values.settings, else deploy/settings.toml. */}}
{{- define "laneway.settings" -}}
{{- .Values.settings | default (.Files.Get "files/settings.toml") -}}
{{- end -}}

{{/*
The NATS routes' URLs, the user and password in each: one per pod of the NATS chart's
StatefulSet, named as its files/config/cluster.yaml names them (nats.fullname, statefulSet.name,
headlessService.name, routeURLs.useFQDN, the cluster port, tls:// with cluster TLS), from the
NATS values as the parent sees them (the NATS chart's defaults coalesced in). A JSON list.
(dict "ctx" $ "user" U "password" P)
*/}}
{{- define "laneway.natsRouteURLs" -}}
{{- $nats := .ctx.Values.nats -}}
{{- $full := include "laneway.natsFullname" .ctx -}}
{{- $cluster := $nats.config.cluster -}}
{{- $domain := $nats.headlessService.name | default (printf "%s-headless" $full) -}}
{{- if $cluster.routeURLs.useFQDN -}}
{{- $domain = printf "%s.%s.svc.%s" $domain ($nats.namespaceOverride | default .ctx.Release.Namespace) $cluster.routeURLs.k8sClusterDomain -}}
{{- end -}}
{{- $proto := ternary "tls" "nats" $cluster.tls.enabled -}}
{{- $urls := list -}}
{{- range $i := until (int $cluster.replicas) -}}
{{- $urls = append $urls (printf "%s://%s:%s@%s-%d.%s:%d" $proto $.user $.password ($nats.statefulSet.name | default $full) $i $domain (int $cluster.port)) -}}
{{- end -}}
{{- $urls | toRawJson -}}
{{- end -}}

{{/* The NATS chart's fullname (its StatefulSet and client Service), as that chart computes it. */}}
{{- define "laneway.natsFullname" -}}
{{- $nats := .Values.nats -}}
{{- $full := printf "%s-%s" .Release.Name (default "nats" $nats.nameOverride) -}}
{{- if $nats.fullnameOverride -}}
{{- $full = $nats.fullnameOverride -}}
{{- else if contains (default "nats" $nats.nameOverride) .Release.Name -}}
{{- $full = .Release.Name -}}
{{- end -}}
{{- $full | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The bundled NATS speaks TLS (natsTls.enabled), so Laneway's pods trust its CA. */}}
{{- define "laneway.natsTlsOn" -}}
{{- if and .Values.nats.enabled .Values.natsTls.enabled (not .Values.natsUrl) }}true{{ end -}}
{{- end -}}
{{- define "laneway.natsCaName" -}}{{ .Release.Name }}-nats-ca{{- end -}}

{{/* The NATS chart's client Service, unless natsUrl points elsewhere; tls:// with natsTls. */}}
{{- define "laneway.natsUrl" -}}
{{- if .Values.natsUrl -}}
{{- .Values.natsUrl -}}
{{- else -}}
{{ ternary "tls" "nats" (eq (include "laneway.natsTlsOn" .) "true") }}://{{ include "laneway.natsFullname" . }}:4222
{{- end -}}
{{- end -}}

{{/*
The bundled NATS's TLS: a private CA and one certificate for the client Service and every pod
(routes are mutual TLS: the certificate is both server and client), kept across upgrades in the
auth Secret like the passwords. A JSON object: ca, crt, key (PEM).
*/}}
{{- define "laneway.natsTls" -}}
{{- $live := lookup "v1" "Secret" .Release.Namespace (include "laneway.natsAuthName" .) -}}
{{- if and $live $live.data (hasKey $live.data "tls.crt") (hasKey $live.data "tls.key") (hasKey $live.data "ca.crt") -}}
{{- dict "ca" (index $live.data "ca.crt" | b64dec) "crt" (index $live.data "tls.crt" | b64dec) "key" (index $live.data "tls.key" | b64dec) | toJson -}}
{{- else -}}
{{- $full := include "laneway.natsFullname" . -}}
{{- $headless := .Values.nats.headlessService.name | default (printf "%s-headless" $full) -}}
{{- $ns := .Values.nats.namespaceOverride | default .Release.Namespace -}}
{{- $domain := .Values.nats.config.cluster.routeURLs.k8sClusterDomain | default "cluster.local" -}}
{{- $names := list "localhost" -}}
{{- range $host := list $full (printf "*.%s" $headless) -}}
{{- $names = concat $names (list $host (printf "%s.%s" $host $ns) (printf "%s.%s.svc" $host $ns) (printf "%s.%s.svc.%s" $host $ns $domain)) -}}
{{- end -}}
{{- $ca := genCA (printf "%s NATS CA" .Release.Name) 3650 -}}
{{- $cert := genSignedCert $full nil $names 3650 $ca -}}
{{- dict "ca" $ca.Cert "crt" $cert.Cert "key" $cert.Key | toJson -}}
{{- end -}}
{{- end -}}

{{/* The CA's volume and its mount, for a Laneway pod that connects to the bundled NATS. */}}
{{- define "laneway.natsCaVolume" -}}
{{- if eq (include "laneway.natsTlsOn" .) "true" }}
- name: nats-ca
  configMap:
    name: {{ include "laneway.natsCaName" . }}
{{- end }}
{{- end -}}
{{- define "laneway.natsCaMount" -}}
{{- if eq (include "laneway.natsTlsOn" .) "true" }}
- name: nats-ca
  mountPath: /etc/laneway-nats-ca
  readOnly: true
{{- end }}
{{- end -}}

{{/* Environment every Laneway process shares: NATS URL and the role's credentials, log level, OTLP.
(dict "ctx" $ "role" "broker|worker|bridge|ops") */}}
{{- define "laneway.env" -}}
- name: LANEWAY_NATS_URL
  value: {{ include "laneway.natsUrl" .ctx | quote }}
{{- if eq (include "laneway.natsTlsOn" .ctx) "true" }}
- name: LANEWAY_NATS_TLS_CA          # the bundled NATS's CA, trusted alone (laneway.natsCaVolume)
  value: /etc/laneway-nats-ca/ca.crt
{{- end }}
{{- if .ctx.Values.natsAuth.enabled }}
- name: LANEWAY_NATS_USER
  valueFrom:
    secretKeyRef:
      name: {{ include "laneway.natsRoleSecret" . }}
      key: user
- name: LANEWAY_NATS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "laneway.natsRoleSecret" . }}
      key: password
{{- end }}
- name: LANEWAY_LOG_LEVEL
  value: {{ .ctx.Values.logLevel | quote }}
{{- with .ctx.Values.otel.endpoint }}
# Spans go over OTLP/HTTP (core/tracing.py); the CLI names the service laneway-<command>.
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ . | quote }}
{{- end }}
{{- end -}}

{{- define "laneway.image" -}}
{{- printf "%s:%s" .repository (.tag | toString) -}}
{{- end -}}

{{/* Container security shared by every Laneway container: the Dockerfile's laneway user, by uid
(the kubelet can check runAsNonRoot only against a numeric user), a read-only root filesystem
(writes go to the scratch emptyDirs below), no capability, the runtime's seccomp profile. */}}
{{- define "laneway.containerSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  runAsNonRoot: true
  runAsUser: 10001
  runAsGroup: 10001
  capabilities:
    drop: ["ALL"]
  seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{/* Pod-level security of every Laneway pod: no Kubernetes API token (no process calls the API). */}}
{{- define "laneway.podSecurity" -}}
automountServiceAccountToken: false
securityContext:
  runAsNonRoot: true
  runAsUser: 10001
  runAsGroup: 10001
  fsGroup: 10001
  seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{/* The writable places of a read-only root: /tmp and the laneway user's home (its caches:
Hugging Face, vLLM's compile cache, Triton). (dict "ctx" $ "vllm" true|false) */}}
{{- define "laneway.scratchMounts" -}}
- {name: tmp, mountPath: /tmp}
- {name: home, mountPath: /home/laneway}
{{- end -}}
{{- define "laneway.scratchVolumes" -}}
{{- $limit := ternary .ctx.Values.scratch.vllmSizeLimit .ctx.Values.scratch.sizeLimit (default false .vllm) }}
- name: tmp
  emptyDir: {sizeLimit: {{ $limit }}}
- name: home
  emptyDir: {sizeLimit: {{ $limit }}}
{{- end -}}

{{/* A password kept across upgrades: the one in the live Secret if there is one, else a new one. */}}
{{- define "laneway.keptSecret" -}}
{{- $live := lookup "v1" "Secret" .ctx.Release.Namespace .name -}}
{{- if and $live $live.data (hasKey $live.data .key) -}}
{{- index $live.data .key | b64dec -}}
{{- else -}}
{{- .fresh -}}
{{- end -}}
{{- end -}}
