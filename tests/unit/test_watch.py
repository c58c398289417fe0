"""When a watch ends (issue 30, item 2: "watch settlement"): ``status --watch`` and ``submit
--watch`` follow a campaign until it is settled: every session final and its transcripts ready
to pull, or the last run stopped; every read is told to the subscriber as an event."""

from __future__ import annotations

import pytest

from runner.service.events import StatusRead
from runner.service.watch import follow, settled
from runner.status import BudgetStatus, CampaignStatus, Stopped, Transcripts

STOPPED = Stopped("budget: 1 session(s) not started", 3, "2026-12-05T10:00:00Z")


def _status(final: int, total: int = 4, ready: bool = False, stopped: Stopped | None = None) -> CampaignStatus:
    return CampaignStatus(campaign="c", total=total, final=final, sessions={}, arms={}, running={}, cost_usd="0",
                          budget=BudgetStatus(None, "0", "0", None), refusals=[], waiting={},
                          transcripts=Transcripts(ready, "2026-12-05T10:00:00Z" if ready else None), stopped=stopped)


@pytest.mark.parametrize(("status", "ends"), [
    (_status(final=2), False),
    (_status(final=4), False),                        # every session final, the transform not written yet
    (_status(final=2, ready=True), False),            # transcripts of an earlier reading, sessions still running
    (_status(final=4, ready=True), True),
    (_status(final=0, total=0, ready=True), True),    # nothing planned, transcripts written
    (_status(final=2, stopped=STOPPED), True),        # a stop leaves nothing to wait for
    (_status(final=4, stopped=STOPPED), True),
])
def test_a_watch_ends_once_the_campaign_is_settled(status, ends):
    assert settled(status) is ends


def test_a_watch_reads_every_interval_tells_each_read_and_stops_at_the_first_settled():
    reads = [_status(final=1), _status(final=3), _status(final=4), _status(final=4, ready=True), _status(final=0)]
    given, slept, events = iter(reads), [], []
    last = follow(lambda: next(given), 0.5, events.append, sleep=slept.append)
    assert last is reads[3]
    assert events == [StatusRead(s) for s in reads[:4]]
    assert slept == [0.5, 0.5, 0.5]
    assert next(given) is reads[4]  # nothing read after it settled


def test_a_settled_campaign_is_read_once():
    events, slept = [], []
    settled_now = _status(final=1, stopped=STOPPED)
    assert follow(lambda: settled_now, 10.0, events.append, sleep=slept.append) is settled_now
    assert events == [StatusRead(settled_now)] and slept == []
