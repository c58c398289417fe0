"""Campaign-wide backoff when the provider throttles.

A session that hits the provider's rate limit retries inside the CLI and says so in its stream
(``system/api_retry`` lines on 429/529, a ``rate_limit_event`` whose status is ``rejected``,
a result line with ``api_error_status``). Starting more sessions at full concurrency then only
burns the retry budgets of all of them, and a session whose budget runs out ends in an error
that has spent. So the campaign watches each stored stream as it is parsed anyway (no extra
read) and holds back the *next* session starts: the pause doubles with every throttled session
(from ``base`` up to ``ceiling``), follows the provider's own ``resetsAt`` where it gives one
(still capped by ``ceiling``), and ends after the first session that ran clean. Sessions that
already run are never touched.

A provider that refuses the key (401, or 403 for a key without the permission) refuses every
session, and the CLI retries it as it retries throttling (2.1.197: ten ``api_retry`` lines with
``error_status`` 401 and ``error`` ``authentication_failed``, about three minutes a session). So
the first stream that shows it halts the gate: no further session is started (nothing journaled,
nothing spent), and ``run`` reports them as not started, to be started by running the campaign
again once the key is fixed.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from runner.gateway.tokens import limit_spent

_THROTTLE_STATUSES = {429, 529}
_THROTTLE_ERRORS = {"rate_limit", "overloaded"}
_REFUSED_STATUSES = {401, 403}


@dataclass
class Signals:
    """What one stream said about throttling."""

    retries: int = 0  # system/api_retry lines caused by 429/529
    rejected: bool = False  # a rate_limit_event with status rejected, or a result failed by 429/529
    resets_at: float | None = None  # the provider's reset time (epoch seconds), where given
    refused: int | None = None  # 401 or 403: the provider refused the key, in a retry or the result

    @property
    def throttled(self) -> bool:
        return bool(self.retries or self.rejected)


def observe(lines: Iterable[bytes], signals: Signals) -> Iterator[bytes]:
    """Yield ``lines`` unchanged while noting throttling into ``signals``. Only lines that can
    carry a signal (a cheap substring test) are decoded a second time."""
    for raw in lines:
        if b"api_retry" in raw or b"rate_limit_event" in raw or b"api_error_status" in raw:
            _note(raw, signals)
        yield raw


def _note(raw: bytes, s: Signals) -> None:
    try:
        line = json.loads(raw)
    except ValueError:
        return  # the parser reports malformed lines; here they say nothing of throttling
    if not isinstance(line, dict):
        return
    kind = line.get("type")
    if kind == "system" and line.get("subtype") == "api_retry":
        if line.get("error_status") in _THROTTLE_STATUSES or line.get("error") in _THROTTLE_ERRORS:
            s.retries += 1
        elif line.get("error_status") in _REFUSED_STATUSES:
            s.refused = line["error_status"]
    elif kind == "rate_limit_event":
        info = line.get("rate_limit_info")
        if isinstance(info, dict) and info.get("status") == "rejected":
            s.rejected = True
            resets = info.get("resetsAt")
            if isinstance(resets, (int, float)) and not isinstance(resets, bool):
                s.resets_at = max(s.resets_at or 0.0, float(resets))
    elif kind == "result":
        status = line.get("api_error_status")
        if status in _THROTTLE_STATUSES:
            s.rejected = True
        elif status in _REFUSED_STATUSES and not limit_spent(line):
            s.refused = status  # (the gateway's 403 for a spent session limit is that session's own end)


def refused_key(status: int) -> str:
    """How a refused key is stated: in the ledger's outcome, the run's progress and its halt."""
    return f"the provider refused the key with HTTP {status}"


class Halted(Exception):
    """Session starts are halted for the rest of this run; the message says why."""


@dataclass
class Backoff:
    """The gate every session start passes. Thread-safe; ``clock`` and ``sleep`` are injectable
    so the policy is tested without waiting."""

    base: float
    ceiling: float
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    not_before: float = 0.0
    pause: float = 0.0  # the current pause; 0 when the last session ran clean
    halted: str | None = None  # why no session may start any more in this run
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, signals: Signals) -> float:
        """Take one finished session's signals; return the pause now in force (seconds)."""
        with self._lock:
            if signals.refused is not None and self.halted is None:
                self.halted = f"{refused_key(signals.refused)} in an earlier session"
            if not signals.throttled:
                self.pause = 0.0
                return 0.0
            self.pause = min(self.ceiling, self.base if self.pause == 0 else self.pause * 2)
            now = self.clock()
            until = now + self.pause
            if signals.resets_at is not None:
                until = max(until, min(signals.resets_at, now + self.ceiling))
            self.not_before = max(self.not_before, until)
            return self.not_before - now

    def wait(self) -> float:
        """Block until session starts are allowed again; return the seconds waited. Raises
        Halted once a session showed that the provider refuses the key."""
        waited = 0.0
        while True:
            with self._lock:
                left = self.not_before - self.clock()
                if self.halted is not None:
                    raise Halted(self.halted)
            if left <= 0:
                return waited
            self.sleep(min(left, 5.0))
            waited += min(left, 5.0)
