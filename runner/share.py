"""A campaign split across controllers: which sessions one of them owns (pure; no I/O).

One controller's cost grows with the sessions it runs at once (bench/README.md, scale.py), so a
campaign larger than one controller holds is split into ``count`` shares, each run by its own
controller: the pods of an Indexed Job (``kube.controllers``), each index one share. A share is
fixed by the plan alone, never negotiated at run time: the session at position ``p`` of
``Plan.sessions()`` (a stable order) belongs to share ``p % count``. So every controller, a
restarted one included, knows its sessions without asking the others; no session is in two
shares, and every session is in one. The ledger stays the campaign's one journal: every share
appends to it (create-only writes keep its chain whole across writers), so there is one export.

What a share takes of the campaign's limits is fixed in the same way, so no share can take
another's: ``concurrency`` split as evenly as whole sessions allow, and the budget in proportion
to the sessions a share owns (rounded down to a micro-dollar). A share that spends less than
its part leaves the rest unused: the price of a limit that holds without coordination.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_DOWN, Decimal
from typing import TYPE_CHECKING

from runner.errors import UserError

if TYPE_CHECKING:
    from runner.plan import Plan, SessionSpec

_MICRO = Decimal("0.000001")


@dataclass(frozen=True)
class Share:
    """Share ``index`` of ``count`` (0 <= index < count); Share() is the whole campaign."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if self.count < 1 or not 0 <= self.index < self.count:
            raise UserError(f"share {self.index} of {self.count}: a share's index is 0 to its count - 1, "
                            "and the count at least 1")

    @property
    def whole(self) -> bool:
        return self.count == 1

    @property
    def name(self) -> str:
        """``INDEX-of-COUNT``: its label on session pods, its marker and its waiting record."""
        return f"{self.index}-of-{self.count}"

    def sessions(self, plan: Plan) -> list[SessionSpec]:
        """The sessions this share owns, in the plan's order."""
        return [spec for p, spec in enumerate(plan.sessions()) if p % self.count == self.index]

    def concurrency(self, campaign: int) -> int:
        """This share's part of the campaign's ``campaign`` sessions at once: the parts differ by
        at most one and add up to it. Fewer than one a share is refused, by every share (one
        with no part could run nothing)."""
        if campaign < self.count:
            raise UserError(f"concurrency {campaign} cannot be split across {self.count} controllers: each runs at least "
                            "one session at once (raise concurrency or lower kube.controllers)")
        return campaign // self.count + (1 if self.index < campaign % self.count else 0)

    def budget(self, campaign_usd: Decimal, plan: Plan) -> Decimal:
        """This share's part of the campaign's budget: in proportion to its sessions, rounded
        down, so the parts never add up to more than the whole."""
        if self.whole:
            return campaign_usd
        return (campaign_usd * len(self.sessions(plan)) / len(plan.sessions())).quantize(_MICRO, rounding=ROUND_DOWN)

    def check_number(self, nth: int) -> int:
        """The number of this share's ``nth`` confinement check (1, 2, ...): the shares' numbers
        never meet, since each names its canary pod and its token."""
        return (nth - 1) * self.count + self.index + 1


WHOLE = Share()
