"""The network confinement of session pods: NetworkPolicies, the address of their one route in
the pod, and the start-up check that no other policy reopens what ours close.

A session pod may reach the provider gateway's pods on the gateway port and nothing else: no
DNS, no API server, no metadata service, no other pod. The gateway (runner/gateway/) then
forwards the Messages API calls of a valid session token to the provider. Where the gateway is
off (gateway.enabled false: a credentials.json login), the one route is the egress proxy
instead, which (``runner.k8s.egress``) allows CONNECT to the provider host alone. The proxy
pods accept connections from session pods only and may reach TCP on the provider port (any
address: Squid's ACL restricts the host) and DNS to resolve that host. Where the cluster runs
Cilium, ``cilium_fqdn_policy`` can replace the proxy's any-address egress with the provider
host's own addresses.

Everything here is a pure builder; the chart renders what these return and the executor
checks the namespace against them.
"""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlsplit

from runner.errors import UserError
from runner.k8s import names
from runner.k8s.egress import is_dns_name
from runner.settings import Settings

DNS_PORT = 53
HTTPS_PORT = 443
API_SERVER_PORTS = (443, 6443)  # the kubernetes Service's port, and the API server's own on most clusters
LINK_LOCAL_V4, LINK_LOCAL_V6 = "169.254.0.0/16", "fe80::/10"  # the metadata service's
# Where Cilium's DNS proxy sees the proxy pods' lookups: the cluster DNS pods (kube-dns or
# CoreDNS, both labelled k8s-app=kube-dns in kube-system).
CLUSTER_DNS = {"k8s:io.kubernetes.pod.namespace": "kube-system", "k8s:k8s-app": "kube-dns"}
# Labels whose values differ from one session pod to the next (see foreign_policies_selecting).
PER_SESSION_LABELS = frozenset({names.CAMPAIGN, names.PROBE, names.SESSION, names.ATTEMPT})


def provider_endpoint(settings: Settings) -> tuple[str, int]:
    """(host, port) of ``provider.base_url``: the one destination the egress proxy allows.

    Refused unless https with a DNS host name: the proxy tunnels TLS only (CONNECT, SNI
    checked), SNI carries names and never addresses, and Cilium's toFQDNs needs a name too.
    """
    url = settings.provider.base_url
    try:
        parts = urlsplit(url)
        port = parts.port or HTTPS_PORT
    except ValueError as e:
        raise UserError(f"provider.base_url {url!r}: {e}") from None
    if parts.scheme != "https" or not parts.hostname:
        raise UserError(f"provider.base_url {url!r}: the kubernetes executor's egress proxy only tunnels TLS, "
                        "so it must be an https:// URL with a host")
    if _is_ip(parts.hostname) or not is_dns_name(parts.hostname):
        raise UserError(f"provider.base_url {url!r}: the host must be a DNS name, not an address "
                        "(the egress proxy checks the TLS server name against it)")
    return parts.hostname, port


