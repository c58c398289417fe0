"""The network confinement builders: NetworkPolicies, the Cilium alternative, the route URL of
session pods (the gateway, or the egress proxy), the foreign-policy check and the Squid
configuration, against complete values."""

from __future__ import annotations

import pytest

from runner.errors import UserError
from runner.k8s.egress import squid_conf, squid_entrypoint
from runner.k8s.policy import (
    cilium_fqdn_policy,
    foreign_policies_selecting,
    gateway_network_policy,
    own_policy_names,
    provider_endpoint,
    proxy_network_policy,
    route_service_name,
    session_network_policy,
    session_route_url,
)
from runner.settings import GatewaySettings, KubeSettings, ProviderSettings, Settings

SESSION_POLICY = "probe-runner-session-policy-ff62673574"
PROXY_POLICY = "probe-runner-egress-proxy-policy-ebb1edc508"
GATEWAY_POLICY = "probe-runner-gateway-policy-8fe5c1370c"


def settings(base_url="https://api.anthropic.com", proxy_url="http://probe-runner-egress-proxy:3128", gateway=True, **kube):
    return Settings(store="file:///tmp/x", provider=ProviderSettings(base_url=base_url),
                    gateway=GatewaySettings(enabled=gateway), kube=KubeSettings(proxy_url=proxy_url, **kube))


def labels(component):
    return {
        "app.kubernetes.io/name": "probe-runner",
        "app.kubernetes.io/instance": "probe-runner",
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "probe-runner",
        "app.kubernetes.io/managed-by": "probe-runner",
    }


def selector(component):
    return {"app.kubernetes.io/name": "probe-runner", "app.kubernetes.io/instance": "probe-runner",
            "app.kubernetes.io/component": component}


# ---- NetworkPolicies --------------------------------------------------------------------------

def test_session_policy_denies_all_but_the_gateway_port():
    assert session_network_policy(settings()) == {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": SESSION_POLICY, "namespace": "probe-runner", "labels": labels("session")},
        "spec": {
            "podSelector": {"matchLabels": selector("session")},
            "policyTypes": ["Ingress", "Egress"],
            "egress": [{
                "to": [{"podSelector": {"matchLabels": selector("gateway")}}],
                "ports": [{"protocol": "TCP", "port": 8080}],
            }],
        },
    }


def test_session_policy_without_the_gateway_denies_all_but_the_proxy_port():
    got = session_network_policy(settings(gateway=False))
    assert got["spec"]["egress"] == [{
        "to": [{"podSelector": {"matchLabels": selector("egress-proxy")}}],
        "ports": [{"protocol": "TCP", "port": 3128}],
    }]


def test_session_policy_follows_instance_namespace_and_route_port():
    got = session_network_policy(settings(proxy_url="http://px:8080", instance="r2", namespace="ns2", gateway=False))
    assert got["metadata"] == {"name": "r2-session-policy-0a41bdf47b", "namespace": "ns2", "labels": {
        **labels("session"), "app.kubernetes.io/instance": "r2"}}
    assert got["spec"]["podSelector"] == {"matchLabels": {**selector("session"), "app.kubernetes.io/instance": "r2"}}
    assert got["spec"]["egress"] == [{
        "to": [{"podSelector": {"matchLabels": {**selector("egress-proxy"), "app.kubernetes.io/instance": "r2"}}}],
        "ports": [{"protocol": "TCP", "port": 8080}],
    }]
    got = session_network_policy(settings(gateway_url="http://gw:9000", instance="r2"))
    assert got["spec"]["egress"] == [{
        "to": [{"podSelector": {"matchLabels": {**selector("gateway"), "app.kubernetes.io/instance": "r2"}}}],
        "ports": [{"protocol": "TCP", "port": 9000}],
    }]


PROVIDER_AND_DNS = [
    {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                                                        "100.64.0.0/10", "169.254.0.0/16", "127.0.0.0/8"]}},
            {"ipBlock": {"cidr": "::/0", "except": ["fc00::/7", "fe80::/10", "::1/128"]}}],
     "ports": [{"protocol": "TCP", "port": 443}]},
    {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
             "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
     "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
]


