"""The campaign's throttling backoff: which stream lines count, and the pause policy."""

from __future__ import annotations

import asyncio
import json

import pytest

from runner.harnesses.contract import Signals
from runner.throttle import Backoff, Halted, observe


def _lines(*objs) -> list[bytes]:
    return [json.dumps(o).encode() + b"\n" for o in objs]


def test_observe_passes_lines_through_and_notes_only_throttling():
    lines = _lines(
        {"type": "system", "subtype": "init"},
        {"type": "system", "subtype": "api_retry", "attempt": 1, "error_status": 429, "error": "rate_limit"},
        {"type": "system", "subtype": "api_retry", "attempt": 1, "error_status": 500, "error": "server_error"},
        {"type": "system", "subtype": "api_retry", "attempt": 2, "error_status": 529, "error": "overloaded"},
        {"type": "rate_limit_event", "rate_limit_info": {"status": "allowed_warning", "resetsAt": 1}},
        {"type": "assistant", "message": {"content": [{"type": "text", "text": "api_retry rate_limit_event"}]}},
        {"type": "result", "subtype": "success", "is_error": False},
    ) + [b"not json api_retry\n"]
    s = Signals()
    assert list(observe(lines, s)) == lines
    assert s.retries == 2 and not s.rejected and s.resets_at is None and s.throttled


def test_rejected_rate_limit_event_and_failed_result_count():
    s = Signals()
    list(observe(_lines({"type": "rate_limit_event", "rate_limit_info": {"status": "rejected", "resetsAt": 1000}},
                        {"type": "rate_limit_event", "rate_limit_info": {"status": "rejected", "resetsAt": 900}}), s))
    assert s.rejected and s.resets_at == 1000.0 and s.retries == 0
    s = Signals()
    list(observe(_lines({"type": "result", "subtype": "success", "is_error": True, "api_error_status": 529}), s))
    assert s.rejected
    clean = Signals()
    list(observe(_lines({"type": "result", "subtype": "success", "is_error": True, "api_error_status": 401}), clean))
    assert not clean.throttled


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    async def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


def test_pause_doubles_up_to_the_ceiling_and_a_clean_session_resets_it():
    c = Clock()
    b = Backoff(base=10, ceiling=35, clock=c, sleep=c.sleep)
    hit = Signals(retries=1)
    assert [b.record(hit) for _ in range(4)] == [10, 20, 35, 35]  # not_before only moves forward
    assert asyncio.run(b.wait()) == 35 and c.t == 1035
    assert asyncio.run(b.wait()) == 0  # the gate is open again
    assert b.record(Signals()) == 0 and b.pause == 0
    assert b.record(hit) == 10  # after a clean session the pause starts over


def test_provider_reset_time_is_followed_but_capped():
    c = Clock()
    b = Backoff(base=5, ceiling=60, clock=c, sleep=c.sleep)
    assert b.record(Signals(rejected=True, resets_at=c.t + 40)) == 40
    b2 = Backoff(base=5, ceiling=60, clock=c, sleep=c.sleep)
    assert b2.record(Signals(rejected=True, resets_at=c.t + 3600)) == 60
    b3 = Backoff(base=5, ceiling=60, clock=c, sleep=c.sleep)
    assert b3.record(Signals(rejected=True, resets_at=c.t - 100)) == 5  # a reset time in the past: the base pause


def test_a_refused_key_is_noted_from_a_retry_or_the_result_and_is_not_throttling():
    for line in ({"type": "system", "subtype": "api_retry", "attempt": 1, "error_status": 401, "error": "authentication_failed"},
                 {"type": "result", "subtype": "success", "is_error": True, "api_error_status": 403}):
        s = Signals()
        list(observe(_lines({"type": "system", "subtype": "init"}, line), s))
        assert s.refused == line.get("error_status", line.get("api_error_status")) and not s.throttled
    s = Signals()
    list(observe(_lines({"type": "system", "subtype": "api_retry", "error_status": 500, "error": "server_error"}), s))
    assert s.refused is None


async def _never(seconds: float) -> None:
    pytest.fail("a halted gate does not wait")


def test_a_refused_key_halts_every_later_start_even_after_a_clean_session():
    gate = Backoff(base=30, ceiling=300, clock=lambda: 0.0, sleep=_never)
    assert asyncio.run(gate.wait()) == 0.0
    assert gate.record(Signals(refused=401)) == 0.0  # no pause: a halt
    gate.record(Signals())
    for _ in range(2):
        with pytest.raises(Halted, match="the provider refused the key with HTTP 401 in an earlier session"):
            asyncio.run(gate.wait())



def test_a_throttle_pause_says_why_sessions_wait():
    """Issue 31, item 2: a session held back by a throttle pause is listed as waiting, with when it may start."""
    c = Clock()
    b = Backoff(base=10, ceiling=35, clock=c, sleep=c.sleep)
    told: list[str] = []
    b.record(Signals(retries=1))
    assert asyncio.run(b.wait(told.append)) == 10
    said = "a throttle pause: the provider throttled a session; new sessions start in"
    assert told == [f"{said} 10 s", f"{said} 5 s"]  # told again at each of its sleeps (at most 5 s)
    told.clear()
    assert asyncio.run(b.wait(told.append)) == 0 and told == []  # open: nothing to say
