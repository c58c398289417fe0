"""A watch-fed cache of the campaign's session pods: one list, then one watch, never a read of
a pod before each operation.

The watch resumes from the last resourceVersion it saw; a 410 Gone (the version was
compacted away) or any other end re-lists and starts a new watch, so no transition is missed
for good. Waiters block on a condition until a pod's state satisfies them, and a pod that
vanishes from a re-list counts as deleted.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from kubernetes.client.exceptions import ApiException

from runner.k8s.api import Kube

Pod = dict


class PodCache:
    def __init__(self, kube: Kube, label_selector: str, on_error: Callable[[str], None] | None = None):
        self.kube = kube
        self.selector = label_selector
        self.pods: dict[str, Pod] = {}
        self.gone: set[str] = set()  # names seen deleted since they were last created
        self.relists = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._on_error = on_error or (lambda msg: None)
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()
        if not self._synced.wait(timeout=120):
            raise RuntimeError("the pod watch did not complete its first list within 120 s")

    def stop(self) -> None:
        self._stop.set()

    def _relist(self) -> str:
        items, rv = self.kube.list_pods(self.selector)
        with self._cond:
            current = {p["metadata"]["name"]: p for p in items}
            self.gone |= set(self.pods) - set(current)
            self.pods = current
            self.relists += 1
            self._cond.notify_all()
        self._synced.set()
        return rv

    def _run(self) -> None:
        rv = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    rv = self._relist()
                for event in self.kube.watch_pods(self.selector, rv):
                    obj = event["object"]
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    if event["type"] == "BOOKMARK":
                        continue
                    self._apply(event["type"], obj)
                    if self._stop.is_set():
                        return
            except ApiException as e:
                if e.status == 410:
                    rv = None  # too old: list again
                    continue
                self._on_error(f"pod watch: {e.status} {e.reason}")
                rv = None
                time.sleep(1)
            except Exception as e:  # connection dropped, timeouts: re-list, never give up
                self._on_error(f"pod watch: {type(e).__name__}: {e}")
                rv = None
                time.sleep(1)

    def _apply(self, kind: str, pod: Pod) -> None:
        name = pod["metadata"]["name"]
        with self._cond:
            if kind == "DELETED":
                self.pods.pop(name, None)
                self.gone.add(name)
            else:
                old = self.pods.get(name)
                if old is None or old["metadata"].get("uid") != pod["metadata"].get("uid"):
                    self.gone.discard(name)
                self.pods[name] = pod
            self._cond.notify_all()

    def get(self, name: str) -> Pod | None:
        with self._cond:
            return self.pods.get(name)

    def names(self) -> list[str]:
        with self._cond:
            return list(self.pods)

    def wait(self, name: str, until: Callable[[Pod | None], object], timeout: float) -> object:
        """Block until ``until(pod or None)`` is truthy (None: the pod is gone); return its value,
        or None on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                value = until(self.pods.get(name))
                if value:
                    return value
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(timeout=min(left, 5.0))
