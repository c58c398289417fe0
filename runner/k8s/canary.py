"""Confinement measured, not stated: the canary.

A NetworkPolicy is a request to whatever enforces policy on the node (or to nothing, on a
cluster whose network plugin enforces none); a foreign policy that also selects session pods
adds allow rules. So before a campaign's first session, and again every
``kube.canary_interval_seconds`` while it runs, the controller starts a canary pod: the
session pod's labels (every policy that selects sessions selects it), its image, uid,
security context and proxy settings, running ``python3 -m runner.entrypoints.canary`` instead of
the harness. The canary tries each route a session must not have and the one it must have, in
parallel, each bounded by a timeout, and writes what happened to its termination message,
which the controller reads from the pod's status (no log access needed).

A route is *open* when a connection is made (the TCP handshake completes, DNS answers); it
is *closed* otherwise: a timeout (a policy that drops), a refusal (a policy that rejects, as
kube-router's does, answers exactly like a port with no listener, so a refusal proves nothing
reached a service), an unreachable network, a refusal by the proxy. The one route that must
be open is the provider gateway (an HTTP answer to ``HEAD /``) or, where the gateway is off,
the provider through the egress proxy: CONNECT, TLS to the provider's name with certificate
verification, and an HTTP answer of any status.

A new pod's policy is not in force at once: an enforcer programs it after the pod has its
address (kube-router took about a second here, during which every route of a new pod was
open). So the canary, like the session entry point (runner/entrypoints/pod.py), first waits until a
route that must be closed, the API server's ClusterIP, stops connecting
(``wait_until_confined``), and reports how long that took; only then does it measure.

This module is what the controller builds and reads (the routes, their encoding, the report);
the canary pod runs runner/entrypoints/canary.py, which tries them.
"""

from __future__ import annotations

import base64
import json
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit

from runner.gateway.tokens import KEY_REFUSED  # the standard library alone: the canary pod runs this

TERMINATION_LOG = "/dev/termination-log"
CONNECT_TIMEOUT = 4.0  # seconds per try; the routes run in parallel
SETTLE_SECONDS = 30.0  # longest wait for the pod's policy to be in force before measuring
METADATA_ADDRESS = "169.254.169.254"
METADATA_ADDRESS_V6 = "fd00:ec2::254"  # the metadata service's IPv6 address (EC2's; others serve only IPv4)
OUTSIDE_V6 = "2001:4860:4860::8888"  # a public IPv6 address (a public resolver), as any host outside would be


KEY_ROUTE = "the provider gateway's key check (a token count)"


@dataclass(frozen=True)
class Route:
    """One route to try. ``target`` is host:port, or an http URL for ``proxy-http``; ``{dns}``,
    ``{api}``, ``{node}`` and ``{gateway}`` stand for what only the pod knows (its name server,
    the API server's ClusterIP and port, its node's address, the gateway's ClusterIP and port)."""

    name: str
    kind: str  # tcp | dns | http | http-key | proxy-tls | proxy-http | gateway-server-tool | gateway-mcp
    target: str
    server_name: str | None = None
    must_open: bool = False


@dataclass(frozen=True)
class Result:
    name: str
    target: str
    must_open: bool
    opened: bool
    detail: str


