"""The confinement monitor: runs the canary (runner/k8s/canary.py) before a campaign's first
session and every ``kube.canary_interval_seconds`` while it runs, and re-lists the
namespace's NetworkPolicies each time.

A check fails when a route a session must not have answers, when the provider gateway (or,
where it is off, the provider through the egress proxy) does not, when a foreign policy now
selects session pods, or when the check cannot finish. The first check's failure refuses the campaign (exit 12, nothing started);
a later one halts new session starts (the campaign then exits 12 with the route named), and
every session that was running is told by its capture record, whose ``confinement_checks``
list the checks from the one in force at its start to its end. A check whose key check found
the provider refusing the install's key is the key's matter, not a route's: exit 2, its remedy
named (the credentials Secret, the gateway's restart).
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NotRequired, TypedDict, TypeVar
from urllib.parse import urlsplit

from runner.errors import ConfinementError, KeyRefused
from runner.executors.base import Halt
from runner.gateway import tokens
from runner.k8s import canary, manifests, names, podstate, policy
from runner.k8s.api import Kube
from runner.settings import KubeSettings, Settings
from runner.share import WHOLE, Share

log = logging.getLogger(__name__)
T = TypeVar("T")


class RouteSummary(TypedDict):
    """One route a check tried, as its summary keeps it."""

    route: str
    target: str
    opened: bool
    must_open: bool


class CheckSummary(TypedDict):
    """What a capture record keeps of a check (its ``confinement_checks``), in the order written."""

    check: int
    at: str
    passed: bool
    settled_seconds: float | None
    routes: list[RouteSummary]
    problem: NotRequired[str]  # only where it failed


def fix_key(kube: KubeSettings) -> str:
    """What an operator does about a key the provider refuses, for this install: the monitor's
    words, and every stop's on this executor (executors/kubernetes.py)."""
    gateway = names.gateway_name(kube.instance)
    return (f"fix the key in the install's credentials Secret (its key api-key) and restart the gateway "
            f"(`kubectl -n {kube.namespace} rollout restart deployment/{gateway}`)")


@dataclass
class Check:
    number: int
    at: str
    results: list[canary.Result]
    problem: str | None  # None: every route as it must be
    settled_seconds: float | None = None  # how long the canary's own policy took to be in force

    @property
    def passed(self) -> bool:
        return self.problem is None

    @property
    def key_refused(self) -> bool:
        """The provider refused the install's key: the operator's key to fix, not a route."""
        return canary.key_refused(self.results)

    def summary(self) -> CheckSummary:
        """What a capture record keeps of a check: when, what was tried, what it found."""
        summary: CheckSummary = {
            "check": self.number, "at": self.at, "passed": self.passed, "settled_seconds": self.settled_seconds,
            "routes": [{"route": r.name, "target": r.target, "opened": r.opened, "must_open": r.must_open}
                       for r in self.results]}
        if self.problem:
            summary["problem"] = self.problem
        return summary


