"""The Prometheus metrics (issue 31, item 1; runner/metrics.py): what a run's progress events,
the Kubernetes client's requests, the budget gate and the gateway's calls make of them, against
complete expected samples; and that nothing a session sends becomes a label value."""

from __future__ import annotations

import asyncio
import http.client
import json
import time
import urllib.request
from decimal import Decimal
from urllib.parse import quote

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, generate_latest

from runner.budget import Gate
from runner.errors import UserError
from runner.gateway import tokens
from runner.gateway.server import Gateway, GatewayThread
from runner.k8s.api import Kube
from runner.ledger import Ledger
from runner.metrics import (
    GATEWAY_OUTCOMES,
    OUTCOMES,
    PHASE_BUCKETS,
    REFUSALS,
    VERBS,
    ApiMetrics,
    GatewayMetrics,
    Metrics,
    RunMetrics,
    outcome_word,
    serving,
    verb_of,
)
from runner.phases import PHASES
from runner.progress import BudgetBooks, Paused, RunEnded, RunNote, RunPlanned, SessionEnded, SessionStarted, chain
from runner.settings import DEFAULT_PRICES, GatewaySettings, KubeSettings, MetricsSettings, load_settings
from runner.store.file import FileStore
from tests.ports import free_port
from tests.support.dashboard import METRICS

