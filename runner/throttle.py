"""Campaign-wide backoff when the provider throttles.

A session that hits the provider's rate limit retries inside the CLI and says so in its stream
(``Harness.note_signals`` reads it). Starting more sessions at full concurrency then only burns
the retry budgets of all of them, and a session whose budget runs out ends in an error that has
spent. So the campaign watches each stored stream as it is parsed anyway (no extra
read) and holds back the *next* session starts: the pause doubles with every throttled session
(from ``base`` up to ``ceiling``), follows the provider's own ``resetsAt`` where it gives one
(still capped by ``ceiling``), and ends after the first session that ran clean. Sessions that
already run are never touched.

A provider that refuses the key (401, or 403 for a key without the permission) refuses every
session, and the CLI retries it as it retries throttling (about three minutes a session). So
the first stream that shows it halts the gate: no further session is started (nothing journaled,
nothing spent), and ``run`` reports them as not started, to be started by running the campaign
again once the key is fixed.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass

from runner import harnesses
from runner.harnesses.contract import Signals


def observe(lines: Iterable[bytes], signals: Signals) -> Iterator[bytes]:
    """Yield ``lines`` unchanged while noting throttling into ``signals`` (the harness says what a
    line means: ``Harness.note_signals``). Only lines that can carry a signal (a cheap substring
    test) are decoded a second time."""
    harness = harnesses.HARNESS
    for raw in lines:
        if any(marker in raw for marker in harness.signal_markers):
            try:
                line = json.loads(raw)
            except ValueError:
                line = None  # the parser reports malformed lines; here they say nothing of throttling
            if isinstance(line, dict):
                harness.note_signals(line, signals)
        yield raw


def refused_key(status: int) -> str:
    """How a refused key is stated: in the ledger's outcome, the run's progress and its halt."""
    return f"the provider refused the key with HTTP {status}"


class Halted(Exception):
    """Session starts are halted for the rest of this run; the message says why."""


@dataclass
class Backoff:
    """The gate every session start passes, on the campaign's event loop (runner/aio.py);
    ``clock`` and ``sleep`` are injectable so the policy is tested without waiting."""

    base: float
    ceiling: float
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    not_before: float = 0.0
    pause: float = 0.0  # the current pause; 0 when the last session ran clean
    halted: str | None = None  # why no session may start any more in this run

    def record(self, signals: Signals) -> float:
        """Take one finished session's signals; return the pause now in force (seconds)."""
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

    async def wait(self, waiting: Callable[[str], None] = lambda why: None) -> float:
        """Wait until session starts are allowed again, telling ``waiting`` why meanwhile;
        return the seconds waited. Raises Halted once a session showed that the provider
        refuses the key."""
        waited = 0.0
        while True:
            left = self.not_before - self.clock()
            if self.halted is not None:
                raise Halted(self.halted)
            if left <= 0:
                return waited
            waiting(f"a throttle pause: the provider throttled a session; new sessions start in {left:.0f} s")
            await self.sleep(min(left, 5.0))
            waited += min(left, 5.0)
