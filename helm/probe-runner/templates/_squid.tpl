{{/*
squid.conf and the proxy's entry point: the text of runner/k8s/egress.py's squid_conf() and
squid_entrypoint() (tests/integration/test_chart.py compares them).
*/}}
{{- define "probe-runner.squidConf" -}}
{{- $host := include "probe-runner.providerHost" . -}}
{{- $port := include "probe-runner.providerPort" . -}}
{{- $listen := .Values.egressProxy.port -}}
# Egress proxy of probe-runner: CONNECT to {{ $host }}:{{ $port }} alone, TLS SNI checked.
http_port {{ $listen }} ssl-bump tls-cert=/run/squid/tls.crt tls-key=/run/squid/tls.key generate-host-certificates=off

acl CONNECT method CONNECT
acl provider_port port {{ $port }}
acl provider dstdomain -n {{ $host }}
acl flood maxconn {{ .Values.egressProxy.maxClientConnections }}
http_access deny !CONNECT
http_access deny !provider_port
http_access deny flood
http_access allow provider
http_access deny all

acl step1 at_step SslBump1
acl provider_sni ssl::server_name --client-requested {{ $host }}
ssl_bump peek step1
ssl_bump splice provider_sni
ssl_bump terminate all

cache deny all
cache_mem 0 MB
visible_hostname egress-proxy
httpd_suppress_version_string on
max_filedescriptors 4096

logformat tunnel %ts.%03tu %6tr %>a %Ss/%03>Hs %<st %rm %ru sni=%ssl::>sni %<a
access_log stdio:/dev/stdout tunnel
cache_log /dev/stderr
logfile_rotate 0
netdb_filename none
pinger_enable off
pid_filename /run/squid/squid.pid
coredump_dir /run/squid
{{- end }}

{{- define "probe-runner.proxyEntrypoint" -}}
#!/bin/sh
set -eu
umask 077
mkdir -p /run/squid
rm -f /run/squid/squid.pid
openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
  -subj /CN=egress-proxy -keyout /run/squid/tls.key -out /run/squid/tls.crt 2>/dev/null
exec squid -N -f /etc/squid/squid.conf
{{- end }}
