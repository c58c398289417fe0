"""The egress proxy's configuration: Squid allowing CONNECT to the provider host alone.

A session pod's only network route is this proxy (the NetworkPolicies of ``runner.k8s.policy``
see to that), so what Squid lets through is everything a session can reach. The rules, in the
order Squid applies them:

- anything but CONNECT is refused (403): no plain-HTTP fetches, nothing cached, and no
  request Squid would make on the session's behalf;
- a CONNECT to any port but the provider's is refused;
- a client (a session pod's address) with more than ``max_client_connections`` connections
  open is refused, so one session cannot take the proxy's connections from the others;
- a CONNECT to the provider host is allowed; ``dstdomain`` without a leading dot matches that
  exact name and no subdomain, and ``-n`` stops Squid from trying a reverse lookup when the
  CONNECT names an IP address (else anyone controlling a PTR record could make an address of
  theirs "be" the provider host);
- everything else is refused.

Squid answers a refused CONNECT on an ssl-bump port in its own way (hard-wired, not
configurable): "200 Connection established", then a TLS handshake with the proxy's own
throwaway certificate, then the 403 page inside that TLS. A client that does not trust that
certificate (none does) sees a failed handshake; either way nothing leaves the proxy, and the
403 is in the access log as TCP_DENIED. A plain-HTTP request gets its 403 directly.

An allowed CONNECT still says nothing about what the tunnel carries: TLS names its server in
the ClientHello (SNI), and a front end serving many names on one address follows the SNI, not
the CONNECT line. So the port is an ``ssl-bump`` port and Squid peeks at the ClientHello (step
1, which decrypts nothing), splices the tunnel only when the SNI is the provider host, and
terminates it otherwise, before anything reaches the client from upstream. A ClientHello
without SNI is judged by the CONNECT name, which is the provider host: such a tunnel still
goes to the provider's own address. (No SNI check can see a Host header inside the TLS; the
provider's front end must refuse a name it does not serve.) Traffic that is not TLS at all is
closed and never tunnelled (``on_unsupported_protocol`` defaults to respond).

Peeking needs Squid built with OpenSSL (Debian: ``squid-openssl``) and an ssl-bump port needs
a certificate although no allowed tunnel is ever decrypted (the only TLS Squid itself speaks
is the refusal above); a throwaway self-signed one is made at each start
(``squid_entrypoint``). ``generate-host-certificates=off`` because no certificate is ever
minted for a server, which also keeps Squid from starting its ``security_file_certgen``
helpers and their on-disk database.

Each tunnel's access-log line names the TLS server name its ClientHello asked for (``sni=``),
beside the CONNECT target and the upstream address.

The proxy runs non-root on a read-only root filesystem: the PID file, the certificate and
core dumps go to ``state_dir`` (a writable emptyDir), both logs go to the container's standard
streams, and there is no cache directory. The ICMP pinger (a setuid helper measuring routes
for cache peers) is off: there are no peers, and the pod may send no ICMP anyway. File
descriptors are capped because Squid sizes its tables by the limit, and container runtimes
often grant a million.
"""

from __future__ import annotations

import re
import shlex

STATE_DIR = "/run/squid"
CONF_PATH = "/etc/squid/squid.conf"
MAX_FILEDESCRIPTORS = 4096
MAX_CLIENT_CONNECTIONS = 32  # a CLI keeps a few; more from one session pod is a flood

_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_DNS_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")


def is_dns_name(host: str) -> bool:
    """A lowercase DNS host name (letters, digits, '-' and dots), nothing Squid could read as
    more than one configuration token. IP addresses are names too by this pattern; callers that
    must refuse them check that themselves."""
    return len(host) <= 253 and _DNS_NAME.fullmatch(host) is not None


def squid_conf(provider_host: str, provider_port: int = 443, listen_port: int = 3128, *,
               listen_address: str | None = None, state_dir: str = STATE_DIR,
               max_client_connections: int = MAX_CLIENT_CONNECTIONS) -> str:
    """squid.conf for an egress proxy that tunnels TLS to ``provider_host:provider_port`` only.

    ``listen_address`` binds one address (tests bind loopback); by default Squid listens on
    every address of the pod. ``state_dir`` must be writable and hold the certificate pair
    ``squid_entrypoint`` creates.
    """
    if not is_dns_name(provider_host):
        raise ValueError(f"provider host {provider_host!r} is not a DNS name")
    for name, port in (("provider_port", provider_port), ("listen_port", listen_port)):
        if not 0 < port < 65536:
            raise ValueError(f"{name} {port} is not a TCP port")
    if max_client_connections < 1:
        raise ValueError(f"max_client_connections {max_client_connections} is not a positive number")
    listen = f"{listen_address}:{listen_port}" if listen_address else str(listen_port)
    return f"""\
# Egress proxy of probe-runner: CONNECT to {provider_host}:{provider_port} alone, TLS SNI checked.
http_port {listen} ssl-bump tls-cert={state_dir}/tls.crt tls-key={state_dir}/tls.key generate-host-certificates=off

acl CONNECT method CONNECT
acl provider_port port {provider_port}
acl provider dstdomain -n {provider_host}
acl flood maxconn {max_client_connections}
http_access deny !CONNECT
http_access deny !provider_port
http_access deny flood
http_access allow provider
http_access deny all

acl step1 at_step SslBump1
acl provider_sni ssl::server_name --client-requested {provider_host}
ssl_bump peek step1
ssl_bump splice provider_sni
ssl_bump terminate all

cache deny all
cache_mem 0 MB
visible_hostname egress-proxy
httpd_suppress_version_string on
max_filedescriptors {MAX_FILEDESCRIPTORS}

logformat tunnel %ts.%03tu %6tr %>a %Ss/%03>Hs %<st %rm %ru sni=%ssl::>sni %<a
access_log stdio:/dev/stdout tunnel
cache_log /dev/stderr
logfile_rotate 0
netdb_filename none
pinger_enable off
pid_filename {state_dir}/squid.pid
coredump_dir {state_dir}
"""


def squid_entrypoint(conf_path: str = CONF_PATH, state_dir: str = STATE_DIR) -> str:
    """A POSIX shell script that makes the throwaway certificate pair and execs Squid in the
    foreground (``-N``: one process, no daemon, no kid processes, so the container's main
    process is Squid itself and its signals reach it).

    The certificate is never shown to anyone who trusts it: peek-and-splice hands the client
    the real server's certificate, and a terminated tunnel gets none. It exists because Squid
    refuses an ssl-bump port without one. A PID file left in the state directory by a
    previous container is removed first: the new Squid would find its own PID (1) in it and
    refuse to start as "already running". An EC key is made in milliseconds, so a fresh one
    per start costs nothing and no secret needs to be managed. The image needs ``squid``
    (with OpenSSL), ``openssl`` and ``/bin/sh``.
    """
    state = shlex.quote(state_dir)
    return f"""\
#!/bin/sh
set -eu
umask 077
mkdir -p {state}
rm -f {state}/squid.pid
openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \\
  -subj /CN=egress-proxy -keyout {state}/tls.key -out {state}/tls.crt 2>/dev/null
exec squid -N -f {shlex.quote(conf_path)}
"""
