"""Waiting with a deadline, as every tier does (issue 30, item 6): poll a condition until it
holds, and past the deadline fail naming what was awaited and what was last seen, never hang;
and end a server a test started, never waiting on it for ever (``stopped``)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def until(condition: Callable[[], T], timeout: float, what: str, interval: float = 0.05,
          seen: Callable[[], object] | None = None) -> T:
    """``condition()``'s first truthy value within ``timeout`` seconds (polled every
    ``interval``); else AssertionError naming ``what`` and, if given, ``seen()`` then."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s" + (f"; last seen: {seen()}" if seen is not None else ""))
        time.sleep(interval)


def stopped(proc: subprocess.Popen[bytes], grace: float = 10) -> int:
    """End a server a test started: SIGTERM, then SIGKILL after ``grace`` seconds; its exit status."""
    proc.terminate()
    try:
        return proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait(grace)