@dataclass
class ConfinementMonitor:
    settings: Settings
    kube: Kube
    campaign: str
    route: manifests.Route  # the session pods' one route (no token: each check's canary gets its own)
    foreign_policies: Callable[[], list[str]]  # names of policies that also select sessions
    token_secret: bytes | None = None  # the gateway's signing key: the canary then asks it as a session would
    share: Share = WHOLE  # the split campaign's share it checks for: its checks' numbers are its own (Share.check_number)
    checks: list[Check] = field(default_factory=list)
    halted: Halt | None = None  # why no further session may start, and whether the key is why
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ---- one check -------------------------------------------------------------------------

    def routes(self) -> list[canary.Route]:
        k = self.settings.kube
        u = urlsplit(self.settings.provider.base_url)
        try:
            addresses = sorted({str(a[4][0]) for a in socket.getaddrinfo(u.hostname, u.port or 443, socket.AF_UNSPEC,
                                                                          socket.SOCK_STREAM)})
        except OSError:
            addresses = []  # the proxy resolves it; the direct routes are then not tried
        neighbour = None
        component, _, port = policy.route(self.settings)
        for pod in self.kube.list_pods(names.selector_string(names.selector(k.instance, component)))[0]:
            ip = (pod.get("status") or {}).get("podIP")
            if ip:
                neighbour = f"{ip}:{port + 1}"
                break
        return canary.routes(self.settings.provider.base_url, addresses, neighbour, k.canary_foreign_hosts,
                             k.canary_extra_targets, gateway=self.route.proxy is None, token=self.token_secret is not None)

    def check(self) -> Check:
        """Run one check to its end (bounded by kube.canary_timeout_seconds)."""
        with self._lock:
            number = self.share.check_number(len(self.checks) + 1)
        at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        settled = None
        try:
            results, settled = self._run_canary(number)
            problem = canary.judge(results)
        except Exception as e:  # noqa: BLE001 - a check that cannot finish is a failed check
            results, problem = [], f"the confinement check could not finish: {e}"
        if problem is None:
            foreign = self.foreign_policies()
            if foreign:
                problem = (f"NetworkPolicy {', '.join(sorted(foreign))} now also selects session pods "
                           "(allow rules add up)")
        found = Check(number, at, results, problem, settled)
        with self._lock:
            self.checks.append(found)
        log.info("confinement check %d: %s", number, "passed" if found.passed else problem,
                 extra={"campaign": self.campaign})
        return found

    def _route_of(self, number: int) -> manifests.Route:
        """The canary's route: the sessions', with a token of check ``number``'s own where the
        gateway is the route, limited to $0 (it may count tokens, never make a call), expiring
        with the canary pod's deadline."""
        if self.token_secret is None or self.route.proxy is not None:
            return self.route
        claims = tokens.Claims(self.campaign, manifests.CANARY_PROBE, manifests.canary_session(number), 1,
                               int(time.time()) + manifests.CANARY_DEADLINE_SECONDS, "0", "0")
        return dataclasses.replace(self.route, token=tokens.mint(self.token_secret, claims))

    def _run_canary(self, number: int) -> tuple[list[canary.Result], float | None]:
        k = self.settings.kube
        pod = manifests.canary_pod(self.settings, self.campaign, number, canary.encode(self.routes()),
                                   self._route_of(number), None if self.share.whole else self.share.name)
        name = pod["metadata"]["name"]
        selector = names.selector_string(pod["metadata"]["labels"])
        if not self.kube.create_pod(pod):  # left by an earlier run of this campaign
            self.kube.delete_pod(name, 0)
            self._wait(selector, lambda p: p is None, 60, "the old canary to go")
            self.kube.create_pod(pod)
        try:
            term = self._wait(selector, lambda p: p and podstate.terminated(p, "canary"), k.canary_timeout_seconds,
                              "the canary's report")
            message = term.get("message") or ""
            try:
                return canary.decode_report(message)
            except ValueError:
                raise RuntimeError(f"the canary pod ended ({term.get('reason')}, exit {term.get('exitCode')}) "
                                   f"without a report: {message[-300:]!r}") from None
        finally:
            self.kube.delete_pod(name, 0)

    def _wait(self, selector: str, ok: Callable[[dict[str, Any] | None], T | None], timeout: float, what: str) -> T:
        deadline = time.monotonic() + timeout
        while True:
            pods, _ = self.kube.list_pods(selector)
            got = ok(pods[0] if pods else None)
            if got:
                return got
            if pods and (why := podstate.never_started(pods[0]) or podstate.unschedulable(pods[0])):
                raise RuntimeError(f"the canary pod cannot start: {why}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {what} within {timeout:g} s")
            time.sleep(1.0)

    # ---- the campaign's checks ---------------------------------------------------------------

    def start(self) -> None:
        """The first check, synchronously (refuses the campaign), then the periodic ones."""
        first = self.check()
        if first.key_refused:
            fix = fix_key(self.settings.kube)
            raise KeyRefused(f"the key check before the first session: {first.problem}; no session was started. "
                             f"{fix[:1].upper()}{fix[1:]}")
        if not first.passed:
            raise ConfinementError(f"confinement check before the first session: {first.problem}; no session was "
                                   "started. Fix the cluster's network policy")
        interval = self.settings.kube.canary_interval_seconds
        if interval > 0:
            self._thread = threading.Thread(target=self._loop, args=(interval,), name="confinement-monitor",
                                            daemon=True)
            self._thread.start()

    def _loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                found = self.check()
            except Exception as e:  # noqa: BLE001 - never die silently: a monitor that stopped is a halt
                log.exception("confinement monitor failed")
                found = Check(self.share.check_number(len(self.checks) + 1), "", [], f"the confinement monitor failed: {e}")
            if not found.passed:
                self.halted = Halt(f"confinement check {found.number} at {found.at}: {found.problem}", found.key_refused)
                log.error("%s: no further session is started", self.halted.why, extra={"campaign": self.campaign})
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.settings.kube.canary_timeout_seconds + 30)

    def since(self, index: int) -> list[CheckSummary]:
        """Summaries of the check in force at ``index`` (the count when a session started) and
        every later one, as the capture record's ``confinement_checks`` holds them."""
        with self._lock:
            return [c.summary() for c in self.checks[max(index - 1, 0):]]

    def count(self) -> int:
        with self._lock:
            return len(self.checks)
