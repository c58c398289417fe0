{{/*
Names and labels. Label keys are runner/k8s/names.py's: the controller selects session pods and
the NetworkPolicies select pods by app.kubernetes.io/{name,instance,component}; the instance is
the release name.
*/}}

{{- define "probe-runner.name" -}}probe-runner{{- end }}

{{- define "probe-runner.controllerName" -}}{{ .Release.Name }}-controller{{- end }}
{{- define "probe-runner.sessionName" -}}{{ .Release.Name }}-session{{- end }}
{{- define "probe-runner.settingsName" -}}{{ .Release.Name }}-settings{{- end }}
{{- define "probe-runner.proxyName" -}}{{ .Release.Name }}-egress-proxy{{- end }}
{{- define "probe-runner.providerCAName" -}}{{ .Release.Name }}-provider-ca{{- end }}
{{- define "probe-runner.gatewayName" -}}{{ .Release.Name }}-gateway{{- end }}
{{- define "probe-runner.gatewaySecretName" -}}{{ .Values.gateway.existingSecret | default (include "probe-runner.gatewayName" .) }}{{- end }}

{{/* The selector of one component: include "probe-runner.selector" (dict "root" $ "component" "x") */}}
{{- define "probe-runner.selector" -}}
app.kubernetes.io/name: {{ include "probe-runner.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "probe-runner.labels" -}}
{{ include "probe-runner.selector" . }}
app.kubernetes.io/part-of: {{ include "probe-runner.name" .root }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end }}

{{/* The provider's host and port, from provider.baseUrl (https only: the proxy tunnels TLS). */}}
{{- define "probe-runner.providerHost" -}}
{{- (urlParse .Values.provider.baseUrl).hostname -}}
{{- end }}
{{- define "probe-runner.providerPort" -}}
{{- $port := regexFind ":[0-9]+$" (urlParse .Values.provider.baseUrl).host | trimPrefix ":" -}}
{{- $port | default "443" -}}
{{- end }}

{{/*
runner/k8s/names.py's object_name(*parts), for the objects whose names the Python side
computes too (the NetworkPolicies: the controller tells its own from foreign ones by name):
a readable prefix, then 10 hex of the sha256 of the parts joined by NUL.
include "probe-runner.objectName" (list "a" "b")
*/}}
{{- define "probe-runner.objectName" -}}
{{- $suffix := join "\x00" . | sha256sum | trunc 10 -}}
{{- $readable := regexReplaceAll "[^a-z0-9]+" (join "-" . | lower) "-" | trimAll "-" | trunc 52 | trimSuffix "-" -}}
{{- if $readable }}{{ $readable }}-{{ $suffix }}{{ else }}{{ $suffix }}{{ end -}}
{{- end }}

{{/* runner/k8s/names.py's label_value(value): the exact value goes in an annotation. */}}
{{- define "probe-runner.labelValue" -}}
{{- $v := regexReplaceAll "[^A-Za-z0-9_.-]+" . "-" -}}
{{- if gt (len $v) 63 }}{{ $v = include "probe-runner.objectName" (list .) }}{{ end -}}
{{- $v = trimAll "-_." $v -}}
{{- $v | default (include "probe-runner.objectName" (list .)) -}}
{{- end }}

{{/* The container securityContext every container of this chart runs with. */}}
{{- define "probe-runner.containerSecurity" -}}
runAsNonRoot: true
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
privileged: false
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
The API server's endpoints as JSON [{cidr, port}] (runner/settings.py's kube.api_server):
networkPolicy.apiServer, else the kubernetes EndpointSlice of the default namespace as the
cluster holds it at install, else [] (helm template: not known).
*/}}
{{- define "probe-runner.apiServer" -}}
{{- $out := list -}}
{{- if .Values.networkPolicy.apiServer -}}
{{- $out = .Values.networkPolicy.apiServer -}}
{{- else -}}
{{- $slice := lookup "discovery.k8s.io/v1" "EndpointSlice" "default" "kubernetes" -}}
{{- if $slice -}}
{{- $bits := ternary "128" "32" (eq ($slice.addressType | default "IPv4") "IPv6") -}}
{{- range $slice.endpoints -}}
{{- range .addresses -}}
{{- $addr := . -}}
{{- range $slice.ports -}}
{{- $out = append $out (dict "cidr" (printf "%s/%s" $addr $bits) "port" (.port | int)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $out | toJson -}}
{{- end }}

{{/*
Egress to the provider's port at networkPolicy.providerIPBlocks and DNS to the cluster DNS pods
alone: the egress proxy's and the gateway's (runner/k8s/policy.py's _provider_and_dns).
*/}}
{{- define "probe-runner.providerAndDNSEgress" -}}
- to:
    {{- range .Values.networkPolicy.providerIPBlocks }}
    - ipBlock:
        cidr: {{ .cidr | quote }}
        {{- with .except }}
        except: {{ toJson . }}
        {{- end }}
    {{- end }}
  ports:
    - protocol: TCP
      port: {{ include "probe-runner.providerPort" . | int }}
- to:
    - namespaceSelector:
        matchLabels:
          kubernetes.io/metadata.name: {{ .Values.networkPolicy.dns.namespace | quote }}
      podSelector:
        matchLabels:
          {{- toYaml .Values.networkPolicy.dns.podLabels | nindent 10 }}
  ports:
    - protocol: UDP
      port: 53
    - protocol: TCP
      port: 53
{{- end }}

{{/* The metrics Services (templates/metrics.yaml) and the label the ServiceMonitor selects them by. */}}
{{- define "probe-runner.controllerMetricsName" -}}{{ .Release.Name }}-controller-metrics{{- end }}
{{- define "probe-runner.gatewayMetricsName" -}}{{ .Release.Name }}-gateway-metrics{{- end }}
{{- define "probe-runner.metricsLabel" -}}probe-runner.io/metrics{{- end }}

{{/*
The reference every pod uses for image `name` (harness, runner, egressProxy): images.<name> as
given, or, with images.<name>Digest, its repository (the tag dropped) @ that digest. Both at
once would name two digests or a tag and a digest apart: refused.
include "probe-runner.image" (dict "root" $ "name" "harness")
*/}}
{{- define "probe-runner.image" -}}
{{- $ref := index .root.Values.images .name -}}
{{- $digest := index .root.Values.images (printf "%sDigest" .name) -}}
{{- if not $digest -}}
{{- $ref -}}
{{- else if contains "@" $ref -}}
{{- fail (printf "images.%s names a digest already (%s): leave images.%sDigest empty, or give images.%s by tag" .name $ref .name .name) -}}
{{- else -}}
{{- regexReplaceAll ":[^:/]+$" $ref "" }}@{{ $digest -}}
{{- end -}}
{{- end }}

{{- define "probe-runner.prePullName" -}}{{ .Release.Name }}-prepull{{- end }}