def _service_endpoint(url: str, field: str, what: str) -> tuple[str, int]:
    """(host, port) of an in-cluster http://HOST:PORT setting. The port must be explicit: the
    NetworkPolicies open exactly that port on the Service's pods, so the Service's port must
    equal its targetPort and the server's listen port (policies see the pod port, after the
    Service's translation)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise UserError(f"{field} {url!r}: {e}") from None
    if parts.scheme != "http" or not parts.hostname or port is None:
        raise UserError(f"{field} {url!r}: must be http://HOST:PORT ({what})")
    return parts.hostname, port


def proxy_endpoint(settings: Settings) -> tuple[str, int]:
    """(host, port) of ``kube.proxy_url``."""
    return _service_endpoint(settings.kube.proxy_url, "kube.proxy_url", "the egress proxy Service and its port")


def gateway_endpoint(settings: Settings) -> tuple[str, int]:
    """(host, port) of ``kube.gateway_url``."""
    return _service_endpoint(settings.kube.gateway_url, "kube.gateway_url", "the provider gateway Service and its port")


def route(settings: Settings) -> tuple[str, str, int]:
    """The session pods' one route: (component, host, port) of the provider gateway, or of the
    egress proxy where gateway.enabled is false."""
    if settings.gateway.enabled:
        return (names.GATEWAY_COMPONENT, *gateway_endpoint(settings))
    return (names.PROXY_COMPONENT, *proxy_endpoint(settings))


def route_service_name(settings: Settings) -> str | None:
    """The Service whose ClusterIP ``session_route_url`` needs, or None when the route's URL
    already names an address. A qualified name (``svc.ns``, ``svc.ns.svc.cluster.local``)
    must name our own namespace: a NetworkPolicy's podSelector only reaches pods there."""
    component, host, _ = route(settings)
    if _is_ip(host):
        return None
    service, _, rest = host.partition(".")
    namespace = rest.split(".")[0]
    if namespace and namespace != settings.kube.namespace:
        what = "provider gateway" if component == names.GATEWAY_COMPONENT else "egress proxy"
        raise UserError(f"the {what} Service must be in namespace {settings.kube.namespace}, not {namespace} "
                        f"(the NetworkPolicy only admits its pods there)")
    return service


def session_route_url(settings: Settings, cluster_ip: str | None) -> str:
    """The session's route by address: the Service's ClusterIP and port, never its name
    (ANTHROPIC_BASE_URL to the gateway, or HTTPS_PROXY to the egress proxy).

    A session pod may send no DNS query (DESIGN: "DNS and every other host are closed"), so
    it cannot resolve the Service name. The executor reads the Service named by
    ``route_service_name`` once and passes its ``spec.clusterIP`` here. An address needs no
    resolver at all, where a hostAliases entry would work only if the harness's resolver
    reads /etc/hosts (Node and Bun resolvers differ). The NetworkPolicy still matches: the
    Service's translation to a pod happens before the policy is applied, so the podSelector
    rule admits ClusterIP traffic. Through the gateway or the proxy's CONNECT, the harness
    itself never resolves the provider host either.

    ``cluster_ip`` is ignored when the route's URL already names an address.
    """
    _, host, port = route(settings)
    if _is_ip(host):
        return f"http://{_url_host(host)}:{port}"
    if not cluster_ip or not _is_ip(cluster_ip):
        raise UserError(f"the Service {route_service_name(settings)} has no cluster IP "
                        f"({cluster_ip or 'none'}); it must be a ClusterIP Service, not headless")
    return f"http://{_url_host(cluster_ip)}:{port}"


def own_policy_names(settings: Settings) -> set[str]:
    """Names of the NetworkPolicies this install makes (``foreign_policies_selecting`` leaves
    them out)."""
    return {_policy_name(settings, c) for c in (names.SESSION_COMPONENT, names.PROXY_COMPONENT, names.GATEWAY_COMPONENT)}


def session_network_policy(settings: Settings) -> dict[str, Any]:
    """Session pods: no ingress at all (exec and logs come through the kubelet, not the pod
    network), egress only to the pods of their route (``route``: the gateway, or the egress
    proxy) on its port, so no DNS either."""
    k = settings.kube
    component, _, port = route(settings)
    return _network_policy(settings, names.SESSION_COMPONENT, {
        "policyTypes": ["Ingress", "Egress"],
        "egress": [{
            "to": [{"podSelector": {"matchLabels": names.selector(k.instance, component)}}],
            "ports": [{"protocol": "TCP", "port": port}],
        }],
    })


