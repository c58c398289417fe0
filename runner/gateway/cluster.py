"""The gateway of an install: the chart's gateway Deployment runs ``probe-runner gateway``, the
same ``Gateway`` as a local run's, with what a long-lived server apart from the controller
needs on top:

- **Which attempts run** comes from a watch of the install's session pods: a token is served
  while its attempt's pod exists, is not being deleted and its harness has not ended, and only
  from that pod's own address (``gateway.bind_to_pod_address``). The controller deletes the pod
  once the outcome is journaled, so that is the revocation, and a restarted gateway knows it
  again from its first list.
- **What each attempt spent, and may still spend**, is kept in a Lease named as the attempt's
  pod and owned by it (deleted with it): each gateway pod writes its own meter into its own
  annotation ``meter.probe-runner.io/<gateway pod>``: what it metered, and what it *holds* of
  the session's room. A call is forwarded only within what its gateway holds there; a hold is
  raised by writing the Lease at the resourceVersion it was read at (optimistic concurrency),
  against what the other gateways hold at that moment, so no two hold the same room and the
  holds together never pass the session's limit plus one call's most (``budget.call_usd``),
  however a session spreads its calls over the replicas. One write holds ``gateway.hold_usd``
  beyond the call, so the calls that fit in it need none. A gateway gives back what an attempt
  holds beyond its spend once the attempt ends (``Gateway.close``: its harness is over, and
  nothing of it in flight) or the gateway stops; one killed meanwhile leaves its hold, which
  counts in full. The controller sums the annotations into the capture record.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from decimal import Decimal
from typing import Any

from runner.errors import UserError
from runner.gateway.server import USAGE_FIELDS, Attempt, Gateway, GatewayThread, check_upstream
from runner.gateway.tokens import Claims
from runner.k8s import manifests, names, podstate
from runner.k8s.api import Conflict, Kube
from runner.k8s.podcache import Pod, PodCache
from runner.metrics import Metrics, serving
from runner.settings import Settings

log = logging.getLogger(__name__)

SETTLE_SECONDS = 15.0  # how long the controller waits for the gateways to settle the meter of an ended harness
CLOSE_SECONDS = 1.0  # how often the gateway gives back what ended attempts hold
PRUNE_SECONDS = 60.0  # how often the gateway drops the meters of attempts whose pods are gone


def meter_key(gateway_pod: str) -> str:
    """The annotation of one gateway pod's meter; its name part is at most 63 characters, as a
    pod's name need not be."""
    return f"{names.METER_PREFIX}/{names.label_value(gateway_pod)}"


def meter_lease(instance: str, namespace: str, pod: dict[str, Any], gateway_pod: str, claims: Claims,
                state: dict[str, Any], lease: dict[str, Any] | None = None) -> dict[str, Any]:
    """The Lease of one attempt, carrying ``gateway_pod``'s meter of it: ``lease`` (as read) with
    that meter in place, to be written at its resourceVersion, or a new Lease owned by the
    session pod, so the garbage collector deletes it with the pod."""
    meta = pod["metadata"]
    meter = {meter_key(gateway_pod): json.dumps(state, sort_keys=True, separators=(",", ":"))}
    if lease is not None:
        kept = lease["metadata"]
        return {**lease, "metadata": {**kept, "annotations": {**(kept.get("annotations") or {}), **meter}}}
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": meta["name"],
            "namespace": namespace,
            "labels": {**names.component_labels(instance, names.GATEWAY_COMPONENT),
                       names.CAMPAIGN: names.label_value(claims.campaign)},
            "annotations": meter,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}],
        },
        "spec": {},
    }


