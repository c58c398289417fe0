"""The live view of a campaign on a terminal (rich): per arm, sessions done, running and
waiting; the sessions running with their elapsed time; the cost so far, its rate and the time
left at the current pace; the last stops and pauses as they happen. ``board_view`` is pure
(a Board and a clock in, a renderable out), so it is tested by rendering to a recorded console;
``LiveProgress`` is what `run` shows on a terminal (off one, runner/cli/run.py's RunProgress
prints one line per change).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import IO

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

SHOWN_RUNNING = 12  # running sessions listed by name; the rest are counted
SHOWN_NOTES = 5


@dataclass
class Board:
    """What the view shows of one campaign at one moment."""

    campaign: str
    total: int
    arms: dict[str, dict[str, int]]  # arm -> {"done", "running", "waiting"}
    running: dict[str, float] = field(default_factory=dict)  # session key -> when it started (Unix seconds)
    cost: Decimal = Decimal(0)
    since: float = 0.0  # when this run (or watch) began: the pace is measured from it
    done_since: int = 0  # sessions that ended since then
    notes: list[str] = field(default_factory=list)
    cost_since: Decimal = Decimal(0)  # what the sessions that ended since then cost: the rate is measured from it

    @property
    def done(self) -> int:
        return sum(a["done"] for a in self.arms.values())


def _clock(seconds: float) -> str:
    s = max(int(seconds), 0)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def board_view(board: Board, now: float) -> RenderableType:
    arms = Table(title=f"campaign {board.campaign}: {board.done}/{board.total} done", title_justify="left",
                 expand=False)
    for column in ("arm", "done", "running", "waiting"):
        arms.add_column(column, justify="left" if column == "arm" else "right")
    for arm, n in board.arms.items():
        arms.add_row(arm, str(n["done"]), str(n["running"]), str(n["waiting"]))
    parts: list[RenderableType] = [arms]
    if board.running:
        running = Table("running", "elapsed", expand=False, show_edge=False)
        oldest = sorted(board.running.items(), key=lambda kv: kv[1])
        for key, started in oldest[:SHOWN_RUNNING]:
            running.add_row(key, _clock(now - started))
        if len(oldest) > SHOWN_RUNNING:
            running.add_row(f"... and {len(oldest) - SHOWN_RUNNING} more", "")
        parts.append(running)
    elapsed = max(now - board.since, 1e-9)
    # the rate and the pace of what ended while this board ran: a watch begun on a finished (or
    # half-run) campaign has seen no cost accrue yet, whatever the campaign spent before it
    left = board.total - board.done
    if board.done_since:
        rate = board.cost_since / Decimal(elapsed / 3600)
        pace = f"time left at this pace {_clock(elapsed / board.done_since * left)}" if left else "every session has ended"
        line = f"cost so far ${board.cost:.4f} (${rate:.2f}/h), elapsed {_clock(elapsed)}, {pace}"
    else:
        pace = "rate and time left: measured once a session ends" if left else "every session has ended"
        line = f"cost so far ${board.cost:.4f}, elapsed {_clock(elapsed)}, {pace}"
    parts.append(Text(line))
    parts.extend(Text(n, style="yellow") for n in board.notes[-SHOWN_NOTES:])
    return Group(*parts)


class LiveProgress:
    """A run's progress (runner/progress.py's events, as RunProgress passes them) drawn live: each change redraws the board, and a refresh
    thread keeps the elapsed times moving."""

    def __init__(self, campaign: str, arms: dict[str, int], out: IO[str]) -> None:
        self.board = Board(campaign, sum(arms.values()), {a: {"done": 0, "running": 0, "waiting": n} for a, n in arms.items()},
                           since=time.time())
        self.lock = threading.Lock()
        self.live = Live(get_renderable=self._render, console=Console(file=out), refresh_per_second=2, transient=False)
        self.live.start()

    def _render(self) -> RenderableType:
        with self.lock:
            return board_view(self.board, time.time())

    def start(self, arm: str, key: str) -> None:
        with self.lock:
            a = self.board.arms[arm]
            a["waiting"] -= 1
            a["running"] += 1
            self.board.running[key] = time.time()

    def end(self, arm: str, key: str, status: str, cost: Decimal | None) -> None:
        with self.lock:
            a = self.board.arms[arm]
            if self.board.running.pop(key, None) is not None:
                a["running"] -= 1
            else:
                a["waiting"] -= 1
            a["done"] += 1
            self.board.done_since += 1
            if cost is not None:
                self.board.cost += cost
                self.board.cost_since += cost
            if not status.startswith("succeeded"):
                self.board.notes.append(f"{key}: {status}")

    def note(self, text: str) -> None:
        with self.lock:
            self.board.notes.append(text)

    def close(self) -> None:
        self.live.stop()