def gateway_network_policy(settings: Settings) -> dict[str, Any]:
    """Gateway pods: ingress only from session pods on the gateway port; egress to the
    provider's port at kube.provider_ip_blocks (as the egress proxy's), DNS to the cluster DNS
    pods alone (to resolve the provider), and the API server (kube.api_server; where it is
    not known, ports 443 and 6443 at any address but the link-local ones). The process that
    holds the key and parses sessions' requests reaches nothing else: no metadata service, no
    other pod, no other port."""
    k = settings.kube
    _, port = gateway_endpoint(settings)
    return _network_policy(settings, names.GATEWAY_COMPONENT, {
        "policyTypes": ["Ingress", "Egress"],
        "ingress": [{
            "from": [{"podSelector": {"matchLabels": names.selector(k.instance, names.SESSION_COMPONENT)}}],
            "ports": [{"protocol": "TCP", "port": port}],
        }],
        "egress": [*_provider_and_dns(settings), *_api_server(settings)],
    })


def _provider_and_dns(settings: Settings) -> list[dict[str, Any]]:
    """Egress to the provider's port at kube.provider_ip_blocks, and DNS to the cluster's DNS pods."""
    k = settings.kube
    _, provider_port = provider_endpoint(settings)
    return [
        {"to": [b.policy() for b in k.provider_ip_blocks], "ports": [{"protocol": "TCP", "port": provider_port}]},
        {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": k.dns_namespace}},
                 "podSelector": {"matchLabels": dict(k.dns_pod_labels)}}],
         "ports": [{"protocol": "UDP", "port": DNS_PORT}, {"protocol": "TCP", "port": DNS_PORT}]},
    ]


def _api_server(settings: Settings) -> list[dict[str, Any]]:
    """Egress to the API server: one rule per known endpoint, or its usual ports anywhere but
    link-local addresses where none is known (a NetworkPolicy sees the endpoint, after the
    kubernetes Service's address is translated, and a chart rendered without a cluster cannot
    look it up)."""
    known = settings.kube.api_server
    if known:
        return [{"to": [{"ipBlock": {"cidr": e.cidr}}], "ports": [{"protocol": "TCP", "port": e.port}]} for e in known]
    return [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": [LINK_LOCAL_V4]}},
                    {"ipBlock": {"cidr": "::/0", "except": [LINK_LOCAL_V6]}}],
             "ports": [{"protocol": "TCP", "port": p} for p in API_SERVER_PORTS]}]


def proxy_network_policy(settings: Settings, *, egress_by_cilium: bool = False) -> dict[str, Any]:
    """Proxy pods: ingress only from session pods on the proxy port; egress to TCP on the
    provider port at the public internet's addresses (kube.provider_ip_blocks: Squid allows the
    provider host alone, and its addresses are not known here and change, but no pod, node or
    metadata address is reachable even so) plus DNS over UDP and TCP to the cluster's DNS pods
    alone, to resolve it.

    With ``egress_by_cilium`` the policy isolates ingress only and leaves egress to
    ``cilium_fqdn_policy``: allow rules add up, so an any-address rule here would make the
    FQDN restriction moot. Kubelet probes come from the node, which common CNIs admit
    regardless of policy; probe the proxy with tcpSocket or exec.
    """
    k = settings.kube
    _, proxy_port = proxy_endpoint(settings)
    spec: dict[str, Any] = {
        "policyTypes": ["Ingress"] if egress_by_cilium else ["Ingress", "Egress"],
        "ingress": [{
            "from": [{"podSelector": {"matchLabels": names.selector(k.instance, names.SESSION_COMPONENT)}}],
            "ports": [{"protocol": "TCP", "port": proxy_port}],
        }],
    }
    if not egress_by_cilium:
        spec["egress"] = _provider_and_dns(settings)
    return _network_policy(settings, names.PROXY_COMPONENT, spec)