D = Decimal
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(registry: CollectorRegistry) -> Samples:
    """Every sample of ``registry`` but the client library's *_created timestamps."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in registry.collect() for s in family.samples
            if not s.name.endswith("_created")}


def test_the_metrics_served_are_those_the_charts_dashboard_queries():
    """The contract with the chart's dashboard (tests/support/dashboard.py): every metric by its
    name, type and labels, and no other."""
    metrics = Metrics()
    metrics.run(RunPlanned("c1", {"present": 1}))  # every labelled family gets a sample, which shows its labels
    metrics.run(BudgetBooks("c1", D("1"), D("0"), D("0")))
    served = {}
    for family in metrics.registry.collect():
        name = f"{family.name}_total" if family.type == "counter" else family.name
        labels = {tuple(k for k in s.labels if k != "le") for s in family.samples if not s.name.endswith("_created")}
        assert len(labels) == 1, (name, labels)
        served[name] = (family.type, labels.pop())
    assert served == METRICS


def test_a_runs_events_make_these_samples():
    registry = CollectorRegistry()
    told: list[object] = []
    tell = chain(RunMetrics(registry), told.append)  # as the service chains it with the CLI's renderer
    events = [
        RunPlanned("c1", {"present": 2, "absent": 1}),
        BudgetBooks("c1", D("1"), D("0"), D("0")),
        BudgetBooks("c1", D("1"), D("0"), D("0.4")),
        SessionStarted("present", "P-1/present-001"),
        SessionEnded("present", "P-1/present-001", "P-1", "present-001", "succeeded", D("0.0125"), 1000),
        BudgetBooks("c1", D("1"), D("0.0125"), D("0")),
        Paused("provider throttling in P-1/present-001 (3 retries): new sessions wait 30 s", 30.0),
        RunNote("a note is not a pause"),
        BudgetBooks("c1", D("1"), D("0.0125"), D("0.4")),
        SessionStarted("absent", "P-1/absent-001"),
        SessionEnded("absent", "P-1/absent-001", "P-1", "absent-001", "failed (ExecError: exec in pod: exited 1)", None, 0),
        SessionEnded("present", "P-1/present-002", "P-1", "present-002", "not started (over budget)", None),
        RunEnded(),
    ]
    for e in events:
        tell(e)
    assert told == events
    assert samples(registry) == {
        ("probe_runner_sessions", (("arm", "present"), ("campaign", "c1"), ("state", "waiting"))): 0,
        ("probe_runner_sessions", (("arm", "present"), ("campaign", "c1"), ("state", "running"))): 0,
        ("probe_runner_sessions", (("arm", "present"), ("campaign", "c1"), ("state", "done"))): 2,
        ("probe_runner_sessions", (("arm", "absent"), ("campaign", "c1"), ("state", "waiting"))): 0,
        ("probe_runner_sessions", (("arm", "absent"), ("campaign", "c1"), ("state", "running"))): 0,
        ("probe_runner_sessions", (("arm", "absent"), ("campaign", "c1"), ("state", "done"))): 1,
        ("probe_runner_session_starts_total", (("arm", "present"), ("campaign", "c1"))): 1,
        ("probe_runner_session_starts_total", (("arm", "absent"), ("campaign", "c1"))): 1,
        **{("probe_runner_session_outcomes_total", (("arm", arm), ("campaign", "c1"), ("status", status))):
           {("present", "succeeded"): 1, ("present", "not_started"): 1, ("absent", "failed"): 1}.get((arm, status), 0)
           for arm in ("present", "absent") for status in OUTCOMES},
        ("probe_runner_spend_usd_total", (("campaign", "c1"),)): 0.0125,
        ("probe_runner_budget_reserved_usd", (("campaign", "c1"),)): 0.4,
        ("probe_runner_budget_left_usd", (("campaign", "c1"),)): 0.5875,
        ("probe_runner_throttle_pauses_total", (("campaign", "c1"),)): 1,
        ("probe_runner_captured_bytes_total", (("campaign", "c1"),)): 1000,
        **phase_samples("c1", {}),  # no session's end carried a milestone
    }


def phase_samples(campaign: str, observed: dict[str, list[float]]) -> Samples:
    """The phase histogram's samples: every phase's series, with ``observed`` seconds in them."""
    out: Samples = {}
    for phase in PHASES:
        values = observed.get(phase, [])
        labels = (("campaign", campaign), ("phase", phase))
        for le in (*PHASE_BUCKETS, float("inf")):
            bound = "+Inf" if le == float("inf") else str(le)
            out[("probe_runner_session_phase_seconds_bucket", ((labels[0]), ("le", bound), labels[1]))] = \
                sum(1 for v in values if v <= le)
        out[("probe_runner_session_phase_seconds_count", labels)] = len(values)
        out[("probe_runner_session_phase_seconds_sum", labels)] = sum(values)
    return out


def test_a_sessions_phases_are_observed_as_it_ends():
    """Each phase its milestones bound, in seconds, as the session's end event tells them; one
    the node's clock made negative counts as 0; a session not started observes none."""
    registry = CollectorRegistry()
    run = RunMetrics(registry)
    run(RunPlanned("c1", {"present": 3}))
    run(SessionStarted("present", "P-1/present-001"))
    run(SessionEnded("present", "P-1/present-001", "P-1", "present-001", "succeeded", None, 10, {
        "queued": "2026-01-01T00:00:00.000Z", "slot_held": "2026-01-01T00:00:00.020Z",
        "pod_created": "2026-01-01T00:00:00.070Z", "scheduled": "2026-01-01T00:00:00.100Z",
        "containers_started": "2026-01-01T00:00:02.100Z", "harness_started": "2026-01-01T00:00:02.000Z",
        "harness_exited": "2026-01-01T00:00:42.000Z", "policy_wait_seconds": 0.7,
        "outcome_journaled": "2026-01-01T00:00:42.300Z"}))
    run(SessionStarted("present", "P-1/present-002"))
    run(SessionEnded("present", "P-1/present-002", "P-1", "present-002", "refused (the policy)", None, 0, {
        "queued": "2026-01-01T00:00:00.000Z", "budget_held": "2026-01-01T00:00:03.000Z",
        "slot_held": "2026-01-01T00:00:03.001Z"}))
    run(SessionEnded("present", "P-1/present-003", "P-1", "present-003", "not started (over budget)", None, 0,
                     {"queued": "2026-01-01T00:00:00.000Z"}))
    got = {k: v for k, v in samples(registry).items() if k[0].startswith("probe_runner_session_phase_seconds")}
    assert got == phase_samples("c1", {
        "budget_held": [3.0], "slot_held": [0.02, 0.001], "pod_created": [0.05], "scheduled": [0.03],
        "containers_started": [2.0], "harness_started": [0.0], "harness_exited": [40.0], "outcome_journaled": [0.3]})


