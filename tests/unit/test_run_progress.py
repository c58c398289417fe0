"""A run's progress as events (runner/progress.py) and the CLI's rendering of them off a
terminal (runner/cli/run.py's RunProgress): the lines `run` has always printed."""

from __future__ import annotations

import io
from decimal import Decimal

from runner.cli.run import RunProgress
from runner.progress import RunEnded, RunNote, RunPlanned, SessionEnded, SessionStarted


def test_off_a_terminal_each_end_and_note_is_one_line_with_the_count_and_the_cost_so_far():
    out = io.StringIO()
    show = RunProgress(out)
    for event in [RunPlanned("c1", {"present": 2, "absent": 1}),
                  SessionStarted("present", "P-1/present-001"),
                  SessionEnded("present", "P-1/present-001", "P-1", "present-001", "succeeded", Decimal("0.0125")),
                  RunNote("provider throttling in P-1/present-001 (3 retries): new sessions wait 30 s"),
                  SessionEnded("absent", "P-1/absent-001", "P-1", "absent-001", "not started (over budget)", None),
                  SessionStarted("present", "P-1/present-002"),
                  SessionEnded("present", "P-1/present-002", "P-1", "present-002", "failed", Decimal("0.5")),
                  RunEnded()]:
        show(event)
    assert out.getvalue().splitlines() == [
        "[1/3] P-1 present-001: succeeded  (cost so far $0.0125)",
        "provider throttling in P-1/present-001 (3 retries): new sessions wait 30 s",
        "[2/3] P-1 absent-001: not started (over budget)  (cost so far $0.0125)",
        "[3/3] P-1 present-002: failed  (cost so far $0.5125)",
    ]
    assert show.live is None  # not a terminal: no board