def routes(provider_url: str, provider_addresses: list[str], neighbour: str | None, foreign_hosts: list[str],
           extra_targets: list[str], gateway: bool = False, token: bool = False) -> list[Route]:
    """Every route item 5 of the design names, for this install, over IPv4 and IPv6 (a pod with
    no IPv6 address finds those closed). ``provider_addresses``: the provider host's addresses
    (both families) as the controller resolves them; ``neighbour``: host:port of
    another pod on a port its policy does not open (e.g. an egress proxy pod's port 80).
    ``gateway``: the session's one route is the provider gateway (``{gateway}``, which must
    answer), not the egress proxy; with a ``token`` of its own (a check's, limited to $0), the
    canary also asks the gateway to have the provider act for it (a server tool, an MCP server
    at the metadata service's URL: routes out through the provider), which it must refuse."""
    u = urlsplit(provider_url)
    host, port = u.hostname or "", u.port or 443
    out = [
        Route("cluster DNS", "dns", "{dns}"),
        Route("the API server by its ClusterIP", "tcp", "{api}"),
        Route("the API server on the node's address", "tcp", "{node}:6443"),
        Route("the kubelet on the node's address", "tcp", "{node}:10250"),
        Route("the metadata service", "tcp", f"{METADATA_ADDRESS}:80"),
        Route("the metadata service over IPv6", "tcp", f"[{METADATA_ADDRESS_V6}]:80"),
        Route("an outside address over IPv6", "tcp", f"[{OUTSIDE_V6}]:443"),
    ]
    if neighbour:
        out.append(Route("another pod", "tcp", neighbour))
    out += [Route("the provider directly", "tcp", hostport(ip, port)) for ip in provider_addresses]
    out += [Route(f"{t} directly", "tcp", t) for t in extra_targets]
    if gateway:
        if token:
            out += [Route("a server tool through the gateway (web_fetch)", "gateway-server-tool", "{gateway}"),
                    Route("an MCP server through the gateway (the metadata service's URL)", "gateway-mcp", "{gateway}")]
        return [*out, Route("the provider gateway", "http", "{gateway}", must_open=True),
                Route(KEY_ROUTE, "http-key", "{gateway}", must_open=True)]
    out.append(Route("the provider through the egress proxy", "proxy-tls", f"{host}:{port}", host, must_open=True))
    if provider_addresses:
        out.append(Route("the provider by address through the egress proxy", "proxy-tls",
                         hostport(provider_addresses[0], port), host))
    for other in foreign_hosts:
        out.append(Route(f"{other} through the egress proxy", "proxy-tls", f"{other}:443", other))
    if foreign_hosts:
        out.append(Route("the provider under another TLS server name", "proxy-tls", f"{host}:{port}", foreign_hosts[0]))
    out.append(Route("plain HTTP through the egress proxy", "proxy-http", f"http://{host}:{port}/"))
    return out


def hostport(ip: str, port: int) -> str:
    """``ip:port``, an IPv6 address in brackets."""
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def key_refused(results: list[Result]) -> bool:
    """Whether the key check found the provider refusing the install's key: not a route that
    failed but a setting to fix (the credentials Secret), as a session's refused key is."""
    return any(r.name == KEY_ROUTE and not r.opened and r.detail.startswith(KEY_REFUSED) for r in results)


def judge(results: list[Result]) -> str | None:
    """The first thing wrong with a canary's results, stated for a user, or None."""
    for r in results:
        if key_refused([r]):
            return f"{r.detail} ({r.name})"
    for r in results:
        if r.must_open and not r.opened:
            return f"the provider path failed: {r.name} ({r.target}): {r.detail}"
    for r in results:
        if r.opened and not r.must_open:
            return f"a route opened: {r.name} ({r.target}): {r.detail}"
    if not any(r.must_open for r in results):
        return "the canary tried no provider path"
    return None


def encode(rs: list[Route]) -> str:
    """The routes as the canary's argument (base64 of JSON: one plain word); ``main`` reads it."""
    return base64.b64encode(json.dumps([asdict(r) for r in rs], separators=(",", ":")).encode()).decode()


def decode_report(message: str) -> tuple[list[Result], float | None]:
    """The canary's termination message, back into its results and the seconds its policy took
    to be in force (None: not in force when it measured); ValueError if it is not a report."""
    try:
        data = json.loads(message)
        results = [Result(r["name"], r["target"], bool(r["must_open"]), bool(r["opened"]), str(r["detail"]))
                   for r in data["results"]]
        settled = data["settled_seconds"]
        return results, None if settled is None else float(settled)
    except (ValueError, TypeError, KeyError) as e:
        raise ValueError(f"not a canary report: {e}") from None
