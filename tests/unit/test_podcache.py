"""The pod watch (runner/k8s/podcache.py) is a background thread: it must never swallow an
error (issue 13). A refusal (401/403: missing RBAC, an expired token) ends it at once with the
API server's reason, and start() says so instead of failing 120 s later with a generic error;
other failures are logged and retried with a growing pause, not every second forever."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time

import pytest
from kubernetes.client.exceptions import ApiException

from runner.errors import UserError
from runner.k8s import podcache
from runner.k8s.podcache import PodCache


def _api_error(status: int, reason: str, message: str) -> ApiException:
    e = ApiException(status=status, reason=reason)
    e.body = json.dumps({"kind": "Status", "message": message})
    return e


class FakeKube:
    """list_pods fails with the given errors in turn, then lists nothing; the watch idles."""

    def __init__(self, errors):
        self.errors = list(errors)
        self.lists = 0
        self.stopped = threading.Event()

    def list_pods(self, selector):
        self.lists += 1
        if self.errors:
            raise self.errors.pop(0)
        return [], "1"

    def watch_pods(self, selector, rv):
        while not self.stopped.wait(0.05):
            yield from ()
        raise ConnectionResetError("the watch connection dropped")


FORBIDDEN = ('pods is forbidden: User "system:serviceaccount:probes:controller" cannot list resource "pods" '
             'in API group "" in the namespace "probes"')


def test_a_refused_watch_fails_start_at_once_with_the_reason(monkeypatch, caplog):
    monkeypatch.setattr(podcache, "FIRST_PAUSE_SECONDS", 0.01)
    cache = PodCache(FakeKube([_api_error(403, "Forbidden", FORBIDDEN)]), "app=x")
    t0 = time.monotonic()
    with pytest.raises(UserError, match=r"the pod watch was refused: 403 Forbidden: pods is forbidden: .*cannot list"):
        cache.start()
    assert time.monotonic() - t0 < 5
    assert cache.kube.lists == 1  # a refusal is not retried
    assert any("403 Forbidden" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)


def test_a_waiter_is_told_when_the_watch_is_refused_later(monkeypatch):
    monkeypatch.setattr(podcache, "FIRST_PAUSE_SECONDS", 0.01)
    kube = FakeKube([])
    cache = PodCache(kube, "app=x")
    cache.start()
    kube.errors.append(_api_error(401, "Unauthorized", "Unauthorized"))
    kube.stopped.set()  # the watch's connection drops; the re-list is refused
    with pytest.raises(UserError, match="401 Unauthorized"):
        asyncio.run(cache.wait("pod-a", lambda pod: pod is not None, timeout=30))


def test_other_failures_are_logged_and_retried_with_a_growing_pause(monkeypatch, caplog):
    pauses = []
    monkeypatch.setattr(podcache, "FIRST_PAUSE_SECONDS", 0.01)
    real_wait = threading.Event.wait

    cache = PodCache(FakeKube([_api_error(500, "Internal Server Error", "etcd timeout"), ConnectionResetError("reset"),
                               _api_error(503, "Service Unavailable", "")]), "app=x")
    monkeypatch.setattr(cache._stop, "wait", lambda t=None: (pauses.append(t), real_wait(cache._stop, t))[1])
    caplog.set_level(logging.WARNING, logger="runner.k8s.podcache")
    cache.start()
    assert cache.kube.lists == 4
    assert pauses[:3] == [0.01, 0.02, 0.04]
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 3 and "500 Internal Server Error: etcd timeout" in logged[0] and "ConnectionResetError" in logged[1]
    cache.stop()


def _pod(name: str, rv: int, phase: str = "Pending") -> dict:
    return {"metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": str(rv)}, "status": {"phase": phase}}


def test_an_event_wakes_only_the_waiters_of_its_pod():
    """Each session waits on its own pod: an event of another pod must not wake it. Waking
    every waiter on every event cost O(events x sessions running) wake-ups; at 500 sessions at
    once the controller's CPU per session doubled (bench/scale.py)."""
    cache = PodCache(FakeKube([]), "app=x")
    checks = {"b": 0, "c": 0}
    got: dict[str, object] = {}

    async def waiter(name: str) -> None:
        def running(pod):
            checks[name] += 1
            return pod is not None and pod["status"]["phase"] == "Running" and pod["metadata"]["resourceVersion"]

        got[name] = await cache.wait(name, running, timeout=10)

    # The waiters are coroutines of the campaign's loop (its own thread here); the events come
    # from the watch's thread (this one).
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    waiters = [asyncio.run_coroutine_threadsafe(waiter(n), loop) for n in ("b", "c")]
    while sum(checks.values()) < 2:
        time.sleep(0.01)
    for rv in range(200):
        cache._apply("MODIFIED", _pod("a", rv))
        time.sleep(0.0005)
    cache._apply("MODIFIED", _pod("b", 1000, "Running"))
    waiters[0].result(5)
    assert got["b"] == "1000"
    assert checks["b"] == 2  # before: about 200, once per event of pod a
    assert checks["c"] == 1
    cache._relist()  # a re-list may have changed any pod: every waiter looks again
    cache._apply("MODIFIED", _pod("c", 1001, "Running"))
    waiters[1].result(5)
    assert got["c"] == "1001" and checks["c"] >= 2 and not cache._waiting
    loop.call_soon_threadsafe(loop.stop)