def test_gateway_policy_admits_sessions_on_its_port_only_and_reaches_the_provider_dns_and_the_api_server():
    """Issue 28: "the gateway's own pods have no egress policy: the process that holds the key
    and parses sessions' requests can reach the metadata service and every address in the
    cluster; limit it to the provider's ranges on the provider's port, cluster DNS and the API
    server". Where the API server's endpoints are not known, its two usual ports at any
    address but the link-local ones."""
    def policy(egress):
        return {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": GATEWAY_POLICY, "namespace": "probe-runner", "labels": labels("gateway")},
            "spec": {
                "podSelector": {"matchLabels": selector("gateway")},
                "policyTypes": ["Ingress", "Egress"],
                "ingress": [{
                    "from": [{"podSelector": {"matchLabels": selector("session")}}],
                    "ports": [{"protocol": "TCP", "port": 8080}],
                }],
                "egress": [*PROVIDER_AND_DNS, *egress],
            },
        }
    assert gateway_network_policy(settings()) == policy([
        {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16"]}},
                {"ipBlock": {"cidr": "::/0", "except": ["fe80::/10"]}}],
         "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443}]}])
    known = settings(api_server=[{"cidr": "10.0.0.1/32", "port": 6443}, {"cidr": "fd00::1/128", "port": 6443}])
    assert gateway_network_policy(known) == policy([
        {"to": [{"ipBlock": {"cidr": "10.0.0.1/32"}}], "ports": [{"protocol": "TCP", "port": 6443}]},
        {"to": [{"ipBlock": {"cidr": "fd00::1/128"}}], "ports": [{"protocol": "TCP", "port": 6443}]}])


@pytest.mark.parametrize("cidr", ["10.0.0.1", "10.0.0.1/8", "not-an-address/32"])
def test_an_api_server_address_must_be_a_cidr(cidr):
    import pydantic

    with pytest.raises(pydantic.ValidationError, match="api_server"):
        settings(api_server=[{"cidr": cidr, "port": 6443}])


def test_proxy_policy_admits_sessions_and_reaches_provider_port_and_dns():
    assert proxy_network_policy(settings(base_url="https://llm.example.com:8443/v1")) == {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": PROXY_POLICY, "namespace": "probe-runner", "labels": labels("egress-proxy")},
        "spec": {
            "podSelector": {"matchLabels": selector("egress-proxy")},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{
                "from": [{"podSelector": {"matchLabels": selector("session")}}],
                "ports": [{"protocol": "TCP", "port": 3128}],
            }],
            "egress": [
                # the provider's port on the public internet only: no pod, Service, node,
                # metadata or loopback address (before: any address at all)
                {"to": [{"ipBlock": {"cidr": "0.0.0.0/0", "except": ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",
                                                                     "100.64.0.0/10", "169.254.0.0/16", "127.0.0.0/8"]}},
                        {"ipBlock": {"cidr": "::/0", "except": ["fc00::/7", "fe80::/10", "::1/128"]}}],
                 "ports": [{"protocol": "TCP", "port": 8443}]},
                # DNS to the cluster's DNS pods only (before: any server)
                {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
                         "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
                 "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
            ],
        },
    }


def test_an_on_prem_provider_range_replaces_the_public_internet_and_a_bad_block_is_one_line(monkeypatch):
    from runner.errors import UserError
    from runner.settings import load_settings

    monkeypatch.setenv("RUNNER_KUBE__PROVIDER_IP_BLOCKS", '[{"cidr": "10.20.0.0/24"}]')
    monkeypatch.setenv("RUNNER_KUBE__DNS_POD_LABELS", '{"app": "dns"}')
    egress = proxy_network_policy(load_settings(store="file:///s"))["spec"]["egress"]
    assert egress[0]["to"] == [{"ipBlock": {"cidr": "10.20.0.0/24"}}]
    assert egress[1]["to"][0]["podSelector"] == {"matchLabels": {"app": "dns"}}
    monkeypatch.setenv("RUNNER_KUBE__PROVIDER_IP_BLOCKS", '[{"cidr": "0.0.0.0/0", "except": ["fc00::/7"]}]')
    with pytest.raises(UserError, match=r"^settings: kube.provider_ip_blocks\[0\]: except fc00::/7 is not a range strictly inside 0.0.0.0/0"):
        load_settings(store="file:///s")


def test_proxy_policy_leaves_egress_to_cilium_when_asked():
    got = proxy_network_policy(settings(), egress_by_cilium=True)
    assert got["spec"] == {
        "podSelector": {"matchLabels": selector("egress-proxy")},
        "policyTypes": ["Ingress"],
        "ingress": [{
            "from": [{"podSelector": {"matchLabels": selector("session")}}],
            "ports": [{"protocol": "TCP", "port": 3128}],
        }],
    }


def test_cilium_policy_allows_provider_fqdn_and_intercepted_dns():
    assert cilium_fqdn_policy(settings()) == {
        "apiVersion": "cilium.io/v2",
        "kind": "CiliumNetworkPolicy",
        "metadata": {"name": "probe-runner-egress-proxy-fqdn-policy-9dae5a5ee3", "namespace": "probe-runner",
                     "labels": labels("egress-proxy")},
        "spec": {
            "endpointSelector": {"matchLabels": selector("egress-proxy")},
            "egress": [
                {"toEndpoints": [{"matchLabels": {"k8s:io.kubernetes.pod.namespace": "kube-system",
                                                  "k8s:k8s-app": "kube-dns"}}],
                 "toPorts": [{"ports": [{"port": "53", "protocol": "ANY"}], "rules": {"dns": [{"matchPattern": "*"}]}}]},
                {"toFQDNs": [{"matchName": "api.anthropic.com"}],
                 "toPorts": [{"ports": [{"port": "443", "protocol": "TCP"}]}]},
            ],
        },
    }


def test_own_policy_names_are_the_built_ones():
    s = settings()
    assert own_policy_names(s) == {SESSION_POLICY, PROXY_POLICY, GATEWAY_POLICY}
    assert own_policy_names(s) == {session_network_policy(s)["metadata"]["name"],
                                   proxy_network_policy(s)["metadata"]["name"],
                                   gateway_network_policy(s)["metadata"]["name"]}


# ---- provider and proxy addresses ---------------------------------------------------------------

def test_provider_endpoint_defaults_port_and_lowercases_host():
    assert provider_endpoint(settings()) == ("api.anthropic.com", 443)
    assert provider_endpoint(settings(base_url="https://LLM.Example.com:8443/v1")) == ("llm.example.com", 8443)


@pytest.mark.parametrize("url, says", [
    ("http://api.anthropic.com", "must be an https:// URL with a host"),
    ("https:///v1", "must be an https:// URL with a host"),
    ("api.anthropic.com", "must be an https:// URL with a host"),
    ("https://10.0.0.5", "must be a DNS name, not an address"),
    ("https://[fd00::5]:443", "must be a DNS name, not an address"),
    ("https://api.anthropic.com:99999", "Port out of range"),
    ("https://bad_host.example", "must be a DNS name"),
])
def test_bad_base_url_refused_in_one_line(url, says):
    for build in (provider_endpoint, proxy_network_policy, cilium_fqdn_policy):
        with pytest.raises(UserError) as e:
            build(settings(base_url=url))
        msg = str(e.value)
        assert says in msg and "\n" not in msg and msg.startswith(f"provider.base_url {url!r}: ")


def test_session_policy_does_not_need_an_https_provider():
    # The local scripted provider of the cluster tests is http on loopback; only the proxy side refuses it.
    assert session_network_policy(settings(base_url="http://127.0.0.1:9999"))["kind"] == "NetworkPolicy"


@pytest.mark.parametrize("url", ["https://px:3128", "http://px", "http://:3128", "socks5://px:1080"])
def test_bad_route_url_refused(url):
    with pytest.raises(UserError, match=r"^kube.proxy_url .*must be http://HOST:PORT \(the egress proxy"):
        session_network_policy(settings(proxy_url=url, gateway=False))
    with pytest.raises(UserError, match=r"^kube.gateway_url .*must be http://HOST:PORT \(the provider gateway"):
        session_network_policy(settings(gateway_url=url))


def test_session_route_url_is_the_cluster_ip():
    s = settings()
    assert route_service_name(s) == "probe-runner-gateway"
    assert session_route_url(s, "10.96.12.34") == "http://10.96.12.34:8080"
    assert session_route_url(s, "fd00:10:96::12") == "http://[fd00:10:96::12]:8080"
    s = settings(gateway=False)
    assert route_service_name(s) == "probe-runner-egress-proxy"
    assert session_route_url(s, "10.96.12.34") == "http://10.96.12.34:3128"


def test_session_route_url_keeps_an_address_and_needs_no_service():
    s = settings(proxy_url="http://10.1.2.3:3128", gateway=False)
    assert route_service_name(s) is None
    assert session_route_url(s, None) == "http://10.1.2.3:3128"
    s = settings(gateway_url="http://127.0.0.1:18080")
    assert route_service_name(s) is None
    assert session_route_url(s, None) == "http://127.0.0.1:18080"


@pytest.mark.parametrize("ip", ["None", "", None])
def test_headless_route_service_refused(ip):
    with pytest.raises(UserError, match="the Service probe-runner-gateway has no cluster IP"):
        session_route_url(settings(), ip)
    with pytest.raises(UserError, match="the Service probe-runner-egress-proxy has no cluster IP"):
        session_route_url(settings(gateway=False), ip)


def test_route_service_name_qualified_in_our_namespace_only():
    assert route_service_name(settings(proxy_url="http://px.probe-runner.svc.cluster.local:3128", gateway=False)) == "px"
    with pytest.raises(UserError, match="egress proxy Service must be in namespace probe-runner, not other"):
        route_service_name(settings(proxy_url="http://px.other.svc:3128", gateway=False))
    with pytest.raises(UserError, match="provider gateway Service must be in namespace probe-runner, not other"):
        route_service_name(settings(gateway_url="http://gw.other:8080"))


# ---- foreign policies -------------------------------------------------------------------------

SESSION_POD = {**labels("session"), "probe-runner.io/campaign": "preflight", "probe-runner.io/probe": "preflight",
               "probe-runner.io/session": "preflight", "probe-runner.io/attempt": "1"}
OWN = {SESSION_POLICY, PROXY_POLICY, GATEWAY_POLICY}


def policy(name, pod_selector, **spec):
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": name, "namespace": "probe-runner"},
            "spec": {"podSelector": pod_selector, **spec}}


