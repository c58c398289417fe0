"""The Prometheus metrics of a run and of the provider gateway (issue 31, item 1): every metric
defined here, on a registry of its own (never the client library's global one, so two runs in
one process, or a test, count apart), fed by what the code already tells:

- a run's progress events (runner/progress.py): ``RunMetrics`` is a subscriber, which the
  service chains with the CLI's; a session's end carries its milestones, whose phases
  (runner/phases.py) are observed then;
- the Kubernetes client (runner/k8s/api.py): each request and its retries, by verb;
- the gateway (runner/gateway/server.py): each call's outcome, the reason of a refusal, the
  time and bytes to and from the provider.

Their names and labels are what the chart's dashboard queries: keep them. Every label value is
from a fixed set (``STATES``, ``OUTCOMES``, ``VERBS``, ``GATEWAY_OUTCOMES``, ``REFUSALS``,
``DIRECTIONS``, runner/phases.py's ``PHASES``) or from the plan (campaign, arm), never from what a session sends: a hostile
session cannot grow the label sets, nor learn other campaigns' names (the gateway's listener
for them is not the sessions' one).

``serving`` serves a registry's ``/metrics`` with the client library's own HTTP server on a
thread of its own: the same for the controller (threads, no event loop) and the gateway, where
it is a listener apart from the sessions' port by construction, and answers even while the
gateway's event loop is busy.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from runner.errors import UserError
from runner.phases import PHASES, durations
from runner.progress import BudgetBooks, Paused, RunEvent, RunPlanned, SessionEnded, SessionStarted
from runner.settings import MetricsSettings

log = logging.getLogger(__name__)

PREFIX = "probe_runner"
STATES = ("waiting", "running", "done")
# The ledger's words a session ends with in a run, and not_started (nothing journaled of it, or
# only its intent); anything else is "other".
OUTCOMES = ("succeeded", "failed", "refused", "interrupted", "not_started", "other")
# The Kubernetes API's verbs the runner uses (a client method's first word), exec and watch.
VERBS = ("create", "read", "list", "replace", "patch", "delete", "watch", "exec", "other")
GATEWAY_OUTCOMES = ("forwarded", "refused", "failed")
# Why the gateway refused a call: token (none, or one that does not verify), campaign (not
# served here), ended (the attempt is over), origin (sent from another address than its pod's),
# route (a method and path the CLI does not use), size (a body over gateway.max_body_bytes),
# policy (a body the request policy refuses: model, tools, betas, max_tokens, query), price (a
# model the gateway cannot price), bound (one call could cost more than budget.call_usd),
# limit (the session's limit is spent).
Refusal = Literal["token", "campaign", "ended", "origin", "route", "size", "policy", "price", "bound", "limit"]
REFUSALS: tuple[Refusal, ...] = ("token", "campaign", "ended", "origin", "route", "size", "policy", "price", "bound", "limit")
DIRECTIONS = ("request", "response")
# Seconds from sending a call to the provider to the end of its answer (a streamed answer lasts
# as long as the model writes).
UPSTREAM_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# Seconds a session's phase lasted: a start's phases take tens of milliseconds to minutes (an
# image pull, a pod that cannot be scheduled), the harness's run up to its time limit.
PHASE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)


def outcome_word(status: str) -> str:
    """The outcome label of a session's status as the run reports it (``succeeded``, ``failed
    (ValueError: ...)``, ``not started (over budget)``): its first word, from OUTCOMES."""
    if status.startswith("not started"):
        return "not_started"
    word = status.split(" ", 1)[0]
    return word if word in OUTCOMES else "other"


def verb_of(method: str) -> str:
    """The verb label of a Kubernetes client method (``create_namespaced_pod``: create)."""
    word = method.split("_", 1)[0]
    return word if word in VERBS else "other"


class RunMetrics:
    """A run's sessions, starts, outcomes, spend, budget and throttle pauses, by campaign (and
    arm); a RunSubscriber, told from the run's event loop (runner/aio.py)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.sessions = Gauge(f"{PREFIX}_sessions", "Sessions of this run by state: waiting (planned, not started), "
                              "running, done (its part in this run is over, whatever its outcome).",
                              ["campaign", "arm", "state"], registry=registry)
        self.starts = Counter(f"{PREFIX}_session_starts", "Sessions started.", ["campaign", "arm"], registry=registry)
        self.outcomes = Counter(f"{PREFIX}_session_outcomes", "Sessions ended, by the ledger's status word, or "
                                "not_started.", ["campaign", "arm", "status"], registry=registry)
        self.spend = Counter(f"{PREFIX}_spend_usd", "What the ended sessions' streams state they cost, in US dollars.",
                             ["campaign"], registry=registry)
        self.reserved = Gauge(f"{PREFIX}_budget_reserved_usd", "What sessions of the campaign hold reserved of its "
                              "budget, in US dollars (where a budget is set).", ["campaign"], registry=registry)
        self.left = Gauge(f"{PREFIX}_budget_left_usd", "What is left of the campaign's budget after what is spent and "
                          "reserved, in US dollars (where a budget is set).", ["campaign"], registry=registry)
        self.pauses = Counter(f"{PREFIX}_throttle_pauses", "Pauses of new session starts because the provider "
                              "throttled a session.", ["campaign"], registry=registry)
        self.captured = Counter(f"{PREFIX}_captured_bytes", "Bytes of the sessions' streams stored.", ["campaign"],
                                registry=registry)
        self.phases = Histogram(f"{PREFIX}_session_phase_seconds", "How long each phase of a session lasted, in seconds, "
                                "observed as it ends (runner/phases.py: waiting for the budget or a slot, the pod's start, "
                                "the harness's run, the collection, the outcome's journaling); a phase the executor "
                                "cannot see is not observed, and one the node's clock made negative counts as 0.",
                                ["campaign", "phase"], buckets=PHASE_BUCKETS, registry=registry)
        self._lock = threading.Lock()
        self._campaign = ""
        self._running: set[str] = set()

    def __call__(self, event: RunEvent) -> None:
        with self._lock:
            self._count(event)

    def _count(self, event: RunEvent) -> None:
        if isinstance(event, RunPlanned):
            self._campaign = event.campaign
            for arm, n in event.arms.items():
                self.sessions.labels(event.campaign, arm, "waiting").set(n)
                self.sessions.labels(event.campaign, arm, "running").set(0)
                self.sessions.labels(event.campaign, arm, "done").set(0)
                self.starts.labels(event.campaign, arm)
                for status in OUTCOMES:  # each series exists from the start: rate() sees the first outcome
                    self.outcomes.labels(event.campaign, arm, status)
            self.spend.labels(event.campaign)
            self.pauses.labels(event.campaign)
            self.captured.labels(event.campaign)
            for phase in PHASES:
                self.phases.labels(event.campaign, phase)
        elif isinstance(event, SessionStarted):
            self._running.add(event.key)
            self.sessions.labels(self._campaign, event.arm, "waiting").dec()
            self.sessions.labels(self._campaign, event.arm, "running").inc()
            self.starts.labels(self._campaign, event.arm).inc()
        elif isinstance(event, SessionEnded):
            if event.key in self._running:
                self._running.discard(event.key)
                self.sessions.labels(self._campaign, event.arm, "running").dec()
            else:
                self.sessions.labels(self._campaign, event.arm, "waiting").dec()
            self.sessions.labels(self._campaign, event.arm, "done").inc()
            self.outcomes.labels(self._campaign, event.arm, outcome_word(event.status)).inc()
            if event.cost is not None and event.cost > 0:
                self.spend.labels(self._campaign).inc(float(event.cost))
            if event.stream_bytes > 0:
                self.captured.labels(self._campaign).inc(event.stream_bytes)
            for phase, seconds in durations(event.phases).items():
                self.phases.labels(self._campaign, phase).observe(max(seconds, 0.0))
        elif isinstance(event, Paused):
            self.pauses.labels(self._campaign).inc()
        elif isinstance(event, BudgetBooks):
            self.reserved.labels(event.campaign).set(float(event.reserved))
            self.left.labels(event.campaign).set(float(event.left))