def test_thousands_of_sessions_wait_on_their_pods_without_a_thread_each():
    """Issue 32, item 1: "No thread per session. The controller's waiting (pod start, stream
    follow, collection) on an event loop". 2,000 waiters, each on its own pod, add no thread,
    and each is woken by its pod's event alone."""
    cache = PodCache(FakeKube([]), "app=x")
    names = [f"s-{i}" for i in range(2000)]

    async def scenario() -> list[object]:
        before = threading.active_count()  # the suite's own (other tests' daemons may still run)
        waiting = [asyncio.create_task(cache.wait(n, lambda p: p is not None and p["metadata"]["resourceVersion"], 30))
                   for n in names]
        while len(cache._waiting) < len(names):
            await asyncio.sleep(0.01)
        threads = threading.active_count()
        feeder = threading.Thread(target=lambda: [cache._apply("ADDED", _pod(n, i)) for i, n in enumerate(names)])
        feeder.start()
        got = await asyncio.gather(*waiting)
        feeder.join()
        assert threads <= before, f"{threads - before} more threads while 2,000 sessions waited"
        return got

    assert asyncio.run(scenario()) == [str(i) for i in range(2000)]
    assert not cache._waiting


def test_a_pod_is_kept_as_what_the_runner_reads_of_it():
    """Metadata but managedFields (half of a session pod's memory as Python objects), the node,
    the status; the spec's containers, volumes and the rest are not kept."""
    cache = PodCache(FakeKube([]), "app=x")
    status = {"phase": "Running", "containerStatuses": [{"name": "reader", "state": {"running": {}}}]}
    meta = {"name": "p", "uid": "u", "resourceVersion": "7", "labels": {"a": "b"}, "annotations": {"c": "d"},
            "deletionTimestamp": "2026-12-04T00:00:00Z"}
    pod = {"metadata": {**meta, "managedFields": [{"manager": "kube-scheduler", "fieldsV1": {"f:status": {}}}]},
           "spec": {"nodeName": "node-1", "containers": [{"name": "reader", "image": "x"}], "volumes": []},
           "status": status}
    cache._apply("ADDED", pod)
    assert cache.get("p") == {"metadata": meta, "spec": {"nodeName": "node-1"}, "status": status}
    cache._apply("MODIFIED", {"metadata": {"name": "q", "uid": "v"}, "spec": {"containers": []}})
    assert cache.get("q") == {"metadata": {"name": "q", "uid": "v"}, "spec": {}, "status": {}}
