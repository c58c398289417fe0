"""The metrics, scraped by a real Prometheus (issue 31, item 1: "Tested for real: ... a real
Prometheus (Debian's package) scrapes ... and a PromQL query returns the campaign's sessions by
state"): Debian's ``prometheus`` binary, started here on loopback with a config of its own,
scrapes (a) a local campaign run through the real CLI and the real Claude Code CLI against the
scripted provider, with ``RUNNER_METRICS__PORT`` set, and (b) the provider gateway serving calls
and refusals, its metrics on a listener apart from the sessions' port; each answer is read back
with PromQL through Prometheus's HTTP API."""

from __future__ import annotations

import contextlib
import http.client
import json
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from ports import free_port  # tests/ is on the path (tests/conftest.py)
from support.cli import local_settings, probe_runner
from support.dashboard import dashboard_queries
from support.prometheus import by
from support.prometheus import prometheus as serve_prometheus
from support.waiting import until

from runner.demo import CORPUS, PLAN, SCENARIOS
from runner.gateway import tokens
from runner.gateway.server import Gateway, GatewayThread
from runner.ledger import Ledger
from runner.metrics import Metrics, serving
from runner.settings import DEFAULT_PRICES, MetricsSettings
from runner.store.file import FileStore

SCRAPE = "200ms"  # a local run ends in a minute: scraped often, so its states are seen on the way

Query = Callable[..., list[dict]]


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[dict[str, int]], Query]]:
    """Factory: ``prometheus({job: port})`` starts Prometheus (tests/support/prometheus.py)
    scraping each job's 127.0.0.1:port/metrics every SCRAPE; returns ``query(promql)``, the
    instant query's result."""
    with contextlib.ExitStack() as started:
        def start(targets: dict[str, int]) -> Query:
            config = {"global": {"scrape_interval": SCRAPE, "scrape_timeout": SCRAPE},
                      "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [f"127.0.0.1:{port}"]}]}
                                         for job, port in targets.items()]}
            served = started.enter_context(serve_prometheus(config, tmp_path / "prometheus", targets=len(targets)))
            return served.query

        yield start


def test_prometheus_scrapes_a_local_campaign_run_and_promql_returns_its_sessions_by_state(
        tmp_path, prometheus, scripted_provider, claude_command):
    provider = scripted_provider(json.loads(SCENARIOS.read_text()))
    port = free_port()
    query = prometheus({"run": port})
    # linger: the run serves its last counts for a few scrapes more after its end (metrics.linger_seconds)
    env = {**local_settings(tmp_path, claude_command[0]), "RUNNER_PROVIDER__BASE_URL": provider.base_url,
           "RUNNER_METRICS__PORT": str(port), "RUNNER_METRICS__ADDRESS": "127.0.0.1", "RUNNER_METRICS__LINGER_SECONDS": "2",
           "RUNNER_BUDGET__CAMPAIGN_USD": "20", "RUNNER_BUDGET__SESSION_USD": "0.5"}
    started = time.monotonic()
    done = probe_runner("run", str(PLAN), "--corpus", str(CORPUS), env=env)
    ended = time.time()  # the run served its last counts for the 2 s before
    assert done.returncode == 0, done.stderr
    window = f"[{int(time.monotonic() - started) + 30}s]"
    ran = '{job="run",campaign="demo"}'

    # The campaign's sessions by state, as the last scrape saw them: every one done.
    last = by(query(f"sum by (state) (last_over_time(probe_runner_sessions{ran}{window}))"), "state")
    assert last == {("waiting",): 0, ("running",): 0, ("done",): 8}, last
    # ... and on the way: sessions waiting, then at most two running (concurrency 2), eight in all at every scrape.
    most = by(query(f"max_over_time((sum by (state) (probe_runner_sessions{ran}))[{window[1:-1]}:200ms])"), "state")
    assert 1 <= most[("waiting",)] <= 8 and 1 <= most[("running",)] <= 2 and most[("done",)] == 8, most
    total = f"(sum(probe_runner_sessions{ran}))[{window[1:-1]}:200ms]"
    assert [float(r["value"][1]) for f in ("min", "max") for r in query(f"{f}_over_time({total})")] == [8, 8]
    outcomes = by(query(f"last_over_time(probe_runner_session_outcomes_total{ran}{window}) > 0"), "arm", "status")
    assert outcomes == {("present", "succeeded"): 4, ("absent", "succeeded"): 4}, outcomes
    starts = by(query(f"last_over_time(probe_runner_session_starts_total{ran}{window})"), "arm")
    assert starts == {("present",): 4, ("absent",): 4}

    # Spend is the streams' cost, as `status` sums it; the budget's books settle at it (nothing reserved at the end).
    status = json.loads(probe_runner("status", "demo", "--json", env=env).stdout)
    spend = by(query(f"last_over_time(probe_runner_spend_usd_total{ran}{window})"), "campaign")[("demo",)]
    assert spend == pytest.approx(float(Decimal(status["cost_usd"])), abs=1e-9) and spend > 0
    reserved = by(query(f"last_over_time(probe_runner_budget_reserved_usd{ran}{window})"), "campaign")
    left = by(query(f"last_over_time(probe_runner_budget_left_usd{ran}{window})"), "campaign")
    assert reserved == {("demo",): 0} and left[("demo",)] == pytest.approx(20 - spend, abs=1e-6)
    assert max(by(query(f"max_over_time(probe_runner_budget_reserved_usd{ran}{window})"), "campaign").values()) >= 2.5
    stored = sum(s.detail["stream"]["bytes"] for s in Ledger(FileStore(tmp_path / "store"), "demo").sessions().values())
    captured = by(query(f"last_over_time(probe_runner_captured_bytes_total{ran}{window})"), "campaign")
    assert captured == {("demo",): stored} and stored > 0
    assert by(query(f"last_over_time(probe_runner_throttle_pauses_total{ran}{window})"), "campaign") == {("demo",): 0}
    # The run's own gateway (loopback) forwarded every call of the sessions and refused none.
    calls = by(query(f'last_over_time(probe_runner_gateway_calls_total{{job="run"}}{window})'), "outcome")
    assert calls[("forwarded",)] == len(provider.requests) and calls[("refused",)] == 0 and calls[("failed",)] == 0, calls
    assert by(query(f'last_over_time(probe_runner_gateway_upstream_seconds_count{{job="run"}}{window})'), "job") == {
        ("run",): len(provider.requests)}
    # Every query of the chart's Grafana dashboard parses and returns series, as the run was ending.
    empty = [(title, expr) for title, expr in dashboard_queries(campaign="demo") if not query(expr, ended - 1)]
    assert empty == []