def meters_of(annotations: dict[str, str], but: str | None = None) -> list[dict[str, Any]]:
    """Each gateway pod's meter in a Lease's annotations, but gateway pod ``but``'s (one that
    does not parse is skipped: a Lease is ours alone, but its annotations are not proof of
    anything else)."""
    out = []
    for k, v in annotations.items():
        if k.startswith(names.METER_PREFIX + "/") and (but is None or k != meter_key(but)):
            try:
                m = json.loads(v)
                Decimal(m["cost_usd"]), Decimal(m["held_usd"]), int(m["calls"])
            except (ValueError, TypeError, KeyError, ArithmeticError):
                log.warning("lease annotation %s is not a meter: %.80s", k, v)
                continue
            out.append(m)
    return out


def claim(meter: dict[str, Any]) -> Decimal:
    """The most one gateway's calls of an attempt may have cost: what it holds (its calls are
    forwarded within it), or what it metered where the provider's usage went past it."""
    return max(Decimal(meter["cost_usd"]), Decimal(meter["held_usd"]))


def settled(meters: list[dict[str, Any]]) -> bool:
    """Whether every gateway has given back what it held beyond its spend (Gateway.close)."""
    return all(Decimal(m["held_usd"]) <= Decimal(m["cost_usd"]) for m in meters)


def total(meters: list[dict[str, Any]]) -> dict[str, Any]:
    """The capture record's meter of an attempt, summed over the gateways that served it; a
    gateway that never gave its hold back (it was killed, or had not settled in time) counts at
    its hold, and the record says how much of the cost that is."""
    unsettled = sum((claim(m) - Decimal(m["cost_usd"]) for m in meters), Decimal(0))
    record: dict[str, Any] = {
        "calls": sum(int(m["calls"]) for m in meters),
        "usage": {k: sum(int(m["usage"].get(k, 0)) for m in meters) for k in USAGE_FIELDS},
        "cost_usd": str(sum((claim(m) for m in meters), Decimal(0))),
        "unpriced_models": sorted({x for m in meters for x in m.get("unpriced_models", [])}),
        "refused": sum(int(m.get("refused", 0)) for m in meters),
    }
    if unsettled:
        record["held_usd"] = str(unsettled)
    for key in ("answered_as",):
        if joined := sorted({x for m in meters for x in m.get(key, [])}):
            record[key] = joined
    if every := next((m["refused_every_session"] for m in meters if m.get("refused_every_session")), None):
        record["refused_every_session"] = every
    return record


class SessionPods:
    """Which attempts run, from ``cache``: a watch of this install's session pods (``watching``)."""

    def __init__(self, cache: PodCache, instance: str) -> None:
        self.cache, self.instance = cache, instance

    @classmethod
    def watching(cls, kube: Kube, instance: str, ended: Callable[[], None] = lambda: None) -> SessionPods:
        """Every campaign's session pods of the install (the watch is started by the caller);
        ``ended`` is called (from the watch's thread) as a change shows a harness terminated."""
        def observe(_: str, pod: Pod) -> None:
            if podstate.terminated(pod, "harness") is not None:
                ended()
        return cls(PodCache(kube, names.selector_string(names.selector(instance, names.SESSION_COMPONENT)), observe),
                   instance)

    def pod(self, claims: Claims) -> dict[str, Any] | None:
        """The attempt's session pod, or a confinement check's canary pod (its claims name the
        canary probe and the check's session), where its annotations name exactly that."""
        if claims.probe == manifests.CANARY_PROBE:
            check = claims.session.removeprefix("check-")
            if not check.isdigit() or manifests.canary_session(int(check)) != claims.session:
                return None
            pod = self.cache.get(manifests.canary_pod_name(self.instance, claims.campaign, int(check)))
            ann = (pod or {}).get("metadata", {}).get("annotations") or {}
            return pod if (ann.get(names.CAMPAIGN), ann.get(names.CANARY)) == (claims.campaign, check) else None
        pod = self.cache.get(manifests.pod_name(self.instance, claims.campaign, claims.probe, claims.session,
                                                claims.attempt))
        ann = (pod or {}).get("metadata", {}).get("annotations") or {}
        named = (ann.get(names.CAMPAIGN), ann.get(names.PROBE), ann.get(names.SESSION), ann.get(names.ATTEMPT))
        return pod if named == (claims.campaign, claims.probe, claims.session, str(claims.attempt)) else None

    def origin(self, claims: Claims, peer: str) -> str | None:
        """Why a request of the attempt from ``peer`` is not its pod's own (None: it is): a token
        is served only from the address of the pod it was minted for, as the watch reports it,
        so a token read elsewhere (another session's pod, a node) is worth nothing there."""
        pod = self.pod(claims)
        status = (pod or {}).get("status") or {}
        own = {ip["ip"] for ip in status.get("podIPs") or [] if isinstance(ip, dict) and "ip" in ip}
        own |= {status["podIP"]} if status.get("podIP") else set()
        if _address(peer) in {_address(ip) for ip in own}:
            return None
        return f"used from {peer or 'an unknown address'}, not its session pod's address ({', '.join(sorted(own)) or 'none yet'})"

    def gone(self, attempt: Attempt) -> bool:
        """Whether the attempt's pod is gone (its token is then refused for good)."""
        return self.cache.get(manifests.pod_name(self.instance, *attempt)) is None

    def ended(self, claims: Claims) -> str | None:
        """Why the attempt no longer runs, or None while it does."""
        pod = self.pod(claims)
        if pod is None:
            return "the attempt has no session pod (it ended)"
        if pod["metadata"].get("deletionTimestamp"):
            return "the attempt's session pod is being deleted"
        if podstate.terminated(pod, "harness") is not None:
            return "the attempt's harness has ended"
        return None


