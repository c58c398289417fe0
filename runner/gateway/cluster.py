"""The gateway of an install: the chart's gateway Deployment runs ``probe-runner gateway``, the
same ``Gateway`` as a local run's, with what a long-lived server apart from the controller
needs on top:

- **Which attempts run** comes from a watch of the install's session pods: a token is served
  while its attempt's pod exists, is not being deleted and its harness has not ended. The
  controller deletes the pod once the outcome is journaled, so that is the revocation, and a
  restarted gateway knows it again from its first list.
- **What each attempt spent** is kept in a Lease named as the attempt's pod and owned by it
  (deleted with it): each gateway pod writes its own meter into its own annotation
  ``meter.probe-runner.io/<gateway pod>``, so replicas and a restarted pod never overwrite each
  other. A gateway that first sees an attempt carries what the others metered (a call they
  had in flight at ``call_usd``, the most one call costs), so neither a restart nor a second
  replica lets a session past its limit; the Service's client-IP affinity keeps a session on
  one replica meanwhile. A call is forwarded only once the Lease says it is in flight, so a
  gateway killed mid-call leaves it there, counted at ``call_usd``. The controller sums the
  annotations into the capture record.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import threading
import time
from decimal import Decimal
from typing import Any

from runner.errors import UserError
from runner.gateway.local import check_upstream
from runner.gateway.server import USAGE_FIELDS, Attempt, Gateway, GatewayThread
from runner.gateway.tokens import Claims
from runner.k8s import manifests, names, podstate
from runner.k8s.api import Kube
from runner.k8s.podcache import PodCache
from runner.settings import Settings

log = logging.getLogger(__name__)

SETTLE_SECONDS = 15.0  # how long the controller waits for the gateways' calls of an ended harness to be counted
PRUNE_SECONDS = 60.0  # how often the gateway drops the meters of attempts whose pods are gone


def meter_key(gateway_pod: str) -> str:
    """The annotation of one gateway pod's meter; its name part is at most 63 characters, as a
    pod's name need not be."""
    return f"{names.METER_PREFIX}/{names.label_value(gateway_pod)}"


def meter_lease(instance: str, namespace: str, pod: dict[str, Any], gateway_pod: str, claims: Claims,
                state: dict[str, Any]) -> dict[str, Any]:
    """The Lease of one attempt, carrying ``gateway_pod``'s meter of it; owned by the session
    pod, so the garbage collector deletes it with the pod."""
    meta = pod["metadata"]
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": meta["name"],
            "namespace": namespace,
            "labels": {**names.component_labels(instance, names.GATEWAY_COMPONENT),
                       names.CAMPAIGN: names.label_value(claims.campaign)},
            "annotations": {meter_key(gateway_pod): json.dumps({**state, "call_usd": claims.call_usd or "0"},
                                                               sort_keys=True, separators=(",", ":"))},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}],
        },
        "spec": {},
    }


def meters_of(annotations: dict[str, str]) -> list[dict[str, Any]]:
    """Each gateway pod's meter in a Lease's annotations (one that does not parse is skipped: a
    Lease is ours alone, but its annotations are not proof of anything else)."""
    out = []
    for k, v in annotations.items():
        if k.startswith(names.METER_PREFIX + "/"):
            try:
                m = json.loads(v)
                Decimal(m["cost_usd"]), Decimal(m["call_usd"]), int(m["in_flight"])
            except (ValueError, TypeError, KeyError, ArithmeticError):
                log.warning("lease annotation %s is not a meter: %.80s", k, v)
                continue
            out.append(m)
    return out


def carried_usd(meters: list[dict[str, Any]]) -> Decimal:
    """The most the calls in ``meters`` may have cost: what was metered, and each call still in
    flight (or cut by a gateway that stopped) at call_usd."""
    return sum((Decimal(m["cost_usd"]) + int(m["in_flight"]) * Decimal(m["call_usd"]) for m in meters), Decimal(0))


def total(meters: list[dict[str, Any]]) -> dict[str, Any]:
    """The capture record's meter of an attempt, summed over the gateways that served it; a
    call still in flight when it was read (its gateway stopped mid-call) counts at call_usd."""
    cut = sum(int(m["in_flight"]) for m in meters)
    record: dict[str, Any] = {
        "calls": sum(int(m["calls"]) for m in meters),
        "usage": {k: sum(int(m["usage"].get(k, 0)) for m in meters) for k in USAGE_FIELDS},
        "cost_usd": str(carried_usd(meters)),
        "unpriced_models": sorted({x for m in meters for x in m.get("unpriced_models", [])}),
        "refused": sum(int(m.get("refused", 0)) for m in meters),
    }
    if cut:
        record["cut_calls"] = cut
    return record


class SessionPods:
    """Which attempts run, from ``cache``: a watch of this install's session pods (``watching``)."""

    def __init__(self, cache: PodCache, instance: str) -> None:
        self.cache, self.instance = cache, instance

    @classmethod
    def watching(cls, kube: Kube, instance: str) -> SessionPods:
        """Every campaign's session pods of the install (the watch is started by the caller)."""
        return cls(PodCache(kube, names.selector_string(names.selector(instance, names.SESSION_COMPONENT))), instance)

    def pod(self, claims: Claims) -> dict[str, Any] | None:
        pod = self.cache.get(manifests.pod_name(self.instance, claims.campaign, claims.probe, claims.session,
                                                claims.attempt))
        ann = (pod or {}).get("metadata", {}).get("annotations") or {}
        named = (ann.get(names.CAMPAIGN), ann.get(names.PROBE), ann.get(names.SESSION), ann.get(names.ATTEMPT))
        return pod if named == (claims.campaign, claims.probe, claims.session, str(claims.attempt)) else None

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