def _ask(url: str, method: str, path: str, token: str | None, body: bytes) -> tuple[int, bytes]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request(method, path, body=body, headers={"content-type": "application/json", "anthropic-version": "2023-06-01",
                                                   **({"x-api-key": token} if token else {})})
    resp = conn.getresponse()
    answer = resp.read()
    conn.close()
    return resp.status, answer


def test_prometheus_scrapes_the_gateways_calls_by_outcome_and_refusals_by_reason(prometheus, scripted_provider):
    provider = scripted_provider(json.loads(SCENARIOS.read_text()), api_key="the-real-key")
    metrics = Metrics()
    secret = tokens.new_secret()
    gateway = Gateway(provider.base_url, "the-real-key", secret, DEFAULT_PRICES, campaigns=["camp"], metrics=metrics.gateway)
    port = free_port()

    def token(session: str, limit: str | None = None) -> str:
        return tokens.mint(secret, tokens.Claims("camp", "P-1", session, 1, int(time.time() + 600), limit, "2", None))

    call = json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}).encode()
    with serving(metrics, MetricsSettings(port=port, address="127.0.0.1"), "the test's gateway"), \
            GatewayThread(gateway) as served:
        query = prometheus({"gateway": port})
        asked = [_ask(served.url, "POST", "/v1/messages", token("s-1"), call),     # forwarded
                 _ask(served.url, "POST", "/v1/messages", token("s-2"), call),     # forwarded
                 _ask(served.url, "POST", "/v1/messages", None, call),             # token
                 _ask(served.url, "POST", "/v1/messages", "not-a-token", call),    # token
                 _ask(served.url, "GET", "/v1/files", token("s-1"), b""),          # route
                 _ask(served.url, "POST", "/v1/messages", token("s-3", limit="0"), call)]  # limit
        assert [status for status, _ in asked] == [200, 200, 401, 401, 404, 403], asked
        # The sessions' port does not serve the metrics: a session asking there is refused.
        status, answer = _ask(served.url, "GET", "/metrics", token("s-1"), b"")
        assert status == 404 and b"probe_runner" not in answer
        expected = {("forwarded",): 2, ("refused",): 5, ("failed",): 0}

        def scraped() -> dict[tuple[str, ...], float]:
            return by(query('sum by (outcome) (probe_runner_gateway_calls_total{job="gateway"})'), "outcome")

        until(lambda: scraped() == expected, 30, "the gateway's calls by outcome in Prometheus", interval=0.2, seen=scraped)
        refusals = by(query('probe_runner_gateway_refusals_total{job="gateway"} > 0'), "reason")
        assert refusals == {("token",): 2, ("route",): 2, ("limit",): 1}, refusals
        assert by(query('probe_runner_gateway_upstream_seconds_count{job="gateway"}'), "job") == {("gateway",): 2}
        sent = by(query('probe_runner_gateway_upstream_bytes_total{job="gateway"}'), "direction")
        assert sent[("request",)] == 2 * len(call) and sent[("response",)] > 0, sent
