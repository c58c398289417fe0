"""What our NetworkPolicies deny, not only what they allow, decided by an upstream engine.

No CNI on the test machines enforces NetworkPolicy (the cluster tests run on KWOK, without a
pod network), so the nearest real check is an independent implementation of the API's
semantics: the matcher of github.com/mattfenwick/cyclonus (the engine behind ``cyclonus
analyze``, since continued as policy-assistant in sigs.k8s.io/network-policy-api), pinned in
tests/netpol/go.mod and built by tests/netpol/build.sh into a cache outside the repo. A
NetworkPolicy evaluator of our own would share whatever we misread in the API (peers without
``to``, namespace scoping of podSelector, per-direction isolation, additive allow rules).

The builders' policies go through the engine as the API would store them (JSON, camelCase;
an unknown key is refused, so a misspelt field cannot pass for "no rule"), for the default
settings and for another install (instance, namespace, proxy and provider ports), and every
row of the truth table is asserted, with the policies and directions that deny it: a
denial must come from the rule meant to give it (session egress, proxy ingress, ...), not by
accident from another one. The engine sees pods by namespace and labels and other hosts by
address; Services are out of its view, as they are for a CNI, which applies policies after
the ClusterIP's translation to a pod.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from runner.k8s import names
from runner.k8s.policy import (
    gateway_endpoint,
    gateway_network_policy,
    provider_endpoint,
    proxy_endpoint,
    proxy_network_policy,
    session_network_policy,
)
from runner.settings import GatewaySettings, KubeSettings, ProviderSettings, Settings
from tests.support.helm import CHART, render, values_of

BUILD_SCRIPT = Path(__file__).resolve().parents[1] / "netpol" / "build.sh"
# A cold build of the engine (client-go among its dependencies) takes minutes on 2 cores; a
# warm cache returns at once. The first test waits for it.
pytestmark = pytest.mark.timeout(1800)

METADATA = "169.254.169.254"
EXTERNAL = "1.1.1.1"
API_SERVICE = "10.96.0.1"  # the kubernetes Service's usual ClusterIP
API_ENDPOINT = "172.18.0.2"  # an API server's host address, what a CNI sees after the ClusterIP's translation
ELSEWHERE = "elsewhere"  # another namespace
OTHER_INSTANCE = "other-install"  # another install of probe-runner


@pytest.fixture(scope="session")
def netpol_eval() -> str:
    """Path of the engine binary, built (or found in the cache) by tests/netpol/build.sh."""
    proc = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=1700)
    if proc.returncode != 0:
        pytest.fail(f"tests/netpol/build.sh failed ({proc.returncode}):\n{proc.stderr[-4000:]}", pytrace=False)
    return proc.stdout.strip().splitlines()[-1]


@dataclass(frozen=True)
class Peer:
    """One end of a connection: a pod (namespace and labels) or, without a namespace, an
    address outside the cluster's pods."""

    ip: str
    namespace: str | None = None
    labels: tuple[tuple[str, str], ...] = ()

    def engine(self) -> dict:
        if self.namespace is None:
            return {"IP": self.ip}
        # Every namespace carries kubernetes.io/metadata.name (set by the API server).
        return {"IP": self.ip, "Internal": {"Namespace": self.namespace, "PodLabels": dict(self.labels),
                                            "NamespaceLabels": {"kubernetes.io/metadata.name": self.namespace}}}


def pod(ip: str, namespace: str, labels: dict[str, str]) -> Peer:
    return Peer(ip, namespace, tuple(sorted(labels.items())))


def host(ip: str) -> Peer:
    return Peer(ip)