class LeaseMeters:
    """Writes this gateway pod's meter of each attempt into the attempt's Lease, from
    ``WRITERS`` threads of its own. Changes that come faster than the API takes them are
    coalesced (an attempt's latest state is what is written, by one thread at a time, so an
    older state never lands after a newer one); ``kept`` waits until an attempt's latest
    change is written (the gateway waits so before it forwards a call); a write that fails is
    logged and tried again."""

    WRITERS = 8

    def __init__(self, kube: Kube, instance: str, pods: SessionPods, gateway_pod: str) -> None:
        self.kube, self.instance, self.pods, self.gateway_pod = kube, instance, pods, gateway_pod
        self._dirty: dict[Attempt, tuple[Claims, dict[str, Any], int]] = {}
        self._version: dict[Attempt, int] = {}
        self._written: dict[Attempt, int] = {}
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

    def changed(self, claims: Claims, state: dict[str, Any]) -> None:
        with self._cond:
            key = claims.attempt_key
            self._version[key] = version = self._version.get(key, 0) + 1
            self._dirty[key] = (claims, state, version)
            self._cond.notify_all()

    def kept(self, claims: Claims, timeout: float = 10.0) -> None:
        """Return once the attempt's latest change is in its Lease; TimeoutError past ``timeout``."""
        key = claims.attempt_key
        with self._cond:
            want = self._version.get(key, 0)
            if not self._cond.wait_for(lambda: self._written.get(key, 0) >= want, timeout):
                raise TimeoutError(f"the meter of {claims.name} was not written to its Lease within {timeout:g} s")

    def forget(self, attempts: list[Attempt]) -> None:
        """Drop what is kept of attempts whose meters the gateway dropped (``Gateway.forget``)."""
        with self._cond:
            for a in attempts:
                if a not in self._dirty and a not in self._busy:
                    self._version.pop(a, None)
                    self._written.pop(a, None)

    def carried(self, claims: Claims) -> Decimal:
        """What other gateway pods metered of the attempt (read when this one first sees it)."""
        pod = self.pods.pod(claims)
        if pod is None:
            return Decimal(0)
        ann = self.kube.lease_annotations(pod["metadata"]["name"]) or {}
        ann.pop(meter_key(self.gateway_pod), None)
        return carried_usd(meters_of(ann))

    def _take(self) -> tuple[Claims, dict[str, Any], int] | None:
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
        while (job := self._take()) is not None:
            claims, state, version = job
            key = claims.attempt_key
            try:
                self._write(claims, state)
                failures = 0
                with self._cond:
                    self._written[key] = max(self._written.get(key, 0), version)
            except Exception as e:  # noqa: BLE001 - logged, and written again with the next round
                failures += 1
                log.error("writing the meter of %s to its Lease failed: %s: %s", claims.name, type(e).__name__, e)
                with self._cond:
                    self._dirty.setdefault(key, job)
            finally:
                with self._cond:
                    self._busy.discard(key)
                    self._cond.notify_all()
            if failures:
                if self._stopping and failures > 3:
                    return
                time.sleep(min(10.0, 0.5 * 2 ** min(failures, 5)))

    def _write(self, claims: Claims, state: dict[str, Any]) -> None:
        pod = self.pods.pod(claims)
        if pod is None:
            return  # its pod is gone, and its Lease with it: nobody will read this meter
        self.kube.put_lease(meter_lease(self.instance, self.kube.namespace, pod, self.gateway_pod, claims, state))


def serve(settings: Settings) -> None:
    """Run the install's gateway until SIGTERM or SIGINT: open calls then get
    gateway.drain_seconds, and the meters are written before it exits."""
    s, k = settings, settings.kube
    if s.provider.api_key is None:
        raise UserError("the gateway holds the provider key: give it as provider.api_key (the chart: the "
                        "credentials Secret's key api-key)")
    if s.gateway.token_secret is None:
        raise UserError("the gateway checks session tokens with gateway.token_secret (the chart's gateway Secret)")
    check_upstream(s.provider.base_url)
    me = os.environ.get("POD_NAME") or socket.gethostname()
    kube = Kube(k)
    pods = SessionPods.watching(kube, k.instance)
    pods.cache.start()
    meters = LeaseMeters(kube, k.instance, pods, me)
    ca_file = f"{manifests.PROVIDER_CA_DIR}/ca.crt" if k.provider_ca_configmap else None
    gateway = Gateway(s.provider.base_url, s.provider.api_key.get_secret_value(),
                      s.gateway.token_secret.get_secret_value().encode(), s.gateway.prices,
                      connect_timeout=s.gateway.connect_timeout_seconds, read_timeout=s.gateway.read_timeout_seconds,
                      ended=pods.ended, changed=meters.changed, carried=meters.carried, persisted=meters.kept,
                      ca_file=ca_file, policy=s.gateway)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    meters.start()
    try:
        with GatewayThread(gateway, host=None, port=s.gateway.port, shutdown_seconds=s.gateway.drain_seconds):
            log.info("gateway %s serving on port %d for %s, forwarding to %s", me, s.gateway.port, k.instance,
                        s.provider.base_url)
            while not stop.wait(PRUNE_SECONDS):
                meters.forget(gateway.forget(pods.gone))
            log.info("stopping: open calls get %g s", s.gateway.drain_seconds)
    finally:
        meters.stop()
        pods.cache.stop()
