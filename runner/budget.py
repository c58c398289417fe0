"""A campaign's books: a session starts only when its reservation fits the campaign's budget,
so realized spend cannot pass it (issue 15; the experiment-records seed's journal keeps them).

A session reserves its own limit (``budget.session_usd``, given to the CLI as
``--max-budget-usd``) plus the most one provider call can add past it (``budget.call_usd``):
the CLI checks its limit after each answer, so its last call crosses the limit by less
than that call's cost (bench/README.md, "How the CLI stops at its budget"). The reservation
is journaled in the session's start entry, just before the harness can spend; the outcome
settles it with the stream's realized cost (``cost_usd``), or with the whole reservation where
the stream states none (an interrupted session may have spent up to it). Both are read back
from the ledger, so the books are the same after a restart or a SIGKILL at any stage: a
reservation held in memory and never journaled belongs to a session that never started.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from runner.aio import Changed, blocking

if TYPE_CHECKING:  # only annotations name it: `dollars` stays cheap to import for the CLI
    from runner.ledger import Ledger, LedgerEntry, Money

ZERO = Decimal(0)


def dollars(amount: object) -> str:
    """A cost for people to read, to the hundredth of a cent; the exact sum stays in the records
    (status --json, the transcript's cost_cents) where the CLI's float artefacts are kept."""
    return f"${Decimal(str(amount)):.4f}"


@dataclass(frozen=True)
class Books:
    """A campaign's money as its ledger states it, in US dollars."""

    spent: Decimal = ZERO     # settled attempts: their realized cost (or their reservation, where unknown)
    reserved: Decimal = ZERO  # attempts started and not settled: what each may still spend
    budget: Decimal | None = None  # the campaign budget the last start was journaled under

    def left(self, budget: Decimal | None = None) -> Decimal | None:
        limit = budget if budget is not None else self.budget
        return None if limit is None else limit - self.spent - self.reserved


def _attempt(start: LedgerEntry, outcome: LedgerEntry | None) -> tuple[Decimal, Decimal]:
    """(still reserved, spent) of one started attempt: its start entry reserved ``reserved_usd``;
    an outcome settles it at ``cost_usd``, or at the whole reservation where it states none."""
    held = Decimal(start.get("reserved_usd") or 0)
    if outcome is None:
        return held, ZERO
    cost = (outcome.get("detail") or {}).get("cost_usd")
    return ZERO, held if cost is None else Decimal(cost)


def books(ledger: Ledger, sessions: set[str] | None = None) -> Books:
    """The books from the journal (an attempt that never started spent nothing); of
    ``sessions`` alone where given (a share's: runner/share.py)."""
    reserved = spent = ZERO
    budget: Decimal | None = None
    for e in ledger.entries:
        if e["type"] == "start" and (sessions is None or e["session"] in sessions):
            r, s = _attempt(e, ledger.entry("outcome", e["session"], e["attempt"]))
            reserved, spent = reserved + r, spent + s
            if e.get("campaign_usd") is not None:
                budget = Decimal(e["campaign_usd"])
    return Books(spent, reserved, budget)


class OverBudget(Exception):
    """The session's reservation does not fit what is left of the campaign's budget."""


class Gate:
    """The budget's check before each start, shared by a run's sessions. ``hold`` reserves a
    session's amount in memory, or waits while sessions of this run that may settle for less
    are still out, and refuses when none is; ``done`` settles it from the ledger. Used from
    the campaign's event loop alone (runner/aio.py), so its books change in one order:
    ``tell`` is called with the gate at its start and after each change of them (the run's
    metrics: budget reserved and left).

    A run of one share of the campaign (runner/share.py) holds its ``sessions`` to its part
    of the budget, ``limit``: the books are then its sessions' alone, and the shares' parts add
    up to no more than the campaign's budget, which the start entries still journal."""

    def __init__(self, ledger: Ledger, campaign_usd: Decimal, reservation: Decimal,
                 tell: Callable[[Gate], None] = lambda gate: None, limit: Decimal | None = None,
                 sessions: set[str] | None = None) -> None:
        start = books(ledger, sessions)
        self.campaign_usd, self.reservation = campaign_usd, reservation
        self.budget = campaign_usd if limit is None else limit  # what this gate holds its sessions to
        self._what = (f"the campaign's budget of ${self.budget:.4f}" if limit is None else
                      f"this controller's part of the campaign's budget (${self.budget:.4f} of ${campaign_usd:.4f}, "
                      "in proportion to its share of the sessions)")
        self.spent, self.reserved = start.spent, start.reserved
        self.out = 0  # sessions of this run holding a reservation: each may still give some back
        self._changed = Changed()
        self._tell = tell
        tell(self)

    def _fits(self) -> bool:
        return self.spent + self.reserved + self.reservation <= self.budget

    async def hold(self, waiting: Callable[[str], None] = lambda why: None) -> None:
        """Reserve a session's amount, told to ``waiting`` (why) first where it must wait."""
        if not (self._fits() or self.out == 0):
            waiting(f"the budget: ${self.budget - self.spent - self.reserved:.4f} of ${self.budget:.4f} "
                    f"left, {self.out} session(s) of this run holding reservations that may settle for less; "
                    f"a session reserves ${self.reservation:.4f}")
            await self._changed.wait_for(lambda: self._fits() or self.out == 0)
        if not self._fits():
            raise OverBudget(f"a session reserves ${self.reservation:.4f} (budget.session_usd + budget.call_usd) and "
                             f"{self._what} has ${self.budget - self.spent - self.reserved:.4f} "
                             f"left (${self.spent:.4f} spent, ${self.reserved:.4f} reserved)")
        self.out += 1
        self.reserved += self.reservation
        self._tell(self)

    def adopt(self) -> None:
        """A session an earlier run started, followed by this one: its reservation is in the
        books already (its start entry), and it may still give some back."""
        self.out += 1

    def money(self) -> Money:
        """What a start entry journals of the budget it was made under."""
        return {"reserved_usd": str(self.reservation), "campaign_usd": str(self.campaign_usd)}

    async def done(self, ledger: Ledger, session: str, attempt: int) -> None:
        """The session's part in this run is over: settle what the ledger says of it (read on
        a thread: runner/aio.py). Never started: its hold is given back. Started with an
        outcome: settled at the outcome's cost_usd, or at its whole reservation. Started with
        no outcome: it stays reserved."""
        start, outcome = await blocking(_entries, ledger, session, attempt)
        self.out -= 1
        if start is None:
            self.reserved -= self.reservation
        else:
            r, spent = _attempt(start, outcome)
            self.reserved += r - Decimal(start.get("reserved_usd") or 0)
            self.spent += spent
        self._tell(self)
        self._changed.notify()


def _entries(ledger: Ledger, session: str, attempt: int) -> tuple[LedgerEntry | None, LedgerEntry | None]:
    """An attempt's start entry and outcome entry, where journaled."""
    start = ledger.entry("start", session, attempt)
    return start, None if start is None else ledger.entry("outcome", session, attempt)


def realized_cost(stream_cost: Decimal | None, metered: dict[str, Any] | None) -> Decimal | None:
    """What an attempt cost, as the run knows it: the larger of its stream's cost and the
    gateway's meter (calls made with the session's token outside the CLI, and the answers of a
    session the time limit cut before its result line, are in the meter alone); None where
    neither is known (a session with no gateway, a credentials login, that ended without a result
    line). The transcript's cost_cents and the budget's books both read it, so they agree."""
    if metered is None:
        return stream_cost
    return max(stream_cost or Decimal(0), Decimal(metered["cost_usd"]))


def settled_cost(stream_cost: Decimal | None, metered: dict[str, Any] | None) -> Decimal | None:
    """What an attempt's reservation is settled at: its realized cost; None, so the whole
    reservation, where that is not known or the gateway could not price a call."""
    if metered is not None and metered.get("unpriced_models"):
        return None
    return realized_cost(stream_cost, metered)
