"""tests/support/waiting.py: the deadline every tier's waits share."""

from __future__ import annotations

import time

import pytest

from tests.support.waiting import until


def test_until_returns_the_first_truthy_value():
    calls = iter([0, None, "", "ready", "later"])
    assert until(lambda: next(calls), 5, "ready", interval=0) == "ready"


def test_until_fails_at_its_deadline_naming_what_and_what_was_seen():
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"the pod to start: not within 0.2 s; last seen: Pending"):
        until(lambda: False, 0.2, "the pod to start", interval=0.01, seen=lambda: "Pending")
    assert 0.2 <= time.monotonic() - started < 2
