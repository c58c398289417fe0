"""The exit-status policy: what a command came to (an ``Outcome``) and the one table that says
which exit status each makes. The CLI's epilog states the same table to its users:

0 all recorded; 1 sessions left interrupted or not started; 2 bad input; 3 the campaign's budget
stopped it; 12 a session could not be confined or something was refused.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

from runner.errors import EXIT_BUDGET, EXIT_CONFINEMENT, EXIT_USAGE, ConfinementError, KeyRefused, UserError

if TYPE_CHECKING:  # the CLI imports this table before anything heavy
    from runner.campaign import StopCause
    from runner.status import Stopped


class Outcome(Enum):
    DONE = "done"                    # every session recorded, nothing refused (or: the command did what it said)
    REFUSED = "refused"              # every session final, and something was refused (a session, a transcript)
    UNFINISHED = "unfinished"        # sessions left interrupted, or not started
    BAD_INPUT = "bad input"          # a user's mistake (a plan, a corpus, a flag, a setting)
    KEY_REFUSED = "key refused"      # the provider refuses the key: a setting to fix
    POLICY_REFUSED = "policy refused"  # the gateway refuses what every session sends (its model, a beta, a price): a setting to fix
    OVER_BUDGET = "over budget"      # the campaign's budget left sessions not started
    UNCONFINED = "unconfined"        # a session could not be confined as the contract requires
    STORE_FAILED = "store failed"    # the store could not be read or written, or its bytes disagree with their digest
    CHECKS_FAILED = "checks failed"  # `doctor`: a check does not hold
    CHAIN_BROKEN = "chain broken"    # `ledger verify`: the hash chain breaks
    INTERRUPTED = "interrupted"      # the user interrupted the command (Ctrl-C)


EXIT_STATUS: dict[Outcome, int] = {
    Outcome.DONE: 0,
    Outcome.REFUSED: EXIT_CONFINEMENT,
    Outcome.UNFINISHED: 1,
    Outcome.BAD_INPUT: EXIT_USAGE,
    Outcome.KEY_REFUSED: EXIT_USAGE,
    Outcome.POLICY_REFUSED: EXIT_USAGE,
    Outcome.OVER_BUDGET: EXIT_BUDGET,
    Outcome.UNCONFINED: EXIT_CONFINEMENT,
    Outcome.STORE_FAILED: 1,
    Outcome.CHECKS_FAILED: 1,
    Outcome.CHAIN_BROKEN: 1,
    Outcome.INTERRUPTED: 130,
}


def exit_status(outcome: Outcome) -> int:
    """The exit status a command that came to ``outcome`` ends with."""
    return EXIT_STATUS[outcome]


def error_outcome(error: UserError) -> Outcome:
    """What a user error stops a command at (its class says whose matter it is)."""
    if isinstance(error, ConfinementError):
        return Outcome.UNCONFINED
    if isinstance(error, KeyRefused):
        return Outcome.KEY_REFUSED
    return Outcome.BAD_INPUT


STOPS: dict[StopCause, Outcome] = {"unconfined": Outcome.UNCONFINED, "key": Outcome.KEY_REFUSED,
                                   "policy": Outcome.POLICY_REFUSED, "budget": Outcome.OVER_BUDGET}


def written_outcome(not_started: bool, unfinished: bool, refused: bool) -> Outcome:
    """What a campaign came to once its transform wrote: sessions not started or left started
    (``unfinished``) keep it open; else it is done, or refused if anything was."""
    if not_started or unfinished:
        return Outcome.UNFINISHED
    return Outcome.REFUSED if refused else Outcome.DONE


def watched_exit(stopped: Stopped | None) -> int:
    """A watch that ended on a stopped run exits as that run did (as its Job failed); else 0."""
    return stopped.exit if stopped is not None else 0