ALLOW_EGRESS = {"policyTypes": ["Egress"], "egress": [{}]}


def foreign(*policies):
    return foreign_policies_selecting(list(policies), SESSION_POD, OWN)


def test_our_own_policies_are_not_foreign():
    s = settings()
    assert foreign(session_network_policy(s), proxy_network_policy(s), gateway_network_policy(s)) == []


def test_a_policy_named_like_ours_in_another_install_is_foreign():
    other = session_network_policy(settings(instance="r2"))
    other["spec"]["podSelector"] = {}
    assert foreign(other) == ["r2-session-policy-0a41bdf47b"]


def test_empty_selector_selects_every_pod():
    assert foreign(policy("allow-all", {}, **ALLOW_EGRESS)) == ["allow-all"]


def test_deny_only_policies_are_not_foreign():
    assert foreign(
        policy("deny-all", {}, policyTypes=["Ingress", "Egress"]),
        policy("deny-ingress-default", {}),
        policy("empty-lists", {}, policyTypes=["Ingress", "Egress"], ingress=[], egress=[]),
        # egress rules the policyTypes leave out are not in force
        policy("ingress-typed", {}, policyTypes=["Ingress"], egress=[{}]),
    ) == []


def test_ingress_allow_rule_is_foreign_too():
    assert foreign(policy("scrape", {}, policyTypes=["Ingress"], ingress=[{"from": [{"podSelector": {}}]}])) == ["scrape"]


