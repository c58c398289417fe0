#!/bin/sh
set -eu
umask 077
mkdir -p /run/squid
rm -f /run/squid/squid.pid
openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
  -subj /CN=egress-proxy -keyout /run/squid/tls.key -out /run/squid/tls.crt 2>/dev/null
exec squid -N -f /etc/squid/squid.conf