def evaluate(binary: str, policies: list[dict], rows: dict[str, tuple[Peer, Peer, int, str]]) -> dict[str, dict]:
    """The engine's verdict for each row: {"allowed", "ingress": {...}, "egress": {...}}."""
    traffic = [{"Source": src.engine(), "Destination": dst.engine(), "ResolvedPort": port,
                "ResolvedPortName": "", "Protocol": proto} for src, dst, port, proto in rows.values()]
    proc = subprocess.run([binary], input=json.dumps({"policies": policies, "traffic": traffic}),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return dict(zip(rows, json.loads(proc.stdout), strict=True))


def denials(verdict: dict, short: dict[str, str]) -> frozenset[str]:
    """``{"<policy> <direction>"}`` for each direction the engine denies: empty means allowed."""
    got = frozenset(f"{short.get(name, name)} {d}" for d in ("egress", "ingress")
                    if not verdict[d]["allowed"] for name in verdict[d]["deniedBy"])
    assert verdict["allowed"] == (not got), verdict
    return got


class World:
    """The pods around one install: its session pods and proxy pod, a controller and an
    unlabelled pod beside them, cluster DNS, look-alike pods in another namespace and of
    another install, and addresses outside the cluster's pods."""

    def __init__(self, settings: Settings):
        k = settings.kube
        self.settings = settings
        self.ns = k.namespace
        self.proxy_port = proxy_endpoint(settings)[1]
        self.provider_port = provider_endpoint(settings)[1]
        session = names.session_labels(k.instance, "status-2026-12-02", "HW-PRB-0007", "present-001", 1)
        proxy = names.component_labels(k.instance, names.PROXY_COMPONENT)
        self.session = pod("10.244.1.10", self.ns, session)
        self.other_session = pod("10.244.2.11", self.ns, names.session_labels(
            k.instance, "status-2026-12-02", "HW-PRB-0008", "absent-003", 2))
        self.proxy = pod("10.244.1.20", self.ns, proxy)
        self.controller = pod("10.244.1.30", self.ns, names.component_labels(k.instance, names.CONTROLLER_COMPONENT))
        self.neighbour = pod("10.244.1.40", self.ns, {"app": "neighbour"})
        self.kube_dns = pod("10.244.0.5", "kube-system", {"k8s-app": "kube-dns"})
        self.proxy_elsewhere = pod("10.244.3.20", ELSEWHERE, proxy)
        self.session_elsewhere = pod("10.244.3.10", ELSEWHERE, session)
        self.other_install_proxy = pod("10.244.2.20", self.ns,
                                       names.component_labels(OTHER_INSTANCE, names.PROXY_COMPONENT))
        self.other_install_session = pod("10.244.2.10", self.ns, names.session_labels(
            OTHER_INSTANCE, "status-2026-12-02", "HW-PRB-0007", "present-001", 1))
        self.policies = [session_network_policy(settings), proxy_network_policy(settings)]
        self.short = {f"{self.ns}/{self.policies[0]['metadata']['name']}": "session",
                      f"{self.ns}/{self.policies[1]['metadata']['name']}": "proxy"}

    def truth_table(self) -> dict[str, tuple[tuple[Peer, Peer, int, str], frozenset[str]]]:
        """Row -> (connection, expected denials); an empty set is an allowed connection."""
        P, V = self.proxy_port, self.provider_port
        allow: frozenset[str] = frozenset()
        session_egress = frozenset({"session egress"})
        session_ingress = frozenset({"session ingress"})
        proxy_egress = frozenset({"proxy egress"})
        proxy_ingress = frozenset({"proxy ingress"})
        both_ends = session_egress | proxy_ingress
        s, px = self.session, self.proxy
        table = {
            # session pod egress: the proxy port of the proxy pods, and nothing else
            "session -> proxy, proxy port": ((s, px, P, "TCP"), allow),
            "session -> proxy, port 80": ((s, px, 80, "TCP"), both_ends),
            "session -> proxy, port 443": ((s, px, 443, "TCP"), both_ends),
            "session -> proxy, TCP 53": ((s, px, 53, "TCP"), both_ends),
            "session -> proxy, UDP 53": ((s, px, 53, "UDP"), both_ends),
            "session -> proxy, proxy port over UDP": ((s, px, P, "UDP"), both_ends),
            "session -> kube-dns, UDP 53": ((s, self.kube_dns, 53, "UDP"), session_egress),
            "session -> kube-dns, TCP 53": ((s, self.kube_dns, 53, "TCP"), session_egress),
            "session -> another session": ((s, self.other_session, 8080, "TCP"), session_egress | session_ingress),
            "session -> controller": ((s, self.controller, 8080, "TCP"), session_egress),
            "session -> unlabelled pod": ((s, self.neighbour, 80, "TCP"), session_egress),
            "session -> proxy-labelled pod in another namespace, proxy port":
                ((s, self.proxy_elsewhere, P, "TCP"), session_egress),
            "session -> another install's proxy, proxy port": ((s, self.other_install_proxy, P, "TCP"), session_egress),
            "session -> metadata service, 80": ((s, host(METADATA), 80, "TCP"), session_egress),
            "session -> external address, 443": ((s, host(EXTERNAL), 443, "TCP"), session_egress),
            "session -> external address, provider port": ((s, host(EXTERNAL), V, "TCP"), session_egress),
            "session -> external address, UDP 53": ((s, host(EXTERNAL), 53, "UDP"), session_egress),
            "session -> API server Service address, 443": ((s, host(API_SERVICE), 443, "TCP"), session_egress),
            "session -> API server endpoint, 6443": ((s, host(API_ENDPOINT), 6443, "TCP"), session_egress),
            # session pod ingress: none, from anywhere
            # (a session's address is private: the proxy's own egress refuses it too, since issue 14)
            "proxy -> session, provider port": ((px, s, V, "TCP"), proxy_egress | session_ingress),
            "proxy -> session, 8080": ((px, s, 8080, "TCP"), proxy_egress | session_ingress),
            "controller -> session": ((self.controller, s, 8080, "TCP"), session_ingress),
            "unlabelled pod -> session": ((self.neighbour, s, 22, "TCP"), session_ingress),
            "kube-dns -> session, UDP 53": ((self.kube_dns, s, 53, "UDP"), session_ingress),
            "pod in another namespace -> session": ((self.session_elsewhere, s, P, "TCP"), session_ingress),
            "external address -> session": ((host(EXTERNAL), s, 8080, "TCP"), session_ingress),
            # proxy pod egress: the provider port on the public internet, DNS at kube-dns. Before
            # issue 14 it was the provider port at any address and DNS anywhere: each row below
            # marked "before: allowed" was allowed.
            "proxy -> external address, provider port": ((px, host(EXTERNAL), V, "TCP"), allow),
            "proxy -> metadata service, provider port": ((px, host(METADATA), V, "TCP"), proxy_egress),  # before: allowed
            "proxy -> API server endpoint, provider port": ((px, host(API_ENDPOINT), V, "TCP"), proxy_egress),  # before: allowed
            "proxy -> API server Service address, provider port":
                ((px, host(API_SERVICE), V, "TCP"), proxy_egress),  # before: allowed
            "proxy -> unlabelled pod, provider port": ((px, self.neighbour, V, "TCP"), proxy_egress),  # before: allowed
            "proxy -> loopback, provider port": ((px, host("127.0.0.1"), V, "TCP"), proxy_egress),  # before: allowed
            "proxy -> external address, UDP 53": ((px, host(EXTERNAL), 53, "UDP"), proxy_egress),  # before: allowed
            "proxy -> unlabelled pod, UDP 53": ((px, self.neighbour, 53, "UDP"), proxy_egress),  # before: allowed
            "proxy -> external address, 80": ((px, host(EXTERNAL), 80, "TCP"), proxy_egress),
            "proxy -> external address, provider port over UDP": ((px, host(EXTERNAL), V, "UDP"), proxy_egress),
            "proxy -> metadata service, 80": ((px, host(METADATA), 80, "TCP"), proxy_egress),
            "proxy -> API server endpoint, 6443": ((px, host(API_ENDPOINT), 6443, "TCP"), proxy_egress),
            "proxy -> kube-dns, UDP 53": ((px, self.kube_dns, 53, "UDP"), allow),
            "proxy -> kube-dns, TCP 53": ((px, self.kube_dns, 53, "TCP"), allow),
            # proxy pod ingress: session pods of this install, on the proxy port
            "controller -> proxy, proxy port": ((self.controller, px, P, "TCP"), proxy_ingress),
            "unlabelled pod -> proxy, proxy port": ((self.neighbour, px, P, "TCP"), proxy_ingress),
            "session-labelled pod in another namespace -> proxy, proxy port":
                ((self.session_elsewhere, px, P, "TCP"), proxy_ingress),
            "another install's session -> proxy, proxy port":
                ((self.other_install_session, px, P, "TCP"), proxy_ingress),
            "external address -> proxy, proxy port": ((host(EXTERNAL), px, P, "TCP"), proxy_ingress),
        }
        if P != 3128:
            table["session -> proxy, 3128 (not the proxy port)"] = ((s, px, 3128, "TCP"), both_ends)
        if V != 443:
            table["proxy -> external address, 443 (not the provider port)"] = ((px, host(EXTERNAL), 443, "TCP"),
                                                                               proxy_egress)
        return table


def settings(**kube) -> Settings:
    """An install without the gateway: the egress proxy's policies (the gateway's are below)."""
    return Settings(store="file:///tmp/x", gateway=GatewaySettings(enabled=False), kube=KubeSettings(**kube))


OTHER = dict(instance="r2", namespace="ns2", proxy_url="http://r2-egress-proxy:8080")


@pytest.mark.parametrize("world", [
    pytest.param(lambda: World(settings()), id="defaults"),
    pytest.param(lambda: World(Settings(store="file:///tmp/x", kube=KubeSettings(**OTHER), gateway=GatewaySettings(enabled=False),
                                        provider=ProviderSettings(base_url="https://llm.example.com:8443/v1"))),
                 id="other-install"),
])
def test_truth_table(netpol_eval, world):
    w = world()
    table = w.truth_table()
    verdicts = evaluate(netpol_eval, w.policies, {row: conn for row, (conn, _) in table.items()})
    got = {row: denials(v, w.short) for row, v in verdicts.items()}
    assert got == {row: expected for row, (_, expected) in table.items()}


def test_with_the_gateway_a_session_reaches_its_port_alone_and_only_sessions_reach_it(netpol_eval):
    """The default install (issue 15): session pods' one route is the gateway's pods on the
    gateway port; the gateway admits session pods alone, of this install, on that port; its
    egress (issue 28) reaches the provider's port at public addresses, the cluster DNS and the
    API server's ports, and nothing else: no metadata service, no other pod, no other port;
    nothing else of the proxy's table changes for the session."""
    s = Settings(store="file:///tmp/x", kube=KubeSettings())
    k, port = s.kube, gateway_endpoint(s)[1]
    session = pod("10.244.1.10", k.namespace, names.session_labels(k.instance, "c", "HW-PRB-0007", "present-001", 1))
    gateway = pod("10.244.1.50", k.namespace, names.component_labels(k.instance, names.GATEWAY_COMPONENT))
    proxy = pod("10.244.1.20", k.namespace, names.component_labels(k.instance, names.PROXY_COMPONENT))
    controller = pod("10.244.1.30", k.namespace, names.component_labels(k.instance, names.CONTROLLER_COMPONENT))
    other = pod("10.244.2.10", k.namespace, names.session_labels(OTHER_INSTANCE, "c", "HW-PRB-0007", "present-001", 1))
    kube_dns = pod("10.244.0.5", "kube-system", {"k8s-app": "kube-dns"})
    policies = [session_network_policy(s), gateway_network_policy(s)]
    short = {f"{k.namespace}/{policies[0]['metadata']['name']}": "session",
             f"{k.namespace}/{policies[1]['metadata']['name']}": "gateway"}
    rows = {
        "session -> gateway, its port": ((session, gateway, port, "TCP"), frozenset()),
        "session -> gateway, another port": ((session, gateway, port + 1, "TCP"), frozenset({"session egress", "gateway ingress"})),
        "session -> gateway, UDP": ((session, gateway, port, "UDP"), frozenset({"session egress", "gateway ingress"})),
        "session -> egress proxy": ((session, proxy, 3128, "TCP"), frozenset({"session egress"})),
        "session -> cluster DNS": ((session, kube_dns, 53, "UDP"), frozenset({"session egress"})),
        "session -> external address": ((session, host(EXTERNAL), 443, "TCP"), frozenset({"session egress"})),
        "session -> metadata": ((session, host("169.254.169.254"), 80, "TCP"), frozenset({"session egress"})),
        "controller -> gateway": ((controller, gateway, port, "TCP"), frozenset({"gateway ingress"})),
        "another install's session -> gateway": ((other, gateway, port, "TCP"), frozenset({"gateway ingress"})),
        "gateway -> external address, 443": ((gateway, host(EXTERNAL), 443, "TCP"), frozenset()),
        "gateway -> external address, 22": ((gateway, host(EXTERNAL), 22, "TCP"), frozenset({"gateway egress"})),
        "gateway -> cluster DNS": ((gateway, kube_dns, 53, "UDP"), frozenset()),
        "gateway -> the API server's port": ((gateway, host("10.0.0.1"), 6443, "TCP"), frozenset()),
        "gateway -> a node's SSH": ((gateway, host("10.0.0.1"), 22, "TCP"), frozenset({"gateway egress"})),
        "gateway -> metadata": ((gateway, host("169.254.169.254"), 80, "TCP"), frozenset({"gateway egress"})),
        "gateway -> metadata on 443": ((gateway, host("169.254.169.254"), 443, "TCP"), frozenset({"gateway egress"})),
        "gateway -> controller": ((gateway, controller, 8081, "TCP"), frozenset({"gateway egress"})),
        "gateway -> session": ((gateway, session, 1234, "TCP"), frozenset({"gateway egress", "session ingress"})),
    }
    verdicts = evaluate(netpol_eval, policies, {row: conn for row, (conn, _) in rows.items()})
    assert {row: denials(v, short) for row, v in verdicts.items()} == {row: want for row, (_, want) in rows.items()}


def test_an_allow_rule_of_another_policy_reopens_what_ours_close(netpol_eval):
    """Allow rules add up: a foreign allow-all policy in the namespace makes the engine allow
    what ours deny (the reason the executor refuses to start beside one). Shows that this
    harness sees such rules, so the truth table would catch a builder that opened too much."""
    w = World(settings())
    foreign = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
               "metadata": {"name": "allow-all", "namespace": w.ns},
               "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"], "ingress": [{}], "egress": [{}]}}
    rows = {"session -> metadata": (w.session, host(METADATA), 80, "TCP"),
            "session -> kube-dns": (w.session, w.kube_dns, 53, "UDP"),
            "unlabelled pod -> session": (w.neighbour, w.session, 22, "TCP")}
    before = evaluate(netpol_eval, w.policies, rows)
    after = evaluate(netpol_eval, [*w.policies, foreign], rows)
    assert {row: v["allowed"] for row, v in before.items()} == dict.fromkeys(rows, False)
    assert {row: v["allowed"] for row, v in after.items()} == dict.fromkeys(rows, True)
    assert after["session -> metadata"]["egress"]["allowedBy"] == [f"{w.ns}/allow-all"]
    assert after["unlabelled pod -> session"]["ingress"]["allowedBy"] == [f"{w.ns}/allow-all"]