def test_a_run_in_the_middle_counts_its_sessions_by_state():
    registry = CollectorRegistry()
    run = RunMetrics(registry)
    run(RunPlanned("c1", {"present": 3}))
    run(SessionStarted("present", "P-1/present-001"))
    run(SessionStarted("present", "P-1/present-002"))
    run(SessionEnded("present", "P-1/present-001", "P-1", "present-001", "interrupted (the pod was deleted)", None, 10))

    def state(s: str) -> float | None:
        return registry.get_sample_value("probe_runner_sessions", {"campaign": "c1", "arm": "present", "state": s})

    assert (state("waiting"), state("running"), state("done")) == (1, 1, 1)
    assert registry.get_sample_value("probe_runner_session_outcomes_total",
                                     {"campaign": "c1", "arm": "present", "status": "interrupted"}) == 1


@pytest.mark.parametrize(("status", "word"), [
    ("succeeded", "succeeded"), ("failed", "failed"), ("failed (TimeoutError: x)", "failed"),
    ("refused (workspace could not be sealed)", "refused"), ("interrupted (lost)", "interrupted"),
    ("not started (over budget)", "not_started"), ("not started (NotStarted: quota)", "not_started"),
    ("pending", "other"), ("", "other"),
])
def test_a_sessions_status_is_one_word_of_a_fixed_set(status, word):
    assert outcome_word(status) == word


def test_the_budget_gate_tells_its_books_in_their_order(tmp_path):
    ledger = Ledger(FileStore(tmp_path), "c1")
    registry = CollectorRegistry()
    run = RunMetrics(registry)
    gate = Gate(ledger, D("1"), D("0.4"), lambda g: run(BudgetBooks("c1", g.budget, g.spent, g.reserved)))

    def books() -> tuple[float | None, float | None]:
        return (registry.get_sample_value("probe_runner_budget_reserved_usd", {"campaign": "c1"}),
                registry.get_sample_value("probe_runner_budget_left_usd", {"campaign": "c1"}))

    assert books() == (0, 1)
    asyncio.run(gate.hold())
    assert books() == (0.4, 0.6)
    ledger.intent("P-1/present-001", 1, {"d": 1})
    ledger.start("P-1/present-001", 1, gate.money())
    ledger.outcome("P-1/present-001", 1, "succeeded", {"cost_usd": "0.1"})
    asyncio.run(gate.done(ledger, "P-1/present-001", 1))
    assert books() == (0, 0.9)
    asyncio.run(gate.hold())
    asyncio.run(gate.done(ledger, "P-1/present-002", 1))  # never started: its hold is given back
    assert books() == (0, 0.9)


def test_the_kubernetes_clients_requests_and_retries_are_counted_by_verb():
    registry = CollectorRegistry()
    kube = Kube(KubeSettings(api_attempts=3, api_backoff_seconds=0), api_client=client.ApiClient(),
                metrics=ApiMetrics(registry))
    failures = [ApiException(status=503), ApiException(status=429)]

    def create_namespaced_pod() -> str:  # a transient error twice, then an answer
        if failures:
            raise failures.pop(0)
        return "created"

    def read_namespaced_lease() -> str:
        return "read"

    assert kube.call(create_namespaced_pod) == "created"
    assert kube.call(read_namespaced_lease) == "read"
    kube.tally.add("exec transfers", "exec", 1)
    kube.tally.add("exec transfers", "exec", 2)
    requests, retries = {"create": 3, "read": 1, "exec": 2}, {"create": 2, "exec": 1}
    assert samples(registry) == {
        **{("probe_runner_api_requests_total", (("verb", v),)): requests.get(v, 0) for v in VERBS},
        **{("probe_runner_api_retries_total", (("verb", v),)): retries.get(v, 0) for v in VERBS},
        ("probe_runner_exec_transfers_total", ()): 2,
    }
    assert kube.tally.summary() == "API requests 4 (2 retried); exec transfers 2 (1 retried)"  # the log's tally agrees
    assert [verb_of(m) for m in ("list_namespaced_pod", "replace_namespaced_lease", "delete_namespaced_pod",
                                 "connect_get_namespaced_pod_exec", "")] == ["list", "replace", "delete", "other", "other"]


