"""Running a campaign, as every command that runs one does it (``run``, ``controller``,
``demo``, ``ledger resume``): one runner per campaign on this host, the executor chosen by
name, every session that has not run, the executor closed whatever happens, then the
transform. The CLI parses and prints around it; nothing here prints."""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from runner import layout
from runner.campaign import RunReport, run_sessions
from runner.clock import now
from runner.errors import ConfinementError, KeyRefused, UserError
from runner.executors.registry import make_executor
from runner.ledger import Ledger, sessions_digest
from runner.plan import Plan
from runner.settings import Settings
from runner.store import Store, open_store
from runner.throttle import Backoff
from runner.transform.run import TransformReport, run_transform


@contextmanager
def campaign_lock(settings: Settings, campaign: str) -> Iterator[None]:
    """One runner per campaign on this host; `ledger recover` needs the lock to be free."""
    settings.local.workdir.mkdir(parents=True, exist_ok=True)
    path = settings.local.workdir / f"{campaign}.lock"
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"campaign {campaign!r} is being run by another process on this host (lock {path})") from None
        yield


def mark_run(store: Store, campaign: str, by: str) -> None:
    """Record that a run of the campaign begins now (``by``: run, or submit for a new
    controller Job): what an earlier run's stop is then older than (status._stopped)."""
    store.put(layout.run_key(campaign), json.dumps({"at": now(), "by": by}).encode() + b"\n")


@dataclass
class CampaignRun:
    store: Store
    sessions: RunReport   # what the sessions came to (interrupted, halted, unconfined)
    transcripts: TransformReport  # the transcripts and refusals the transform wrote


def run_campaign(settings: Settings, plan: Plan, corpus: Path, executor: str = "local", produced: list[str] | None = None,
                 resume: set[str] | None = None) -> CampaignRun:
    """Run every session of ``plan`` that has not run (and those of ``resume``), then the
    transform."""
    corpus = corpus.resolve()
    if not corpus.is_dir():
        raise UserError(f"corpus {corpus} is not a directory")
    store = open_store(settings.store, settings)
    runner = make_executor(executor, settings)
    with campaign_lock(settings, plan.campaign):
        mark_run(store, plan.campaign, "run")
        try:
            backoff = Backoff(settings.throttle.base_seconds, settings.throttle.ceiling_seconds)
            report = run_sessions(plan, corpus, store, runner, settings.local.workdir, settings.concurrency,
                                  produced or [], resume=resume, backoff=backoff, budget=settings.budget)
        except UserError as e:  # refused before a session ran (the first confinement or key check, a bad input):
            # final for a Job too, so a watch must end on it, with what to do (the monitor's words end on the fix)
            why = f"{e}, then {runner.remedies(plan.campaign).again}" if runner.name == "kubernetes" and isinstance(
                e, ConfinementError | KeyRefused) else str(e)
            record_stop(store, plan, why, e.exit_code,
                        sessions_digest(Ledger(store, plan.campaign).sessions(), [x.key for x in plan.sessions()]))
            raise type(e)(why) from e
        finally:
            runner.close()
        transcripts = run_transform(store, plan, settings.transform.workers, settings.transform.parallel_min_bytes)
        if (stop := report.stopped()) is not None:  # after the transform: a watch that ends on it finds the transcripts
            record_stop(store, plan, *stop, report.ledger_read)
        return CampaignRun(store, report, transcripts)


def record_stop(store: Store, plan: Plan, why: str, code: int, ledger_read: str) -> None:
    """Why a run stopped with sessions left that no retry of it starts (layout.stopped_key):
    what `status` says, and a watch ends on, while the ledger stays as it read it."""
    store.put(layout.stopped_key(plan.campaign), json.dumps(
        {"at": now(), "why": why, "exit": code, "sessions_sha256": ledger_read}, indent=2).encode() + b"\n")