def test_with_cilium_egress_the_proxy_policy_still_admits_only_sessions(netpol_eval):
    """``egress_by_cilium`` hands the proxy's egress to the CiliumNetworkPolicy, which this
    engine cannot evaluate; what the NetworkPolicy still decides, the proxy's ingress, must
    not change. The proxy's egress is then open as far as NetworkPolicy goes (asserted, so a
    change in that hand-over is seen here)."""
    w = World(settings())
    policies = [session_network_policy(w.settings), proxy_network_policy(w.settings, egress_by_cilium=True)]
    rows = {"session -> proxy": (w.session, w.proxy, w.proxy_port, "TCP"),
            "controller -> proxy": (w.controller, w.proxy, w.proxy_port, "TCP"),
            "proxy -> external address, 80": (w.proxy, host(EXTERNAL), 80, "TCP")}
    got = {row: v["allowed"] for row, v in evaluate(netpol_eval, policies, rows).items()}
    assert got == {"session -> proxy": True, "controller -> proxy": False, "proxy -> external address, 80": True}


def test_the_engine_refuses_a_field_it_does_not_know(netpol_eval):
    """A misspelt key would otherwise be dropped by the decoder and read as "no rule", and a
    policy the API server would reject could pass the truth table."""
    w = World(settings())
    bad = json.loads(json.dumps(w.policies[0]).replace('"egress"', '"egres"'))
    proc = subprocess.run([netpol_eval], input=json.dumps({"policies": [bad], "traffic": []}),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert 'unknown field "egres"' in proc.stderr


@pytest.mark.parametrize("case", ["default", "monitoring"])
def test_the_metrics_port_is_for_the_scrapers_alone_and_never_for_a_session(netpol_eval, case):
    """Issue 31: the controller and the gateway serve metrics that name the campaigns, on
    metrics.port. Every NetworkPolicy the chart renders goes through the engine: a session pod
    reaches the gateway's serving port and not its metrics port (its egress is the serving port
    alone), nor the controller's; the scrapers of metrics.allowFrom reach that port of both and
    no other port; no other pod reaches it."""
    values = None if case == "default" else CHART / "ci" / f"{case}-values.yaml"
    v = values_of(values)
    metrics, serving = v["metrics"]["port"], v["gateway"]["port"]
    objs = render(values, release="team-a", namespace="probes")
    policies = [o for o in objs if o["kind"] == "NetworkPolicy"]
    short = {f"probes/{names.object_name('team-a', what, 'policy')}": what
             for what in ("session", "gateway", "jobs", "metrics")}
    assert {f"probes/{p['metadata']['name']}" for p in policies} == set(short)
    k = KubeSettings(instance="team-a", namespace="probes")
    session = pod("10.244.1.10", k.namespace, names.session_labels(k.instance, "c", "HW-PRB-0007", "present-001", 1))
    gateway = pod("10.244.1.50", k.namespace, names.component_labels(k.instance, names.GATEWAY_COMPONENT))
    controller = pod("10.244.1.30", k.namespace, {**names.component_labels(k.instance, names.CONTROLLER_COMPONENT),
                                                  names.CAMPAIGN: "c"})
    transform = pod("10.244.1.31", k.namespace, names.component_labels(k.instance, "transform"))
    neighbour = pod("10.244.1.40", k.namespace, {"app": "neighbour"})
    if case == "default":  # any pod of the namespace monitoring
        scraper = pod("10.244.5.5", "monitoring", {"app": "anything"})
        not_scraper = pod("10.244.5.6", "observability", {"app.kubernetes.io/name": "prometheus"})
    else:  # the Prometheus pods of the namespace observability alone
        scraper = pod("10.244.5.5", "observability", {"app.kubernetes.io/name": "prometheus"})
        not_scraper = pod("10.244.5.6", "observability", {"app.kubernetes.io/name": "grafana"})
    both = {"gateway ingress", "metrics ingress"}
    rows = {
        "session -> gateway, serving port": ((session, gateway, serving, "TCP"), set()),
        "session -> gateway, metrics port": ((session, gateway, metrics, "TCP"), {"session egress", *both}),
        "session -> controller, metrics port":
            ((session, controller, metrics, "TCP"), {"session egress", "jobs ingress", "metrics ingress"}),
        "scraper -> gateway, metrics port": ((scraper, gateway, metrics, "TCP"), set()),
        "scraper -> controller, metrics port": ((scraper, controller, metrics, "TCP"), set()),
        "scraper -> gateway, serving port": ((scraper, gateway, serving, "TCP"), both),
        "scraper -> controller, another port": ((scraper, controller, 8080, "TCP"), {"jobs ingress", "metrics ingress"}),
        "scraper -> gateway, metrics port over UDP": ((scraper, gateway, metrics, "UDP"), both),
        "scraper -> transform Job, metrics port": ((scraper, transform, metrics, "TCP"), {"jobs ingress"}),
        "scraper -> session, metrics port": ((scraper, session, metrics, "TCP"), {"session ingress"}),
        "another pod -> gateway, metrics port": ((not_scraper, gateway, metrics, "TCP"), both),
        "a pod of the namespace -> controller, metrics port":
            ((neighbour, controller, metrics, "TCP"), {"jobs ingress", "metrics ingress"}),
        "external address -> gateway, metrics port": ((host(EXTERNAL), gateway, metrics, "TCP"), both),
    }
    verdicts = evaluate(netpol_eval, policies, {row: conn for row, (conn, _) in rows.items()})
    assert {row: denials(v, short) for row, v in verdicts.items()} == {row: want for row, (_, want) in rows.items()}
    # The session policy is runner/k8s/policy.py's, unchanged by the metrics: its one egress rule
    # is the gateway's serving port.
    (session_policy,) = [p for p in policies if p["metadata"]["name"] == names.object_name("team-a", "session", "policy")]
    assert [port for rule in session_policy["spec"]["egress"] for port in rule["ports"]] == [{"protocol": "TCP", "port": serving}]