def test_policy_types_defaulted_like_the_api():
    assert foreign(policy("untyped-egress", {}, egress=[{"ports": [{"port": 53}]}]),
                   policy("untyped-ingress", {}, ingress=[{}])) == ["untyped-egress", "untyped-ingress"]


def test_match_labels_must_all_match():
    assert foreign(
        policy("sessions", {"matchLabels": {"app.kubernetes.io/component": "session"}}, **ALLOW_EGRESS),
        policy("proxies", {"matchLabels": {"app.kubernetes.io/component": "egress-proxy"}}, **ALLOW_EGRESS),
        policy("one-wrong", {"matchLabels": {"app.kubernetes.io/component": "session", "tier": "web"}}, **ALLOW_EGRESS),
    ) == ["sessions"]


@pytest.mark.parametrize("expr, selects", [
    ({"key": "app.kubernetes.io/component", "operator": "In", "values": ["session", "x"]}, True),
    ({"key": "app.kubernetes.io/component", "operator": "In", "values": ["x"]}, False),
    ({"key": "tier", "operator": "In", "values": ["web"]}, False),
    ({"key": "app.kubernetes.io/component", "operator": "NotIn", "values": ["web"]}, True),
    ({"key": "app.kubernetes.io/component", "operator": "NotIn", "values": ["session"]}, False),
    ({"key": "tier", "operator": "NotIn", "values": ["web"]}, True),
    ({"key": "app.kubernetes.io/name", "operator": "Exists"}, True),
    ({"key": "tier", "operator": "Exists"}, False),
    ({"key": "tier", "operator": "DoesNotExist"}, True),
    ({"key": "app.kubernetes.io/name", "operator": "DoesNotExist"}, False),
    # per-session labels differ from pod to pod: some session pod matches
    ({"key": "probe-runner.io/campaign", "operator": "In", "values": ["status-2026-12-02"]}, True),
    ({"key": "probe-runner.io/session", "operator": "NotIn", "values": ["preflight"]}, True),
    ({"key": "probe-runner.io/attempt", "operator": "DoesNotExist"}, False),
    # unknown operator: cannot prove it misses, so refuse
    ({"key": "tier", "operator": "Gt", "values": ["1"]}, True),
])
def test_match_expressions(expr, selects):
    assert foreign(policy("p", {"matchExpressions": [expr]}, **ALLOW_EGRESS)) == (["p"] if selects else [])


