"""Running a campaign, as every command that runs one does it (``run``, ``controller``,
``demo``, ``ledger resume``): one runner per campaign on this host, the executor chosen by
name, every session that has not run, the executor closed whatever happens, then the
transform; and what it came to (``CampaignRun``: the sessions left, what the transform wrote,
the stop). The CLI parses and renders around it; nothing here prints (the sessions' progress
goes to the subscriber the caller gives: runner/progress.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from runner import admission, layout
from runner.campaign import RunReport, run_sessions
from runner.clock import now
from runner.errors import ConfinementError, KeyRefused, UserError
from runner.executors.registry import make_executor
from runner.ledger import Ledger, sessions_digest
from runner.metrics import Metrics, serving
from runner.plan import Plan, SessionSpec
from runner.progress import RunSubscriber, chain, ignore
from runner.service.outcome import STOPS, Outcome, error_outcome, exit_status, written_outcome
from runner.service.stored import campaign_lock, mark_run, stored_campaign
from runner.settings import Settings
from runner.share import WHOLE, Share
from runner.store import Store, open_store
from runner.throttle import Backoff
from runner.transform.run import TransformReport, run_transform

# How a campaign whose transform ran by itself (`probe-runner transform`) starts what has not started.
RUN_AGAIN = "`probe-runner run` it again"


@dataclass(frozen=True)
class Written:
    """What the transform wrote, and what the ledger leaves undone after it."""

    campaign: str
    store_uri: str
    tier: str                # the plan's tier, which names the transcripts
    report: TransformReport  # the transcripts and refusals written
    not_started: list[str]   # planned sessions never started (pending, or intended): nothing was spent on them
    again: str               # how the campaign runs again to start them, on its executor
    outcome: Outcome         # DONE, REFUSED or UNFINISHED


@dataclass(frozen=True)
class Interrupted:
    """A session started with no outcome: it may or may not have executed."""

    key: str
    resume: str  # the command that runs a new attempt of it


@dataclass(frozen=True)
class Stop:
    """Why a run left sessions that no retry of it starts (recorded: a watch ends on it)."""

    why: str
    outcome: Outcome


@dataclass(frozen=True)
class ShareEnded:
    """A share of a split campaign ended (runner/share.py) and others had not: the transform is
    the last share's to run. What its own sessions left decides how it ends."""

    share: str
    not_started: list[str]  # its sessions never started (pending, or intended): nothing was spent on them
    again: str              # how the campaign runs again to start them, on its executor
    outcome: Outcome        # DONE or UNFINISHED
    waiting_for: list[str]  # the shares that had not ended


@dataclass(frozen=True)
class CampaignRun:
    campaign: str
    sessions: RunReport       # what the sessions came to (interrupted, halted, unconfined)
    written: Written | ShareEnded  # the transcripts and refusals the transform wrote, or a share's end before the last
    interrupted: list[Interrupted]
    stop: Stop | None

    @property
    def outcome(self) -> Outcome:
        """A stop says what the run came to; else what the transform leaves (a share's own sessions)."""
        return self.stop.outcome if self.stop is not None else self.written.outcome


def written(store: Store, plan: Plan, report: TransformReport, again: str = RUN_AGAIN) -> Written:
    """What ``report``'s transform leaves: the sessions the ledger says never started and
    whether any is still started, and so the outcome."""
    waiting, unfinished = _left(store, plan, plan.sessions())
    return Written(plan.campaign, store.uri, plan.tier.value, report, waiting, again, written_outcome(bool(waiting), unfinished, bool(report.refusals)))


def transform_stored(settings: Settings, campaign: str) -> Written:
    """(Re)build a stored campaign's transcripts and refusals.json on this host."""
    store, plan = stored_campaign(settings, campaign)
    return written(store, plan, run_transform(store, plan, settings.transform.workers, settings.transform.parallel_min_bytes))


def run_campaign(settings: Settings, plan: Plan, corpus: Path, executor: str = "local", produced: list[str] | None = None,
                 resume: set[str] | None = None, progress: RunSubscriber = ignore, share: Share = WHOLE) -> CampaignRun:
    """Run every session of ``plan`` that has not run (and those of ``resume``), then the
    transform; ``progress`` is told of the sessions as they go (runner/progress.py). Where
    metrics.port is set, the run's metrics (runner/metrics.py) are served on it meanwhile.
    ``share``: run that share of the campaign alone (runner/share.py), with its part of the
    concurrency and the budget; the transform is then the last share's to run."""
    corpus = corpus.resolve()
    if not corpus.is_dir():
        raise UserError(f"corpus {corpus} is not a directory")
    if not settings.metrics.port:
        return _run_campaign(settings, plan, corpus, executor, produced, resume, progress, None, share)
    metrics = Metrics()
    with serving(metrics, settings.metrics, f"campaign {plan.campaign}"):
        return _run_campaign(settings, plan, corpus, executor, produced, resume, chain(metrics.run, progress), metrics, share)


