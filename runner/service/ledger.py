"""The ledger's commands over a stored campaign (verify, export, recover, cancel) and the
resume rule: which sessions may run a new attempt, on this host or in the cluster."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from runner.errors import UserError
from runner.ledger import Ledger, SessionState
from runner.plan import Plan
from runner.progress import RunSubscriber, ignore
from runner.service.outcome import Outcome
from runner.service.stored import campaign_ledger, campaign_lock
from runner.settings import Settings

if TYPE_CHECKING:
    from runner.service.cluster import JobCreated
    from runner.service.run import CampaignRun


@dataclass(frozen=True)
class Verified:
    campaign: str
    entries: int
    problems: list[str]  # each break of the hash chain (none: it verifies)

    @property
    def outcome(self) -> Outcome:
        return Outcome.CHAIN_BROKEN if self.problems else Outcome.DONE


@dataclass(frozen=True)
class Exported:
    data: bytes   # canonical JSON Lines
    sha256: str
    entries: int


@dataclass(frozen=True)
class Marked:
    """A started session with no outcome, now marked interrupted."""

    key: str
    attempt: int
    why: str  # the recovery's words, without the ledger's preamble


@dataclass(frozen=True)
class Cancelled:
    key: str
    attempt: int


def verify(settings: Settings, campaign: str) -> Verified:
    """Check the ledger's hash chain."""
    plan, book = campaign_ledger(settings, campaign)
    problems = book.verify()
    return Verified(plan.campaign, len(book.entries), list(problems))


def export(settings: Settings, campaign: str) -> Exported:
    """The ledger as canonical JSON Lines, and their SHA-256."""
    _, book = campaign_ledger(settings, campaign)
    data, sha = book.export()
    return Exported(data, sha, len(book.entries))


def recover(settings: Settings, campaign: str) -> list[Marked]:
    """Mark every started session with no outcome as interrupted, holding the campaign's lock
    (no runner of this host holds it then). Nothing is run or stopped."""
    plan, book = campaign_ledger(settings, campaign)
    with campaign_lock(settings, plan.campaign):
        book.reload()  # as it stands now that no runner of this host holds the campaign
        return [Marked(key, attempt, detail["reason"].split("; ", 2)[-1]) for key, attempt, detail in book.recover()]


def latest_attempt(book: Ledger, plan: Plan, session: str) -> SessionState:
    st = book.state(session)
    if st.attempt == 0:
        raise UserError(f"{session}: no such session in campaign {plan.campaign!r}")
    return st


def cancel(settings: Settings, campaign: str, session: str) -> Cancelled:
    """Close the session's latest attempt: it stays unrecorded and is not run again."""
    plan, book = campaign_ledger(settings, campaign)
    st = latest_attempt(book, plan, session)
    book.close(session, st.attempt)
    return Cancelled(session, st.attempt)


def check_resumable(book: Ledger, plan: Plan, session: str) -> None:
    """The resume rule: only an interrupted or failed session runs a new attempt."""
    st = latest_attempt(book, plan, session)
    if st.status not in ("interrupted", "failed"):
        raise UserError(f"{session} is {st.status}; only an interrupted or failed session can be resumed")


def resume(settings: Settings, campaign: str, sessions: tuple[str, ...], corpus: Path | None, job: bool,
           progress: RunSubscriber = ignore) -> CampaignRun | JobCreated:
    """Run a new attempt of each session (each once, in the order given; every one resumable):
    on this host over ``corpus`` (a ``run.CampaignRun``), or with ``job`` in the cluster (the
    campaign's resume Job, a ``cluster.JobCreated``)."""
    from runner.service import cluster, run

    plan, book = campaign_ledger(settings, campaign)
    sessions = tuple(dict.fromkeys(sessions))
    for session in sessions:
        check_resumable(book, plan, session)
    if job:
        return cluster.resume_job(settings, plan, book.store, sessions)
    if corpus is None:
        raise UserError("give the campaign's corpus (--corpus DIR) to resume on this host, or --job to resume a "
                        "submitted campaign in the cluster")
    return run.run_campaign(settings, plan, corpus, resume=set(sessions), progress=progress)