def test_per_session_label_values_are_wildcards_in_match_labels():
    assert foreign(policy("one-campaign", {"matchLabels": {"probe-runner.io/campaign": "real-campaign",
                                                            "app.kubernetes.io/component": "session"}},
                          **ALLOW_EGRESS)) == ["one-campaign"]


def test_match_labels_and_expressions_are_anded():
    sel = {"matchLabels": {"app.kubernetes.io/component": "session"},
           "matchExpressions": [{"key": "tier", "operator": "Exists"}]}
    assert foreign(policy("p", sel, **ALLOW_EGRESS)) == []


def test_foreign_names_sorted():
    assert foreign(policy("b", {}, **ALLOW_EGRESS), policy("a", {}, **ALLOW_EGRESS)) == ["a", "b"]


# ---- Squid ------------------------------------------------------------------------------------

def test_squid_conf_complete():
    assert squid_conf("api.anthropic.com") == """\
# Egress proxy of probe-runner: CONNECT to api.anthropic.com:443 alone, TLS SNI checked.
http_port 3128 ssl-bump tls-cert=/run/squid/tls.crt tls-key=/run/squid/tls.key generate-host-certificates=off

acl CONNECT method CONNECT
acl provider_port port 443
acl provider dstdomain -n api.anthropic.com
acl flood maxconn 32
http_access deny !CONNECT
http_access deny !provider_port
http_access deny flood
http_access allow provider
http_access deny all

acl step1 at_step SslBump1
acl provider_sni ssl::server_name --client-requested api.anthropic.com
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
"""


def test_squid_conf_ports_address_and_state_dir():
    conf = squid_conf("provider.test", 18443, 13128, listen_address="127.0.0.1", state_dir="/tmp/s")
    assert "http_port 127.0.0.1:13128 ssl-bump tls-cert=/tmp/s/tls.crt tls-key=/tmp/s/tls.key " in conf
    assert "acl provider_port port 18443\n" in conf
    assert "pid_filename /tmp/s/squid.pid\n" in conf


@pytest.mark.parametrize("host", ["api.anthropic.com all", "a\nhttp_access allow all", ".anthropic.com", "", "A.com"])
def test_squid_conf_refuses_hosts_that_are_not_one_name(host):
    with pytest.raises(ValueError, match="is not a DNS name"):
        squid_conf(host)


@pytest.mark.parametrize("kw", [{"provider_port": 0}, {"listen_port": 65536}])
def test_squid_conf_refuses_bad_ports(kw):
    with pytest.raises(ValueError, match="is not a TCP port"):
        squid_conf("provider.test", **kw)


def test_squid_entrypoint_complete():
    assert squid_entrypoint() == """\
#!/bin/sh
set -eu
umask 077
mkdir -p /run/squid
rm -f /run/squid/squid.pid
openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \\
  -subj /CN=egress-proxy -keyout /run/squid/tls.key -out /run/squid/tls.crt 2>/dev/null
exec squid -N -f /etc/squid/squid.conf
"""