def _run_campaign(settings: Settings, plan: Plan, corpus: Path, executor: str, produced: list[str] | None,
                  resume: set[str] | None, progress: RunSubscriber, metrics: Metrics | None, share: Share) -> CampaignRun:
    concurrency = share.concurrency(settings.concurrency)  # refused before anything is written where it cannot split
    store = open_store(settings.store, settings)
    runner = make_executor(executor, settings, metrics)
    with campaign_lock(settings, plan.campaign, share):
        mark_run(store, plan.campaign, "run")
        try:
            backoff = Backoff(settings.throttle.base_seconds, settings.throttle.ceiling_seconds)
            report = run_sessions(plan, corpus, store, runner, settings.local.workdir, concurrency,
                                  produced or [], progress, resume=resume, backoff=backoff,
                                  budget=settings.budget, share=share, io_threads=settings.io_threads,
                                  admit=lambda version: admission.admit(plan, version, settings))
        except UserError as e:  # refused before a session ran (the first confinement or key check, a bad input):
            # final for a Job too, so a watch must end on it, with what to do (the monitor's words end on the fix)
            why = runner.remedies(plan.campaign).refusal(str(e)) if isinstance(e, ConfinementError | KeyRefused) else str(e)
            record_stop(store, plan, why, exit_status(error_outcome(e)),
                        sessions_digest(Ledger(store, plan.campaign).sessions(), [x.key for x in plan.sessions()]))
            raise type(e)(why) from e
        finally:
            runner.close()
        stop = run_stop(report)
        interrupted = [Interrupted(key, report.remedies.resume(key)) for key in report.interrupted]
        if not share.whole:
            stop, others = _share_ended(store, plan, share, settings.kube.owner_uid or "local", stop)
            if others:  # not the last share: its own sessions decide how it ends
                not_started, unfinished = _left(store, plan, share.sessions(plan))
                ended = ShareEnded(share.name, not_started, report.remedies.again,
                                   written_outcome(bool(not_started), unfinished, False), others)
                return CampaignRun(plan.campaign, report, ended, interrupted, stop)
        transcripts = run_transform(store, plan, settings.transform.workers, settings.transform.parallel_min_bytes)
        if stop is not None:  # after the transform: a watch that ends on it finds the transcripts
            # the ledger as the run leaves it: a share's reading of its own sessions is not the campaign's
            read = report.ledger_read if share.whole else sessions_digest(
                Ledger(store, plan.campaign).sessions(), [spec.key for spec in plan.sessions()])
            record_stop(store, plan, stop.why, exit_status(stop.outcome), read)
        return CampaignRun(plan.campaign, report, written(store, plan, transcripts, report.remedies.again), interrupted,
                           stop)


def _left(store: Store, plan: Plan, sessions: list[SessionSpec]) -> tuple[list[str], bool]:
    """Of ``sessions``: those the ledger says never started, and whether any is still started."""
    states = Ledger(store, plan.campaign).sessions()
    waiting = [spec.key for spec in sessions if spec.key not in states or states[spec.key].status == "intended"]
    return waiting, any(states[spec.key].status == "started" for spec in sessions if spec.key in states)


def _share_ended(store: Store, plan: Plan, share: Share, run: str, stop: Stop | None) -> tuple[Stop | None, list[str]]:
    """Say that ``share`` of the split run ``run`` (its controller Job's uid) ended, and why it
    stopped where it did; then the shares that have not said so. Each share says it after its
    last outcome is journaled, so the share that finds every other ended runs the transform
    over every session's outcome (two ending at once may both run it: it is a function of the
    ledger and the stored streams, so both write the same). Its stop is then the campaign's:
    this share's, or the first another share recorded."""
    store.put(layout.share_ended_key(plan.campaign, run, share.name), json.dumps(
        {"at": now(), "stop": None if stop is None else {"why": stop.why, "outcome": stop.outcome.value}}).encode() + b"\n")
    prefix = layout.share_ended_prefix(plan.campaign, run)
    ended = {key.removeprefix(prefix).removesuffix(".json"): key for key in store.list(prefix)}
    others = [s.name for s in (Share(i, share.count) for i in range(share.count)) if s.name not in ended]
    if others or stop is not None:
        return stop, others
    for key in ended.values():
        said = json.loads(store.get(key)).get("stop")
        if said is not None:
            return Stop(said["why"], Outcome(said["outcome"])), others
    return None, others


def run_stop(report: RunReport) -> Stop | None:
    """The stop a run's report makes, in its words (RunReport.stopped), and what it came to."""
    stopped = report.stopped()
    return None if stopped is None else Stop(stopped[0], STOPS[stopped[1]])


def record_stop(store: Store, plan: Plan, why: str, code: int, ledger_read: str) -> None:
    """Why a run stopped with sessions left that no retry of it starts (layout.stopped_key):
    what `status` says, and a watch ends on, while the ledger stays as it read it."""
    store.put(layout.stopped_key(plan.campaign), json.dumps(
        {"at": now(), "why": why, "exit": code, "sessions_sha256": ledger_read}, indent=2).encode() + b"\n")


def run_submitted(settings: Settings, campaign: str, resume: tuple[str, ...] = (),
                  progress: RunSubscriber = ignore, share: Share = WHOLE) -> CampaignRun:
    """The controller Job's run: every session of the campaign ``submit`` stored (its plan and
    corpus) as Kubernetes pods, and a new attempt of each of ``resume``, then the transform;
    of ``share`` of them, in one pod of an Indexed Job (kube.controllers)."""
    from runner.corpus import fetch_corpus
    from runner.service.ledger import check_resumable

    store, plan = stored_campaign(settings, campaign)
    if resume:
        book = Ledger(store, plan.campaign)
        for session in resume:
            check_resumable(book, plan, session)
    corpus = fetch_corpus(store, plan.campaign, settings.local.workdir / plan.campaign / "corpus")
    return run_campaign(settings, plan, corpus, "kubernetes", resume=set(resume) or None, progress=progress, share=share)
