"""``status`` (and its --watch, which ``submit --watch`` shares): a campaign's typed status
rendered as lines, as JSON, as one plain line per change or as the live board on a terminal."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections import Counter
from collections.abc import Iterator
from decimal import Decimal
from typing import TYPE_CHECKING

import click

from runner.budget import dollars
from runner.cli.group import campaign_argument, cli, interval_option, with_settings
from runner.settings import Settings

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.live import Live

    from runner.executors.base import WaitReason
    from runner.live import Board
    from runner.phases import PhaseSummary
    from runner.service.events import Event, Subscriber
    from runner.status import CampaignStatus, Stopped, Transcripts


@cli.command(short_help="counts of sessions by state, cost so far, refusals")
@campaign_argument
@click.option("--json", "as_json", is_flag=True, help="print machine-readable JSON")
@click.option("--watch", is_flag=True, help="follow the campaign until every session is final and its transcripts are ready "
                                            "to pull, or its run stopped (a refused key, a failed confinement check, the "
                                            "budget; the exit status is then the run's): a live progress bar on a terminal, "
                                            "a plain line per change otherwise")
@interval_option()
@with_settings()
def status(settings: Settings, campaign: str, as_json: bool, watch: bool, interval: float) -> int:
    """Counts of sessions by state, cost so far, refusals."""
    from runner.service import watch as watching

    if watch:
        with watch_rendering() as on_event:
            done = watching.status(settings, campaign, True, interval, on_event)
    else:
        done = watching.status(settings, campaign)
    st = done.status
    if as_json:
        click.echo(json.dumps(st.as_json(), indent=2))
        return done.exit
    click.echo(f"campaign {st.campaign}: {st.total} sessions")
    for k in sorted(st.sessions):
        click.echo(f"  {k}: {st.sessions[k]}")
    for line in waiting_lines(st.waiting):
        click.echo(line)
    for line in phase_lines(st.phases):
        click.echo(line)
    click.echo(f"cost so far: {dollars(st.cost_usd)} (as the captured streams state it)")
    money = st.budget
    if money.campaign_usd is not None:
        click.echo(f"budget: {dollars(money.campaign_usd)}: spent {dollars(money.spent_usd)}, reserved "
                   f"{dollars(money.reserved_usd)} by sessions not settled, left {dollars(money.left_usd)}")
    click.echo(f"refusals: {len(st.refusals)}")
    click.echo(transcripts_line(st.campaign, st.transcripts, st.final))
    if st.stopped is not None:
        click.echo(stopped_line(st.stopped))
    return done.exit


@contextlib.contextmanager
def watch_rendering() -> Iterator[Subscriber]:
    """What a watch shows of each status it reads: the live board on a terminal (runner/live.py;
    the pace measured from the first read), one plain line per change otherwise."""
    if sys.stdout.isatty():
        with live_board() as on_event:
            yield on_event
        return
    from runner.service.events import StatusRead

    last: list[str] = [""]

    def plain(event: Event) -> None:
        if isinstance(event, StatusRead):
            line = status_line(event.status)
            if line != last[0]:
                click.echo(line)
            last[0] = line

    yield plain


@contextlib.contextmanager
def live_board() -> Iterator[Subscriber]:
    """The live board, drawn from the first status read until the watch ends."""
    board = LiveBoard()
    try:
        yield board
    finally:
        board.close()


class LiveBoard:
    """A watch's subscriber on a terminal: each status read redraws the board, which is redrawn
    twice a second besides, so elapsed times move between reads; the pace is measured from the
    first read."""

    def __init__(self) -> None:
        self.first: CampaignStatus | None = None
        self.began = 0.0
        self.board: Board | None = None
        self.live: Live | None = None

    def __call__(self, event: Event) -> None:
        from runner.service.events import StatusRead

        if not isinstance(event, StatusRead):
            return
        if self.first is None:
            self.first, self.began = event.status, time.time()
        self.board = status_board(event.status, self.first, self.began)
        if self.live is None:
            from rich.console import Console
            from rich.live import Live

            self.live = Live(get_renderable=self.render, console=Console(), refresh_per_second=2)
            self.live.start()

    def render(self) -> RenderableType:
        from runner.live import board_view

        assert self.board is not None  # drawn only once a status was read
        return board_view(self.board, time.time())

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()


def status_board(st: CampaignStatus, start: CampaignStatus, began: float) -> Board:
    """The live board of ``st``, its pace measured from ``start`` (read at ``began``)."""
    from runner.clock import timestamp
    from runner.live import Board

    running = {k: timestamp(at) if at else began for k, at in st.running.items()}
    notes = [f"budget left {dollars(st.budget.left_usd)}"] if st.budget.left_usd is not None else []
    notes += [waiting_note(st.waiting)] if st.waiting else []
    notes += [f"{len(st.refusals)} refused so far"] if st.refusals else []
    if st.stopped is not None:
        notes.append(f"the last run stopped: {st.stopped.why}")
    elif ending := ending_note(st):
        notes.append(ending)
    cost = Decimal(st.cost_usd)
    arms = {arm: {"done": n["done"], "running": n["running"], "waiting": n["waiting"]} for arm, n in st.arms.items()}
    return Board(st.campaign, st.total, arms, running, cost, began, st.final - start.final, notes,
                 cost_since=cost - Decimal(start.cost_usd))


def status_line(st: CampaignStatus, width: int = 24) -> str:
    done = width * st.final // st.total if st.total else width
    running = st.sessions.get("started", 0)
    waiting = f", {waiting_note(st.waiting)}" if st.waiting else ""
    left = st.budget.left_usd
    budget = f", budget left {dollars(left)}" if left is not None else ""
    return (f"[{'#' * done}{'.' * (width - done)}] {st.final}/{st.total} final, {running} running{waiting}, "
            f"cost {dollars(st.cost_usd)}{budget}, refusals {len(st.refusals)}{ending_note(st, ', ')}")


def ending_note(st: CampaignStatus, lead: str = "") -> str:
    """What the end of the campaign waits on, once there is only that: that the last run
    stopped, or, every session final, whether the transcripts are ready to pull yet."""
    if st.stopped is not None:
        return lead + "the last run stopped (see below)"
    if st.final != st.total:
        return ""
    return lead + ("transcripts ready" if st.transcripts.ready else "waiting for the transform to write the transcripts")


def waiting_note(waiting: dict[str, WaitReason]) -> str:
    """How many sessions wait to start, and why the most of them wait: the budget, the
    campaign's concurrency, a throttle pause, or their pod (the scheduler's or the kubelet's
    words: ``unschedulable: 0/1 nodes are available: 1 Insufficient cpu``)."""
    reasons = Counter(w["reason"] for w in waiting.values())
    reason, n = reasons.most_common(1)[0]
    return f"{len(waiting)} waiting ({'' if n == len(waiting) else f'{n}: '}{reason})"


def waiting_lines(waiting: dict[str, WaitReason]) -> list[str]:
    """Sessions that wait to start, one line per phase and reason, most sessions first."""
    by_reason: dict[tuple[str, str], list[str]] = {}
    for session, w in waiting.items():
        by_reason.setdefault((w.get("phase", ""), w["reason"]), []).append(session)
    return [f"  {len(s)} waiting{f' in {phase}' if phase else ''}: {reason} (e.g. {s[0]}, since {waiting[s[0]]['since']})"
            for (phase, reason), s in sorted(by_reason.items(), key=lambda kv: -len(kv[1]))]


def phase_lines(phases: PhaseSummary) -> list[str]:
    """Where the captured sessions' time went: each phase's p50/p95/p99 in seconds, and the
    slowest sessions with the phase that took each longest (runner/phases.py)."""
    if not phases.phases:
        return []
    n = max(p.sessions for p in phases.phases.values())
    width = max(len(name) for name in phases.phases)
    lines = [f"phases of {n} captured session(s), seconds p50 / p95 / p99:"]
    lines += [f"  {name:<{width}}  {p.p50:9.3f} / {p.p95:9.3f} / {p.p99:9.3f}  ({p.sessions})"
              for name, p in phases.phases.items()]
    lines += ["slowest: " + "; ".join(f"{s.session} {s.seconds:.3f} s (longest {s.phase}, {s.phase_seconds:.3f} s)"
                                      for s in phases.slowest)]
    return lines


def stopped_line(stopped: Stopped) -> str:
    return f"the last run stopped ({stopped.at}): {stopped.why}"


def transcripts_line(campaign: str, transcripts: Transcripts, final: int) -> str:
    """What status says of the transcripts, and what to do while they are not ready (a campaign
    a transform of an earlier version wrote has no receipt: it reads as not written);
    ``final``: sessions that have ended (none: the transcripts hold no session)."""
    if transcripts.ready and not final:
        return (f"transcripts: written {transcripts.written_at}, of no session: none has ended (`probe-runner pull "
                f"{campaign} --dest DIR` fetches the refusals)")
    if transcripts.ready:
        return f"transcripts: ready (written {transcripts.written_at}); `probe-runner pull {campaign} --dest DIR` fetches them"
    if transcripts.written_at is None:
        return ("transcripts: not written yet: the run's transform writes them once every session is final; "
                f"`probe-runner transform {campaign}` writes them if no run will")
    return (f"transcripts: not ready: the last transform (ended {transcripts.written_at}) read the ledger as it was "
            f"before, or one is writing now; `probe-runner transform {campaign}` writes them again if no run will")