class ApiMetrics:
    """Requests to the Kubernetes API server by verb, the retries among them, and the exec
    transfers (each an API request of verb exec too)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(f"{PREFIX}_api_requests", "Requests sent to the Kubernetes API server, retries "
                                "included, by verb.", ["verb"], registry=registry)
        self.retries = Counter(f"{PREFIX}_api_retries", "Requests to the Kubernetes API server that were a retry "
                               "(runner/retry.py's policy), by verb.", ["verb"], registry=registry)
        self.transfers = Counter(f"{PREFIX}_exec_transfers", "Exec transfers into and out of session pods (the "
                                 "workspace in, the stream and the workspace out), retries included.", registry=registry)
        for verb in VERBS:  # each series exists from the start: rate() sees the first request
            self.requests.labels(verb)
            self.retries.labels(verb)

    def request(self, verb: str, attempt: int) -> None:
        """A request of ``verb`` (from VERBS), the ``attempt``-th try of its call; an exec is a
        transfer too."""
        verb = verb if verb in VERBS else "other"
        self.requests.labels(verb).inc()
        if attempt > 1:
            self.retries.labels(verb).inc()
        if verb == "exec":
            self.transfers.inc()


class GatewayMetrics:
    """The gateway's calls by outcome, its refusals by reason, and the provider's time and bytes."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = Counter(f"{PREFIX}_gateway_calls", "Calls sessions made through the gateway, by outcome: forwarded "
                             "(the provider answered, whatever its status), refused (by the gateway), failed (the "
                             "provider not reached, or the call not metered).", ["outcome"], registry=registry)
        self.refusals = Counter(f"{PREFIX}_gateway_refusals", "Calls the gateway refused, by reason (a fixed set: "
                                + ", ".join(REFUSALS) + ").", ["reason"], registry=registry)
        self.upstream = Histogram(f"{PREFIX}_gateway_upstream_seconds", "Time from sending a call to the provider to the "
                                  "end of its answer, in seconds.", buckets=UPSTREAM_BUCKETS, registry=registry)
        self.canary = Counter(f"{PREFIX}_gateway_canary_refusals", "Requests of a confinement check's canary the gateway "
                              "refused, by reason: the check's own probes of the request policy (a server tool, an MCP "
                              "server), apart from the sessions' calls and refusals.", ["reason"], registry=registry)
        self.bytes = Counter(f"{PREFIX}_gateway_upstream_bytes", "Bytes sent to the provider (request bodies) and read "
                             "from it (answers), by direction.", ["direction"], registry=registry)
        for outcome in GATEWAY_OUTCOMES:  # each series exists from the start: rate() sees the first call
            self.calls.labels(outcome)
        for reason in REFUSALS:
            self.refusals.labels(reason)
            self.canary.labels(reason)
        for direction in DIRECTIONS:
            self.bytes.labels(direction)

    def refused(self, reason: Refusal, canary: bool = False) -> None:
        """A refusal of a session's call, or (``canary``) of a confinement check's probe, counted apart."""
        if canary:
            self.canary.labels(reason).inc()
            return
        self.calls.labels("refused").inc()
        self.refusals.labels(reason).inc()

    def failed(self) -> None:
        self.calls.labels("failed").inc()

    def forwarded(self, sent: int) -> None:
        """The provider answered a call whose body was ``sent`` bytes."""
        self.calls.labels("forwarded").inc()
        self.bytes.labels("request").inc(sent)

    def answered(self, seconds: float, received: int) -> None:
        """The provider's answer ended (or was cut) after ``seconds``, ``received`` bytes read."""
        self.upstream.observe(seconds)
        self.bytes.labels("response").inc(received)


class Metrics:
    """Every metric of this process, on one registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.run = RunMetrics(self.registry)
        self.api = ApiMetrics(self.registry)
        self.gateway = GatewayMetrics(self.registry)


@contextmanager
def serving(metrics: Metrics, settings: MetricsSettings, what: str) -> Iterator[int]:
    """Serve ``metrics`` at ``/metrics`` on settings.address:settings.port for the block (and
    settings.linger_seconds after it), yielding the port; ``what`` names the process in the log.
    A port that cannot be bound fails here, before the block runs."""
    try:
        server, thread = start_http_server(settings.port, settings.address, registry=metrics.registry)
    except OSError as e:  # the port taken, the address not this host's: the operator's to fix
        raise UserError(f"metrics.port {settings.port} on metrics.address {settings.address}: cannot listen ({e})") from None
    port = int(server.server_address[1])
    log.info("%s: metrics on http://%s:%d/metrics", what, settings.address, port)
    try:
        yield port
    finally:
        if settings.linger_seconds > 0:
            time.sleep(settings.linger_seconds)
        server.shutdown()
        server.server_close()
        thread.join(10)