def _address(text: str) -> str:
    """An address in one spelling (an IPv4 client of a dual-stack socket shows as ::ffff:a.b.c.d)."""
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return text
    mapped = getattr(ip, "ipv4_mapped", None)
    return str(mapped or ip)


class LeaseMeters:
    """This gateway pod's side of the attempts' Leases (runner.gateway.server.Shared): a hold
    written at once, under the attempt's own lock, at the resourceVersion last seen (read again
    on a conflict); other writes (a hold given back, the counts at the end) from ``WRITERS``
    threads of its own, each attempt's latest state written by one thread at a time, and a
    failed write logged and tried again."""

    WRITERS = 4
    CONFLICTS = 20  # writes tried against a Lease that keeps changing before the call is refused

    def __init__(self, kube: Kube, instance: str, pods: SessionPods, gateway_pod: str) -> None:
        self.kube, self.instance, self.pods, self.gateway_pod = kube, instance, pods, gateway_pod
        self.state_of: Callable[[Attempt], dict[str, Any] | None] = lambda attempt: None  # the gateway's
        self._leases: dict[Attempt, dict[str, Any] | None] = {}  # as last read or written
        self._locks: dict[Attempt, threading.Lock] = {}
        self._dirty: dict[Attempt, Claims] = {}
        self._busy: set[Attempt] = set()
        self._cond = threading.Condition()
        self._stopping = False
        self._threads = [threading.Thread(target=self._run, name=f"lease-meters-{i}", daemon=True)
                         for i in range(self.WRITERS)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Write what is left, then end."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        if self._dirty:
            log.error("%d meter(s) not written to their Lease before the gateway stopped", len(self._dirty))

    # -- Shared --------------------------------------------------------------------------------
    def others(self, claims: Claims) -> Decimal:
        with self._lock(claims.attempt_key):
            lease = self._read(claims)
        return self._others(lease)

    def hold(self, claims: Claims, propose: Callable[[Decimal], dict[str, Any] | None | bool],
             accept: Callable[[dict[str, Any]], None]) -> bool:
        key = claims.attempt_key
        with self._lock(key):
            lease = self._leases.get(key) if key in self._leases else self._read(claims)
            for _ in range(self.CONFLICTS):
                state = propose(self._others(lease))
                if state is None or state is True:
                    return state is True
                assert isinstance(state, dict)
                try:
                    self._write(claims, state, lease)
                except Conflict:
                    lease = self._read(claims)
                    continue
                accept(state)
                return True
        raise TimeoutError(f"the Lease of {claims.name} changed under {self.CONFLICTS} writes in a row")

    def changed(self, claims: Claims) -> None:
        with self._cond:
            self._dirty[claims.attempt_key] = claims
            self._cond.notify_all()

    def forget(self, attempts: list[Attempt]) -> None:
        """Drop what is kept of attempts whose meters the gateway dropped (``Gateway.forget``)."""
        with self._cond:
            for a in attempts:
                if a not in self._dirty and a not in self._busy:
                    self._leases.pop(a, None)
                    self._locks.pop(a, None)

    # -- the Lease -----------------------------------------------------------------------------
    def _lock(self, key: Attempt) -> threading.Lock:
        with self._cond:
            return self._locks.setdefault(key, threading.Lock())

    def _others(self, lease: dict[str, Any] | None) -> Decimal:
        ann = (lease or {}).get("metadata", {}).get("annotations") or {}
        return sum((claim(m) for m in meters_of(ann, but=self.gateway_pod)), Decimal(0))

    def _read(self, claims: Claims) -> dict[str, Any] | None:
        pod = self.pods.pod(claims)
        lease = None if pod is None else self.kube.read_lease(pod["metadata"]["name"])
        self._leases[claims.attempt_key] = lease
        return lease

    def _write(self, claims: Claims, state: dict[str, Any], lease: dict[str, Any] | None) -> None:
        """Under the attempt's lock: write ``state`` into ``lease`` (as read); Conflict where it changed."""
        pod = self.pods.pod(claims)
        if pod is None:
            raise LookupError(f"{claims.name} has no session pod: its Lease went with it")
        self._leases[claims.attempt_key] = self.kube.write_lease(
            meter_lease(self.instance, self.kube.namespace, pod, self.gateway_pod, claims, state, lease))

    def _write_latest(self, claims: Claims) -> None:
        """Write the gateway's current state of the attempt, whatever the others wrote meanwhile
        (nothing where the meter was dropped or its pod is gone, and its Lease with it)."""
        def latest(others: Decimal) -> dict[str, Any] | bool:
            state = self.state_of(claims.attempt_key)
            return state if state is not None and self.pods.pod(claims) is not None else True
        self.hold(claims, latest, lambda state: None)

    def _take(self) -> Claims | None:
        """The next attempt to write that no other thread is writing; None once stopping and done."""
        with self._cond:
            while True:
                free = [k for k in self._dirty if k not in self._busy]
                if free:
                    self._busy.add(free[0])
                    return self._dirty.pop(free[0])
                if self._stopping and not self._dirty:
                    return None
                self._cond.wait(1.0 if self._stopping else None)

    def _run(self) -> None:
        failures = 0
        while (claims := self._take()) is not None:
            key = claims.attempt_key
            try:
                self._write_latest(claims)
                failures = 0
            except Exception as e:  # noqa: BLE001 - logged, and written again with the next round
                failures += 1
                log.error("writing the meter of %s to its Lease failed: %s: %s", claims.name, type(e).__name__, e)
                with self._cond:
                    self._dirty.setdefault(key, claims)
            finally:
                with self._cond:
                    self._busy.discard(key)
                    self._cond.notify_all()
            if failures:
                if self._stopping and failures > 3:
                    return
                time.sleep(min(10.0, 0.5 * 2 ** min(failures, 5)))


def serve(settings: Settings) -> None:
    """Run the install's gateway until SIGTERM or SIGINT; then serve on for
    gateway.deregister_seconds, let open calls finish within gateway.drain_seconds, and write
    the meters before it exits."""
    s = settings
    if s.provider.api_key is None:
        raise UserError("the gateway holds the provider key: give it as provider.api_key (the chart: the "
                        "credentials Secret's key api-key)")
    if s.gateway.token_secret is None:
        raise UserError("the gateway checks session tokens with gateway.token_secret (the chart's gateway Secret)")
    check_upstream(s.provider.base_url)
    if s.metrics.port and s.metrics.port == s.gateway.port:
        raise UserError(f"metrics.port {s.metrics.port} is gateway.port: the metrics need a listener of their own, which "
                        "sessions do not reach (they name the campaigns served)")
    me = os.environ.get("POD_NAME") or socket.gethostname()
    metrics = Metrics()
    # No lingering after a stop: a replaced gateway pod's metrics end with it (its grace period
    # is the deregistration's and the drain's), and its successor counts on.
    served = s.metrics.model_copy(update={"linger_seconds": 0.0})
    with serving(metrics, served, f"gateway {me}") if s.metrics.port else nullcontext(0):
        _serve(s, me, metrics)


def _serve(s: Settings, me: str, metrics: Metrics) -> None:
    k = s.kube
    assert s.provider.api_key is not None and s.gateway.token_secret is not None, "serve() checked them"
    kube = Kube(k, metrics=metrics.api)
    # The loop below gives back what ended attempts hold: at once when the watch shows a harness
    # ended (the controller waits for that to journal the outcome), else every CLOSE_SECONDS.
    wake = threading.Event()
    pods = SessionPods.watching(kube, k.instance, wake.set)
    pods.cache.start()
    meters = LeaseMeters(kube, k.instance, pods, me)
    ca_file = f"{manifests.PROVIDER_CA_DIR}/ca.crt" if k.provider_ca_configmap else None
    gateway = Gateway(s.provider.base_url, s.provider.api_key.get_secret_value(),
                      s.gateway.token_secret.get_secret_value().encode(), s.gateway.prices,
                      connect_timeout=s.gateway.connect_timeout_seconds, read_timeout=s.gateway.read_timeout_seconds,
                      ended=pods.ended, origin=pods.origin if s.gateway.bind_to_pod_address else None,
                      shared=meters, ca_file=ca_file, policy=s.gateway, metrics=metrics.gateway)
    meters.state_of = gateway.state_of
    stop = threading.Event()
    def stopping(*_: object) -> None:
        stop.set()
        wake.set()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stopping)
    meters.start()
    try:
        with GatewayThread(gateway, host=None, port=s.gateway.port, shutdown_seconds=s.gateway.drain_seconds):
            log.info("gateway %s serving on port %d for %s, forwarding to %s", me, s.gateway.port, k.instance,
                        s.provider.base_url)
            pruned = time.monotonic()

            def tend() -> None:
                nonlocal pruned
                gateway.close(lambda claims: pods.ended(claims) is not None)
                if time.monotonic() - pruned > PRUNE_SECONDS:
                    meters.forget(gateway.forget(pods.gone))
                    pruned = time.monotonic()

            while not stop.is_set():
                wake.wait(CLOSE_SECONDS)
                wake.clear()
                if not stop.is_set():
                    tend()
            gateway.stopping = True
            # The pod's deletion and the signal arrive together, but the Service's endpoints and
            # each node's proxy forget the pod a moment later: a listener closed now refuses the
            # connections still sent here (a `helm test` right after a rollout once failed so).
            log.info("stopping: serving %g s more while the Service forgets this pod, then open calls get %g s",
                     s.gateway.deregister_seconds, s.gateway.drain_seconds)
            until = time.monotonic() + s.gateway.deregister_seconds
            while (left := until - time.monotonic()) > 0:
                time.sleep(min(left, CLOSE_SECONDS))
                tend()
        gateway.close(lambda claims: True)  # this gateway serves no more calls: what it holds goes back
    finally:
        meters.stop()
        pods.cache.stop()
