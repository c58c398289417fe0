"""The live view (runner/live.py; issue 16, item 1), rendered to a recorded console: per arm
done/running/waiting, the running sessions with their elapsed time, cost so far and its rate,
time left at the current pace, and the stops as they happen."""

from __future__ import annotations

import io
from decimal import Decimal

from rich.console import Console

from runner.live import Board, LiveProgress, board_view


def _text(renderable) -> str:
    console = Console(record=True, width=100, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


def test_the_board_shows_arms_running_sessions_cost_rate_and_time_left():
    board = Board("c1", total=8, arms={"present": {"done": 3, "running": 1, "waiting": 0},
                                       "absent": {"done": 1, "running": 1, "waiting": 2}},
                  running={"P-1/present-004": 1000.0, "P-1/absent-002": 1030.0}, cost=Decimal("0.6"),
                  since=940.0, done_since=4, notes=["provider throttling in P-1/present-003: new sessions wait 30 s"],
                  cost_since=Decimal("0.6"))
    text = _text(board_view(board, now=1060.0))  # 120 s since the run began, 4 sessions ended: 30 s each
    lines = [" ".join(line.split()) for line in text.splitlines()]
    assert "campaign c1: 4/8 done" in lines[0]
    assert any(line.startswith("│ present │ 3 │ 1 │ 0 │") for line in lines), text
    assert any(line.startswith("│ absent │ 1 │ 1 │ 2 │") for line in lines), text
    assert any(line.startswith("P-1/present-004 │ 1:00") for line in lines), text  # the oldest first
    assert any(line.startswith("P-1/absent-002 │ 0:30") for line in lines), text
    # $0.6 in 2 minutes is $18/h; 4 left at 30 s a session is 2 minutes.
    assert "cost so far $0.6000 ($18.00/h), elapsed 2:00, time left at this pace 2:00" in " ".join(lines)
    assert "provider throttling in P-1/present-003: new sessions wait 30 s" in text


def test_before_a_session_ends_there_is_no_pace_and_at_the_end_nothing_is_left():
    board = Board("c1", total=2, arms={"present": {"done": 0, "running": 2, "waiting": 0}}, since=0.0)
    assert "rate and time left: measured once a session ends" in _text(board_view(board, now=10.0))
    board.arms["present"] = {"done": 2, "running": 0, "waiting": 0}
    board.done_since = 2
    assert "every session has ended" in _text(board_view(board, now=10.0))


def test_a_watch_begun_on_a_finished_campaign_states_its_cost_and_no_rate():
    """Issue 29: "the live board on a finished campaign shows $0.1836 ($850388.70/h), elapsed
    0:00": the whole campaign's cost over the watch's first instant. The rate is measured from
    what ended while the board ran, and only once something did."""
    board = Board("c1", total=2, arms={"present": {"done": 2, "running": 0, "waiting": 0}}, cost=Decimal("0.1836"),
                  since=100.0)
    text = " ".join(_text(board_view(board, now=100.2)).split())
    assert "cost so far $0.1836, elapsed 0:00, every session has ended" in text and "/h" not in text
    # a watch begun mid-campaign: $1 spent before it, $0.25 in the 15 minutes since, by one session
    board = Board("c1", total=4, arms={"present": {"done": 3, "running": 1, "waiting": 0}}, cost=Decimal("1.25"),
                  since=0.0, done_since=1, cost_since=Decimal("0.25"))
    assert "cost so far $1.2500 ($1.00/h), elapsed 15:00, time left at this pace 15:00" in " ".join(
        _text(board_view(board, now=900.0)).split())


def test_live_progress_moves_sessions_from_waiting_to_running_to_done_and_keeps_stops():
    out = io.StringIO()
    live = LiveProgress("c1", {"present": 2}, out)
    try:
        live.start("present", "P-1/present-001")
        assert live.board.arms["present"] == {"done": 0, "running": 1, "waiting": 1}
        live.end("present", "P-1/present-001", "succeeded", Decimal("0.01"))
        live.end("present", "P-1/present-002", "not started (over budget)", None)  # never ran
        assert live.board.arms["present"] == {"done": 2, "running": 0, "waiting": 0}
        assert live.board.cost == Decimal("0.01") and live.board.notes == ["P-1/present-002: not started (over budget)"]
    finally:
        live.close()


def test_a_session_waiting_for_its_pod_says_why():
    """Issue 29: "on a small node, session pods waited on `Insufficient cpu` and the plain watch
    line said only "2 waiting for a pod"". The line and the board name the reason most of them
    wait for, in the scheduler's words."""
    from runner.cli.status import status_line, waiting_note
    from runner.status import BudgetStatus, CampaignStatus, Transcripts

    cpu = "unschedulable: 0/1 nodes are available: 1 Insufficient cpu."
    waiting = {"P-1/present-002": {"reason": cpu, "since": "2026-12-05T10:00:00Z"},
               "P-1/present-003": {"reason": cpu, "since": "2026-12-05T10:00:01Z"}}
    assert waiting_note(waiting) == f"2 waiting ({cpu})"
    waiting["P-1/absent-001"] = {"reason": "harness: ErrImagePull: not found", "since": "2026-12-05T10:00:02Z"}
    assert waiting_note(waiting) == f"3 waiting (2: {cpu})"
    st = CampaignStatus(campaign="c", total=4, final=1, sessions={"started": 0}, arms={}, running={}, cost_usd="0.0144",
                        budget=BudgetStatus(None, "0", "0", None), refusals=[], waiting=waiting,
                        transcripts=Transcripts(False, None), stopped=None)
    assert f", 3 waiting (2: {cpu}), cost $0.0144" in status_line(st)