def test_the_gateways_outcomes_make_these_samples():
    registry = CollectorRegistry()
    g = GatewayMetrics(registry)
    g.refused("token")
    g.refused("limit")
    g.refused("limit")
    g.refused("policy", canary=True)  # a confinement check's own probes: apart from the sessions' refusals
    g.refused("policy", canary=True)
    g.forwarded(3000)
    g.answered(0.3, 700)
    g.failed()
    got = samples(registry)
    buckets = {k: v for k, v in got.items() if k[0] == "probe_runner_gateway_upstream_seconds_bucket"}
    assert buckets[("probe_runner_gateway_upstream_seconds_bucket", (("le", "0.25"),))] == 0
    assert buckets[("probe_runner_gateway_upstream_seconds_bucket", (("le", "0.5"),))] == 1
    assert buckets[("probe_runner_gateway_upstream_seconds_bucket", (("le", "+Inf"),))] == 1
    rest = {k: v for k, v in got.items() if k not in buckets}
    assert rest == {
        ("probe_runner_gateway_calls_total", (("outcome", "forwarded"),)): 1,
        ("probe_runner_gateway_calls_total", (("outcome", "refused"),)): 3,
        ("probe_runner_gateway_calls_total", (("outcome", "failed"),)): 1,
        **{("probe_runner_gateway_refusals_total", (("reason", r),)): {"token": 1, "limit": 2}.get(r, 0) for r in REFUSALS},
        **{("probe_runner_gateway_canary_refusals_total", (("reason", r),)): {"policy": 2}.get(r, 0) for r in REFUSALS},
        ("probe_runner_gateway_upstream_seconds_count", ()): 1,
        ("probe_runner_gateway_upstream_seconds_sum", ()): 0.3,
        ("probe_runner_gateway_upstream_bytes_total", (("direction", "request"),)): 3000,
        ("probe_runner_gateway_upstream_bytes_total", (("direction", "response"),)): 700,
    }


HOSTILE = "campaign-of-someone-else\"} 1\nprobe_runner_x{a=\"b"  # what a session could hope to see echoed as a label


def _ask(url: str, method: str, path: str, token: str | None, body: bytes = b"{}") -> int:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=20)
    conn.request(method, path, body=body, headers={"content-type": "application/json", **({"x-api-key": token} if token else {})})
    status = conn.getresponse().status
    conn.close()
    return status


