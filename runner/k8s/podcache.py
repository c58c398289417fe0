"""A watch-fed cache of the campaign's session pods: one list, then one watch, never a read of
a pod before each operation.

The watch resumes from the last resourceVersion it saw; a 410 Gone (the version was
compacted away) or any other end re-lists and starts a new watch, so no transition is missed
for good. Waiters are coroutines of the campaign's event loop (runner/aio.py), woken by their
pod's events until its state satisfies them, so a session waiting on its pod holds no thread;
a pod that vanishes from a re-list counts as deleted.

A pod is kept ``trimmed``: its metadata without managedFields, its node, its status. A whole
pod is about 77 KB as Python objects, and a campaign holds one per session running. An event
wakes only the waiters of its pod: each session waits on its own pod, and waking every waiter
on every event cost the controller O(events x sessions running) wake-ups, its CPU per session
doubling from 100 sessions at once to 500 (bench/scale.py).

The watch runs in a background thread, which never swallows an error: a refusal (401, 403:
missing RBAC, an expired token) ends it with the API server's reason, which start() and every
waiter raise; any other failure is logged and retried after a pause that doubles up to
MAX_PAUSE_SECONDS, and returns to the first once a list succeeds.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeAlias, TypeVar

from kubernetes.client.exceptions import ApiException

from runner.errors import UserError
from runner.k8s.api import Kube

log = logging.getLogger(__name__)

Pod: TypeAlias = dict[str, Any]  # a pod as the API sends it: plain JSON, camelCase (podstate reads it)
T = TypeVar("T")
FIRST_PAUSE_SECONDS = 1.0
MAX_PAUSE_SECONDS = 30.0
REFUSED = (401, 403)


def _reason(e: ApiException) -> str:
    """``403 Forbidden: <the API server's message>``."""
    try:
        message = json.loads(e.body or "{}").get("message", "")
    except (ValueError, AttributeError):
        message = ""
    return f"{e.status} {e.reason}" + (f": {message}" if message else "")


def trimmed(pod: Pod) -> Pod:
    """What the runner reads of a pod (runner/k8s/podstate.py, the executor, the gateway's
    session check): metadata but its managedFields, the node it runs on, its status."""
    meta = {k: v for k, v in (pod.get("metadata") or {}).items() if k != "managedFields"}
    node = (pod.get("spec") or {}).get("nodeName")
    return {"metadata": meta, "spec": {"nodeName": node} if node else {}, "status": pod.get("status") or {}}


class PodCache:
    def __init__(self, kube: Kube, label_selector: str, observe: Callable[[str, Pod], None] | None = None):
        """``observe(name, pod)`` is told every state of a pod the watch delivers (or a list
        finds), as it arrives, under the cache's lock: it must be quick and never block (the
        executor stamps a session's phases with it)."""
        self.kube = kube
        self.selector = label_selector
        self.observe = observe
        self.pods: dict[str, Pod] = {}
        self.gone: set[str] = set()  # names seen deleted since they were last created
        self.relists = 0
        self._lock = threading.Lock()
        self._waiting: dict[str, list[asyncio.Future[None]]] = {}  # pod name -> its waiters, woken at its next event
        self._stop = threading.Event()
        self._synced = threading.Event()
        self.refused: str | None = None  # why the API server refused the watch; it then ends
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()
        if not self._synced.wait(timeout=120):
            self._raise_if_refused()
            raise RuntimeError("the pod watch did not complete its first list within 120 s (its failures are logged)")
        self._raise_if_refused()

    def _raise_if_refused(self) -> None:
        if self.refused is not None:
            raise UserError(f"the pod watch was refused: {self.refused} (the controller's RBAC or credentials)")

    def stop(self) -> None:
        self._stop.set()

    def _relist(self) -> str | None:
        items, rv = self.kube.list_pods(self.selector)
        current = {p["metadata"]["name"]: trimmed(p) for p in items}
        with self._lock:
            self.gone |= set(self.pods) - set(current)
            self.pods = current
            self.relists += 1
            if self.observe is not None:
                for name, pod in current.items():
                    self.observe(name, pod)
            self._notify()
        self._synced.set()
        return rv

    def _run(self) -> None:
        rv = None
        pause = FIRST_PAUSE_SECONDS
        while not self._stop.is_set():
            try:
                if rv is None:
                    rv = self._relist()
                    pause = FIRST_PAUSE_SECONDS
                for event in self.kube.watch_pods(self.selector, rv):
                    obj = event["object"]
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    if event["type"] == "BOOKMARK":
                        continue
                    self._apply(event["type"], obj)
                    if self._stop.is_set():
                        return
                continue  # the watch ended (its timeout): resume from rv
            except ApiException as e:
                if e.status == 410:
                    rv = None  # too old: list again
                    continue
                if e.status in REFUSED:
                    self._refuse(_reason(e))
                    return
                log.warning("pod watch: %s; listing again in %g s", _reason(e), pause)
            except Exception as e:  # connection dropped, timeouts: list again, never give up
                log.warning("pod watch: %s: %s; listing again in %g s", type(e).__name__, e, pause)
            rv = None
            self._stop.wait(pause)
            pause = min(pause * 2, MAX_PAUSE_SECONDS)

    def _refuse(self, reason: str) -> None:
        log.error("pod watch refused: %s; the watch ends", reason)
        with self._lock:
            self.refused = reason
            self._notify()
        self._synced.set()  # start() returns, and raises

    def _apply(self, kind: str, pod: Pod) -> None:
        name = pod["metadata"]["name"]
        kept = trimmed(pod)
        with self._lock:
            if kind == "DELETED":
                self.pods.pop(name, None)
                self.gone.add(name)
            else:
                old = self.pods.get(name)
                if old is None or old["metadata"].get("uid") != pod["metadata"].get("uid"):
                    self.gone.discard(name)
                self.pods[name] = kept
                if self.observe is not None:
                    self.observe(name, kept)
            self._notify(name)

    def _notify(self, name: str | None = None) -> None:
        """Wake the waiters of pod ``name``, or of every pod (a re-list, a refusal). Under _lock."""
        for pod in list(self._waiting) if name is None else [name]:
            for woken in self._waiting.pop(pod, []):
                if not woken.get_loop().is_closed():  # else its waiter is gone with its loop
                    woken.get_loop().call_soon_threadsafe(_wake, woken)

    def get(self, name: str) -> Pod | None:
        with self._lock:
            return self.pods.get(name)

    def names(self) -> list[str]:
        with self._lock:
            return list(self.pods)

    async def wait(self, name: str, until: Callable[[Pod | None], T | None], timeout: float) -> T | None:
        """Wait until ``until(pod or None)`` is truthy (None: the pod is gone), checked under the
        cache's lock at each of the pod's events; return its value, or None on timeout. Raises
        UserError once the watch is refused: the cache is then stale."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            with self._lock:
                self._raise_if_refused()
                value = until(self.pods.get(name))
                if value:
                    return value
                if loop.time() >= deadline:
                    return None
                woken: asyncio.Future[None] = loop.create_future()
                self._waiting.setdefault(name, []).append(woken)
            try:
                async with asyncio.timeout_at(deadline):
                    await woken
            except TimeoutError:
                pass  # checked once more above, past the deadline
            finally:
                with self._lock:
                    waiters = self._waiting.get(name)
                    if waiters is not None and woken in waiters:
                        waiters.remove(woken)
                        if not waiters:
                            del self._waiting[name]


def _wake(woken: asyncio.Future[None]) -> None:
    if not woken.done():
        woken.set_result(None)
