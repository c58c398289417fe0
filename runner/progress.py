"""A run's progress as events (issue 30, item 2: "progress as events the CLI renders"): the
campaign tells a subscriber what happens as it happens, as s3transfer's subscribers are told of a
transfer's, and prints nothing; the CLI draws them (runner/cli/run.py: a line per session off a
terminal, the live board on one)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runner.executors.base import Phases


@dataclass(frozen=True)
class RunPlanned:
    """What this run will try: how many sessions of each arm."""

    campaign: str
    arms: dict[str, int]


@dataclass(frozen=True)
class SessionStarted:
    arm: str
    key: str  # probe/session


@dataclass(frozen=True)
class SessionEnded:
    """A session of the run ended (or was not started: ``status`` says why)."""

    arm: str
    key: str
    probe: str
    session: str
    status: str
    cost: Decimal | None  # what its stream says it spent, where it ran
    stream_bytes: int = 0  # the bytes of its stream the store holds (0: none stored)
    # its milestones (executors.base.Phases): the campaign's, and where it was captured the
    # executor's and outcome_journaled
    phases: Phases = field(default_factory=lambda: _none())


def _none() -> Phases:
    return {}


@dataclass(frozen=True)
class RunNote:
    """Something the run did on its own account: a pause for throttling, a halt."""

    text: str


@dataclass(frozen=True)
class Paused(RunNote):
    """New session starts wait ``seconds`` because the provider throttled a session."""

    seconds: float = 0.0


@dataclass(frozen=True)
class BudgetBooks:
    """The campaign's budget as the run's gate holds it, in US dollars, told where a budget is
    set: at the run's start and after each reservation and settlement, in their order."""

    campaign: str
    budget: Decimal
    spent: Decimal     # settled attempts
    reserved: Decimal  # attempts holding a reservation

    @property
    def left(self) -> Decimal:
        return self.budget - self.spent - self.reserved


@dataclass(frozen=True)
class RunEnded:
    pass


RunEvent = RunPlanned | SessionStarted | SessionEnded | RunNote | BudgetBooks | RunEnded
RunSubscriber = Callable[[RunEvent], None]


def ignore(event: RunEvent) -> None:
    """A subscriber that shows nothing."""


def chain(*subscribers: RunSubscriber) -> RunSubscriber:
    """One subscriber that tells each of ``subscribers`` every event, in their order."""

    def tell(event: RunEvent) -> None:
        for subscriber in subscribers:
            subscriber(event)

    return tell