def test_a_hostile_sessions_requests_leave_the_gateways_label_sets_as_they_were():
    """Crafted requests (forged and foreign tokens, paths and models of free text, a body too
    large, a spent limit, an attempt ended) are each counted under one reason of the fixed set;
    no label value, and no series, is made of anything the session sent."""
    metrics = Metrics()
    before = {(name, labels) for name, labels in samples(metrics.registry)}
    secret = tokens.new_secret()
    unreachable = f"http://127.0.0.1:{free_port()}"
    g = Gateway(unreachable, "the-real-key", secret, DEFAULT_PRICES, campaigns=["camp"],
                policy=GatewaySettings(max_body_bytes=4096), metrics=metrics.gateway)

    def token(campaign: str = "camp", session: str = "s-001", limit: str | None = None, model: str | None = None) -> str:
        return tokens.mint(secret, tokens.Claims(campaign, "P-1", session, 1, int(time.time() + 600), limit, "0.5", model))

    def body(model: str, size: int = 100) -> bytes:
        return json.dumps({"model": model, "max_tokens": 10, "messages": [{"role": "user", "content": "x" * size}]}).encode()

    g.revoke(("camp", "P-1", "s-ended", 1))
    with GatewayThread(g) as served:
        url = served.url
        asked = [
            ("POST", "/v1/messages", None, b"{}"),                                      # token
            ("POST", "/v1/messages", HOSTILE.replace("\n", " "), b"{}"),                # token (forged, free text)
            ("POST", "/v1/messages", tokens.mint(tokens.new_secret(), tokens.Claims(HOSTILE, "P", "s", 1, 2**31, None, None)), b"{}"),
            ("POST", "/v1/messages", token(campaign=HOSTILE), b"{}"),                   # campaign
            ("POST", "/v1/messages", token(session="s-ended"), b"{}"),                  # ended
            ("GET", "/v1/" + quote(HOSTILE.replace("\n", " ")), token(), b""),         # route
            ("POST", "/v1/messages", token(), body("claude-sonnet-4-5", 10_000)),       # size
            ("POST", "/v1/messages", token(model="claude-sonnet-4-5"), body(HOSTILE)),  # policy (a model of free text)
            ("POST", "/v1/messages", token(session="s-priced", limit="1", model=HOSTILE), body(HOSTILE)),  # price
            ("POST", "/v1/messages", token(session="s-spent", limit="0"), body("claude-sonnet-4-5")),     # limit
            ("POST", "/v1/messages", token(session="s-up"), body("claude-sonnet-4-5")),  # forwarded: the provider unreachable
        ]
        statuses = [_ask(url, *a) for a in asked]
    assert statuses == [401, 401, 401, 401, 401, 404, 413, 400, 400, 403, 502], statuses
    after = samples(metrics.registry)
    assert {(name, labels) for name, labels in after} == before  # not one series more
    refusals = {dict(labels)["reason"]: v for (name, labels), v in after.items() if name == "probe_runner_gateway_refusals_total"}
    assert refusals == {"token": 3, "campaign": 1, "ended": 1, "origin": 0, "route": 1, "size": 1, "policy": 1, "price": 1,
                        "bound": 0, "limit": 1}
    calls = {dict(labels)["outcome"]: v for (name, labels), v in after.items() if name == "probe_runner_gateway_calls_total"}
    assert calls == {"refused": 10, "failed": 1, "forwarded": 0} and set(calls) == set(GATEWAY_OUTCOMES)
    text = generate_latest(metrics.registry).decode()
    assert "someone-else" not in text and "probe_runner_x" not in text


def test_the_installs_gateway_refuses_to_serve_its_metrics_on_the_sessions_port():
    from runner.gateway.cluster import serve

    settings = load_settings(store="file:///unused", provider={"api_key": "k", "base_url": "https://api.example.com"},
                             gateway={"token_secret": "s", "port": 8080}, metrics={"port": 8080})
    with pytest.raises(UserError, match="metrics.port 8080 is gateway.port: the metrics need a listener of their own"):
        serve(settings)


def test_the_metrics_are_served_for_the_block_and_a_taken_port_is_the_operators_to_fix():
    metrics = Metrics()
    metrics.api.request("create", 1)
    port = free_port()
    with serving(metrics, MetricsSettings(port=port, address="127.0.0.1"), "a test") as served:
        assert served == port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
        assert 'probe_runner_api_requests_total{verb="create"} 1.0' in text
        with pytest.raises(UserError, match=f"metrics.port {port} on metrics.address 127.0.0.1: cannot listen"):
            with serving(Metrics(), MetricsSettings(port=port, address="127.0.0.1"), "a second"):
                pass
    with pytest.raises(OSError):  # closed with the block
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