def cilium_fqdn_policy(settings: Settings) -> dict[str, Any]:
    """Cilium alternative for the proxy pods' egress: the provider port only at the addresses
    the provider host resolved to. ``toFQDNs`` learns those addresses from the pods' DNS
    answers, so DNS must pass Cilium's DNS proxy: the rule on port 53 with ``matchPattern:
    "*"`` intercepts every lookup (narrowing it there would only break resolution), and the
    restriction is the toFQDNs rule. Other names on the same addresses are still reachable at
    the IP level (cilium #31803); Squid's SNI check is what closes that.

    Use with ``proxy_network_policy(settings, egress_by_cilium=True)``.
    """
    k = settings.kube
    host, port = provider_endpoint(settings)
    return {
        "apiVersion": "cilium.io/v2",
        "kind": "CiliumNetworkPolicy",
        "metadata": _metadata(settings, names.object_name(k.instance, names.PROXY_COMPONENT, "fqdn-policy"),
                              names.PROXY_COMPONENT),
        "spec": {
            "endpointSelector": {"matchLabels": names.selector(k.instance, names.PROXY_COMPONENT)},
            "egress": [
                {"toEndpoints": [{"matchLabels": dict(CLUSTER_DNS)}],
                 "toPorts": [{"ports": [{"port": str(DNS_PORT), "protocol": "ANY"}],
                              "rules": {"dns": [{"matchPattern": "*"}]}}]},
                {"toFQDNs": [{"matchName": host}],
                 "toPorts": [{"ports": [{"port": str(port), "protocol": "TCP"}]}]},
            ],
        },
    }


def foreign_policies_selecting(policies: list[dict[str, Any]], labels: dict[str, str], own: set[str]) -> list[str]:
    """Names, sorted, of the NetworkPolicies (API dicts, camelCase) other than ``own`` that
    select a pod labelled ``labels`` and allow anything for it.

    NetworkPolicy allow rules add up: any policy that selects session pods and has an ingress
    or egress rule in force reopens what ours closes. A policy that only isolates (no rules,
    or rules of a type its policyTypes leave out) takes nothing away and is not reported.
    The per-session labels (campaign, probe, session, attempt) take another value on every
    pod, so a selector term on one of them is taken to match: some session pod carries, or
    lacks, the value it names. An operator this code does not know is taken to match too:
    when in doubt, refuse to start.
    """
    return sorted(
        p["metadata"]["name"] for p in policies
        if p["metadata"]["name"] not in own
        and _allows_something(p.get("spec") or {})
        and _selects((p.get("spec") or {}).get("podSelector") or {}, labels)
    )


def _allows_something(spec: dict[str, Any]) -> bool:
    """Whether a policy has an allow rule in force. Without policyTypes the API assumes
    Ingress always and Egress when there are egress rules."""
    types = spec.get("policyTypes") or ["Ingress", *(["Egress"] if spec.get("egress") else [])]
    return ("Ingress" in types and bool(spec.get("ingress"))) or ("Egress" in types and bool(spec.get("egress")))


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """LabelSelector semantics (an empty selector selects every pod), per-session labels as
    wildcards."""
    wild = PER_SESSION_LABELS & labels.keys()
    for key, value in (selector.get("matchLabels") or {}).items():
        if key not in wild and labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "Exists":
            ok = key in labels
        elif op == "DoesNotExist":
            ok = key not in labels
        elif key in wild:
            ok = True
        elif op == "In":
            ok = key in labels and labels[key] in values
        elif op == "NotIn":
            ok = key not in labels or labels[key] not in values
        else:
            ok = True
        if not ok:
            return False
    return True


def _network_policy(settings: Settings, component: str, rules: dict[str, Any]) -> dict[str, Any]:
    """The NetworkPolicy of one component's pods, named as own_policy_names names it, with
    ``rules`` (its policyTypes, ingress, egress) after its podSelector."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(settings, _policy_name(settings, component), component),
        "spec": {"podSelector": {"matchLabels": names.selector(settings.kube.instance, component)}, **rules},
    }


def _policy_name(settings: Settings, component: str) -> str:
    return names.object_name(settings.kube.instance, component, "policy")


def _metadata(settings: Settings, name: str, component: str) -> dict[str, Any]:
    k = settings.kube
    return {"name": name, "namespace": k.namespace, "labels": names.component_labels(k.instance, component)}


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def _url_host(ip: str) -> str:
    return f"[{ip}]" if ":" in ip else ip
