"""Running a campaign: journal, seal, execute, capture, journal, for every session, then the
transform. Safe to run again: the ledger decides what runs, and nothing that may have spent
runs a second time by itself.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal, TypeVar

from runner import digest, harnesses, hooks, layout, logs, stream
from runner.aio import blocking
from runner.budget import Gate, OverBudget, settled_cost
from runner.clock import now
from runner.corpus import corpus_fingerprint, store_identifiers, store_plan
from runner.errors import NotStarted, SealError, SessionInterrupted, SessionRefused, UserError
from runner.executors.base import CaptureRecord, Executor, Halt, Phases, Remedies, Slot, Slots, Waiting
from runner.harnesses.contract import Signals
from runner.ledger import Declaration, Ledger, Money, SessionState, sessions_digest
from runner.plan import Plan, SessionSpec
from runner.progress import BudgetBooks, Paused, RunEnded, RunNote, RunPlanned, RunSubscriber, SessionEnded, SessionStarted, ignore
from runner.seal import SealedWorkspace, seal
from runner.settings import BudgetSettings
from runner.share import WHOLE, Share
from runner.store import Store
from runner.throttle import Backoff, Halted, observe, refused_key
from runner.transform.events import shown_paths, written_paths

log = logging.getLogger(__name__)
T = TypeVar("T")


def declaration(plan: Plan, spec: SessionSpec, corpus_digest: str) -> Declaration:
    """What an attempt is bound to; a resumed attempt must present the same."""
    return {"probe": spec.probe, "arm": spec.arm, "repetition": spec.repetition,
            "plan": digest.of_bytes(plan.canonical_json()), "corpus": corpus_digest}


def named_write_paths(parsed: stream.ParsedStream, workspace: str) -> set[str]:
    """Workspace files the stream's write calls name: collected even if the session left them unchanged."""
    return {p for p in written_paths(parsed.tool_uses, workspace) if not p.startswith("/") and p != "."}


# What stopped a run with sessions left: a failed confinement check, a refused key, the budget.
StopCause = Literal["unconfined", "key", "policy", "budget"]
# Where an operator reads what to do when the gateway refuses what every session sends.
POLICY_FIX = "docs/operating.md, 'The gateway refused the model's calls'"


@dataclass
class RunReport:
    remedies: Remedies  # how the campaign is run again, in its executor's words
    ran: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # session -> status it already had
    interrupted: list[str] = field(default_factory=list)
    halted: str | None = None  # why session starts stopped (a refused key), or None
    unconfined: str | None = None  # why session starts stopped (a failed confinement check), or None
    refused: list[str] = field(default_factory=list)  # sessions whose stream showed the key refused, or the gateway every call
    policy: str | None = None  # why session starts stopped: the gateway refused what every session sends, or None
    over_budget: list[str] = field(default_factory=list)  # sessions not started: their reservation did not fit
    budget_why: str | None = None  # the budget's words for the last of them
    ledger_read: str = ""  # ledger.sessions_digest of the planned sessions as this run left them

    def halt(self, halt: Halt) -> None:
        """Note the executor's halt: the key's or the platform's (the first of each is kept)."""
        if halt.key:
            self.halted = self.halted or halt.why
        else:
            self.unconfined = self.unconfined or halt.why

    def stopped(self) -> tuple[str, StopCause] | None:
        """Why this run left sessions that no retry of it starts, in words, and its cause (the
        service's outcome table makes the exit status of it, on which a Job fails at once): a
        failed confinement check, a refused key, the budget."""
        again = self.remedies.again
        if self.unconfined:  # the cluster no longer confines sessions as promised: an operator's matter
            return (f"halted: {self.unconfined}; no further session was started. Fix the cluster's network policy, "
                    f"then {again}", "unconfined")
        if self.halted:  # a setting to fix, not a run to retry
            then = (f"{self.remedies.resume(*self.refused)} runs again the sessions that failed on it and starts those "
                    "not started") if self.refused else again
            return f"halted: {self.halted}; {self.remedies.fix_key}, then {then}", "key"
        if self.policy:  # the campaign's settings (its model, its CLI, its prices), not a session's doing
            return (f"halted: the gateway refused every call of {len(self.refused)} session(s), for what every session of the "
                    f"campaign sends: {self.policy}; no further session was started. Fix the setting it names ({POLICY_FIX}), "
                    f"then {self.remedies.resume(*self.refused)} runs again the sessions that failed on it and starts those "
                    "not started", "policy")
        if self.over_budget:
            return (f"budget: {len(self.over_budget)} session(s) not started, e.g. {self.over_budget[0]}: "
                    f"{self.budget_why}. Nothing of them is journaled; raise the budget (--budget-usd) and {again} "
                    "to start them", "budget")
        return None


def run_sessions(plan: Plan, corpus: Path, store: Store, executor: Executor, workdir: Path, concurrency: int,
                 produced: list[str], progress: RunSubscriber = ignore, resume: set[str] | None = None,
                 backoff: Backoff | None = None, budget: BudgetSettings | None = None, share: Share = WHOLE,
                 io_threads: int = 64, admit: Callable[[str | None], None] | None = None) -> RunReport:
    """Run what the ledger says has not run. ``backoff`` (default: none) holds back session
    starts while the provider throttles (see runner/throttle.py); ``budget`` (default: none)
    starts no session whose reservation would take the campaign past its budget (runner/budget.py).
    ``progress`` is told what happens as it happens (runner/progress.py). ``share``: the part of
    the campaign this run owns (runner/share.py; default the whole): its sessions alone, held to
    its part of the budget; ``concurrency`` is the caller's part of the campaign's. ``admit`` is
    given the version the executor's harness reports once its preflight passed, before anything
    is stored: it raises UserError where the campaign may not run on it (runner/admission.py).

    The sessions run as coroutines of one event loop (runner/aio.py), ``concurrency`` plus the
    executor's waiting room of them at once, taking the sessions in the plan's order: a session
    waiting (for the budget, a slot, its pod, its harness's end) holds no thread. What blocks
    (the ledger, the store, sealing, the executor's requests) runs on ``io_threads`` threads."""
    store_plan(store, plan)  # before the checks: a run they refuse records its stop, which status reads with the plan
    store_identifiers(store, plan, corpus)
    ledger = Ledger(store, plan.campaign)
    corpus_digest = corpus_fingerprint(corpus)
    states = ledger.sessions()
    report = RunReport(executor.remedies(plan.campaign))
    todo: list[tuple[SessionSpec, int, bool]] = []
    executor.preflight()
    if admit is not None:
        admit(executor.harness_version)
    mine = share.sessions(plan)
    final = {(spec.probe, spec.name, st.attempt) for spec in mine
             if (st := states.get(spec.key)) and st.status not in ("pending", "intended", "started")}
    live = executor.prepare(plan, final, share)
    for spec in mine:
        st = states.get(spec.key) or SessionState(spec.key)  # none journaled: pending, attempt 0
        status = st.status
        if resume and spec.key in resume:
            todo.append((spec, st.attempt + 1, False))
        elif status == "pending":
            todo.append((spec, 1, False))
        elif status == "intended":
            todo.append((spec, st.attempt, False))  # journaled but never started: nothing was spent
        elif status == "started" and (spec.probe, spec.name, st.attempt) in live:
            todo.append((spec, st.attempt, True))  # its pod outlived a restart: finish capturing it
        elif status == "started":
            report.interrupted.append(spec.key)
        else:
            report.skipped[spec.key] = status
    progress(RunPlanned(plan.campaign, dict(Counter(spec.arm for spec, _, _ in todo))))

    slots = Slots(concurrency, executor.waiting_room)
    reservation = budget.reservation() if budget is not None else None

    def books(g: Gate) -> None:
        progress(BudgetBooks(plan.campaign, g.budget, g.spent, g.reserved))

    gate = (Gate(ledger, budget.campaign_usd, reservation, books, None if share.whole else share.budget(budget.campaign_usd, plan),
                 None if share.whole else {spec.key for spec in mine})
            if budget and budget.campaign_usd and reservation else None)

    async def not_started(spec: SessionSpec, attempt: int, why: str) -> None:
        """The session does not start in this run. A pod an earlier run created for its
        attempt before it was started (intended, not started) goes now, not at its deadline."""
        if (spec.probe, spec.name, attempt) in live:
            await blocking(executor.finish, layout.SessionKeys(plan.campaign, spec.probe, spec.name, attempt))
        progress(SessionEnded(spec.arm, spec.key, spec.probe, spec.name, f"not started ({why})", None))

    async def one(item: tuple[SessionSpec, int, bool]) -> None:
        spec, attempt, adopt = item
        phases: Phases = {"queued": now()}
        note = waits.of(spec.key)
        if gate is not None and not adopt:
            try:  # before a slot is taken: a session waiting for money holds none a stepped-aside one needs back
                await gate.hold(lambda why: note(why, "budget_held"))
                note(None, None)
            except OverBudget as e:  # nothing is journaled: raising the budget and running again starts it
                note(None, None)  # it waits no more: the run's end says why it did not start
                report.over_budget.append(spec.key)
                report.budget_why = str(e)
                await not_started(spec, attempt, "over budget")
                return
            phases["budget_held"] = now()
        try:
            async with slots.take(force=adopt, note=note) as slot:  # a session whose harness already runs is followed at once
                await one_in_slot(spec, attempt, adopt, slot, phases)
        finally:
            if gate is not None:
                await gate.done(ledger, spec.key, attempt)

    async def one_in_slot(spec: SessionSpec, attempt: int, adopt: bool, slot: Slot, phases: Phases) -> None:
        halt = executor.halted()
        if halt and not adopt:  # nothing is journaled: the next run starts it, after a passing check
            report.halt(halt)
            await not_started(spec, attempt, halt.why)
            return
        if report.policy and not adopt:  # nothing is journaled: the run after the fix starts it
            await not_started(spec, attempt, "halted: the gateway refuses what every session sends")
            return
        if backoff is not None and not adopt:
            try:
                await backoff.wait(lambda why: slot.note(why, "slot_held"))
            except Halted as e:  # nothing is journaled: the next run starts it
                slot.note(None)
                await not_started(spec, attempt, str(e))
                return
            slot.note(None)
        signals = Signals()
        phases["slot_held"] = now()
        progress(SessionStarted(spec.arm, spec.key))
        status, cost, stored = await run_attempt(plan, corpus, store, ledger, executor, workdir, spec, attempt, corpus_digest,
                                           produced, adopt, signals, slot, gate.money() if gate is not None else None, phases)
        report.ran.append(spec.key)
        progress(SessionEnded(spec.arm, spec.key, spec.probe, spec.name, status, cost, stored, phases))
        if signals.policy is not None:
            report.refused.append(spec.key)
            report.policy = report.policy or signals.policy
            progress(RunNote(f"the gateway refused every call of {spec.key}: {signals.policy}: no further session is started "
                             "(the run's end says what to do)"))
        if backoff is not None and status in ("succeeded", "failed"):
            if signals.refused is not None:
                report.refused.append(spec.key)
                progress(RunNote(f"{refused_key(signals.refused)} in {spec.key}: no further session is started "
                                 "(the run's end says what to do)"))
            pause = backoff.record(signals)
            if pause > 0:
                progress(Paused(f"provider throttling in {spec.key} ({signals.retries} retries"
                                f"{', rejected' if signals.rejected else ''}): new sessions wait {pause:.0f} s", pause))

    if gate is not None:  # adopted sessions may still give money back: counted before any session asks for some
        for _, _, adopt in todo:
            if adopt:
                gate.adopt()
    # why sessions wait, for status: the run's and the executor's waits (a share's run writes its own)
    waits = Waiting(store, layout.waiting_key(plan.campaign, None if share.whole else share.name))
    try:
        asyncio.run(_each(todo, one, concurrency + executor.waiting_room, io_threads))
    finally:
        waits.stop()
        progress(RunEnded())
    if backoff is not None and backoff.halted is not None:
        report.halted = report.halted or backoff.halted
    if (halt := executor.halted()) is not None:
        report.halt(halt)
    report.ledger_read = sessions_digest(ledger.sessions(), [spec.key for spec in mine])
    return report


async def _each(todo: list[T], one: Callable[[T], Awaitable[None]], workers: int, io_threads: int) -> None:
    """``one`` of every item of ``todo``, ``workers`` at once, each taking the next in order.
    An error in one item does not stop the others (a session that may have spent is followed to
    its end): once all have run, the first item's error, in ``todo``'s order, is raised."""
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=io_threads, thread_name_prefix="io"))
    items = iter(enumerate(todo))
    errors: dict[int, Exception] = {}

    async def worker() -> None:
        for i, item in items:
            try:
                await one(item)
            except Exception as e:  # noqa: BLE001 - raised once every item has run
                errors[i] = e

    await asyncio.gather(*(worker() for _ in range(min(workers, len(todo)))))
    if errors:
        raise errors[min(errors)]


async def run_attempt(plan: Plan, corpus: Path, store: Store, ledger: Ledger, executor: Executor, workdir: Path,
                      spec: SessionSpec, attempt: int, corpus_digest: str, produced: list[str], adopt: bool,
                      signals: Signals, slot: Slot, money: Money | None,
                      phases: Phases | None = None) -> tuple[str, Decimal | None, int]:
    """One session attempt: its status word (with why, where it did not end as planned), the
    cost its stream states and the bytes of its stream stored. ``adopt``: its start is journaled and its pod still runs (a
    restarted controller finishes capturing it instead of starting it again). What the stream
    says about provider throttling is noted into ``signals``; ``slot`` is its place among the
    running sessions, which the executor may step aside while the session waits to start;
    ``money`` is the budget's reservation, journaled with its start. ``phases``: the session's
    milestones so far (executors.base.Phases), to which a captured attempt adds the executor's
    and ``outcome_journaled``; they are stored with its capture record (but the last, which is
    the outcome entry's ``at``). A coroutine of the campaign's loop: its journal, store and
    sealing work runs on the loop's threads (runner/aio.py)."""
    phases = {} if phases is None else phases
    with logs.session_context(plan.campaign, spec.probe, spec.name, attempt):
        keys = layout.SessionKeys(plan.campaign, spec.probe, spec.name, attempt)
        scratch = workdir / plan.campaign / spec.probe / f"{spec.name}.{attempt}"
        try:
            sealed = await blocking(_begin, plan, corpus, store, ledger, spec, attempt, corpus_digest, adopt, keys, scratch)
            if sealed is None:
                return "refused (workspace could not be sealed)", None, 0
            parsed_once: list[stream.ParsedStream] = []

            def parsed_stream() -> stream.ParsedStream:
                """The stored stream, parsed once: the executor asks for its write paths before it
                collects the artifacts, and the outcome needs its cost and throttling after."""
                if not parsed_once:
                    parsed_once.append(harnesses.HARNESS.parse(observe(store.iter_lines(keys.stream), signals), False))
                return parsed_once[0]

            def also(k: layout.SessionKeys, workspace: str) -> set[str]:
                assert k == keys, "an executor collects the artifacts of the session it runs"
                return named_write_paths(parsed_stream(), workspace) | shown_paths(produced, workspace)

            def started() -> None:
                if not adopt:  # an adopted attempt's start is journaled already
                    ledger.start(spec.key, attempt, money)

            try:
                record = await executor.run(plan, plan.probe(spec.probe), sealed, scratch, store, keys, also, started, slot)
            except NotStarted as e:  # nothing ran: the session stays intended and the next run tries it again
                return f"not started ({e})", None, 0
            except SessionRefused as e:  # the harness never ran: refused with the reason, nothing spent
                log.warning("refused: %s", e)
                await blocking(_final, ledger, executor, spec.key, keys, "refused", {"reason": str(e)})
                return f"refused ({e})", None, 0
            except SessionInterrupted as e:
                log.warning("interrupted: %s", e)
                await blocking(_final, ledger, executor, spec.key, keys, "interrupted", e.detail)
                return f"interrupted ({e})", None, 0
            except Exception as e:  # the harness may have spent: record what is known, never retry by itself
                log.error("the executor failed: %s: %s", type(e).__name__, e, exc_info=True)
                if (await blocking(ledger.state, spec.key)).status == "intended":  # it failed before the harness could start
                    return f"not started ({type(e).__name__}: {e})", None, 0
                await blocking(_final, ledger, executor, spec.key, keys, "failed", {"reason": f"{type(e).__name__}: {e}"})
                return f"failed ({type(e).__name__}: {e})", None, 0
            return await blocking(_captured, store, ledger, executor, spec.key, keys, record, produced, phases, parsed_stream, signals)
        finally:
            await blocking(shutil.rmtree, scratch, ignore_errors=True)


def _begin(plan: Plan, corpus: Path, store: Store, ledger: Ledger, spec: SessionSpec, attempt: int, corpus_digest: str,
           adopt: bool, keys: layout.SessionKeys, scratch: Path) -> SealedWorkspace | None:
    """An attempt up to its run: its intent journaled (but an adopted one's), its workspace
    sealed in ``scratch`` and the seal's record stored; None where it could not be sealed (the
    attempt is then journaled refused)."""
    decl = declaration(plan, spec, corpus_digest)
    current = ledger.state(spec.key)
    if attempt > 1 and current.declaration is not None and current.declaration != decl:
        raise UserError(f"{spec.key}: the plan or corpus changed since attempt {current.attempt}; a resumed attempt needs the same inputs")
    if not adopt:
        hooks.stage("before-intent")
        ledger.intent(spec.key, attempt, decl)
        hooks.stage("after-intent")
    if scratch.exists():
        shutil.rmtree(scratch)
    try:
        sealed = seal(corpus, plan, plan.probe(spec.probe), spec.arm, scratch / "workspace")
    except SealError as e:
        ledger.outcome(spec.key, attempt, "refused", {"reason": str(e)})
        return None
    store.put(keys.seal, json.dumps(sealed.record(), indent=1, sort_keys=True).encode())
    return sealed


def _final(ledger: Ledger, executor: Executor, session: str, keys: layout.SessionKeys, status: str,
           detail: dict[str, Any]) -> None:
    """An attempt that ended without a capture: its outcome journaled, then what it held released."""
    ledger.outcome(session, keys.attempt, status, detail)
    executor.finish(keys)


def _captured(store: Store, ledger: Ledger, executor: Executor, session: str, keys: layout.SessionKeys, record: CaptureRecord,
              produced: list[str], phases: Phases, parsed_stream: Callable[[], stream.ParsedStream],
              signals: Signals) -> tuple[str, Decimal | None, int]:
    """A captured attempt's end: its capture record stored, its outcome journaled from its
    stream (cost, throttling, a refused key), then what it held released."""
    record["driver_produced"] = list(produced)
    phases.update(record.get("phases") or {})
    record["phases"] = phases.copy()
    store.put(keys.capture, json.dumps(record, indent=1, sort_keys=True).encode())
    parsed = parsed_stream()
    refused = signals.refused
    meter = record.get("gateway") or {}
    if meter.get("refused_every_session") and not meter.get("calls"):  # the model was never reached, for its settings
        signals.policy = str(meter["refused_every_session"])
    status = "failed" if record["timed_out"] or refused is not None or signals.policy is not None else "succeeded"
    detail: dict[str, object] = {"stream": record["stream"], "exit_code": record["exit_code"],
                                 "timed_out": record["timed_out"]}
    settled = settled_cost(parsed.cost_usd, record.get("gateway"))
    if settled is not None:  # what the budget's books settle this attempt at
        detail["cost_usd"] = str(settled)
    if refused is not None:  # the model was never reached: failed, so `ledger resume` can run it again
        detail["reason"] = refused_key(refused)
    elif signals.policy is not None:  # likewise
        detail["reason"] = f"the gateway refused every call: {signals.policy}"
    hooks.stage("before-outcome")
    phases["outcome_journaled"] = ledger.outcome(session, keys.attempt, status, detail)["at"]
    log.info("outcome %s: exit %s, cost %s USD", status, record["exit_code"], parsed.cost_usd)
    executor.finish(keys)
    shown = f"{status} ({detail['reason']})" if signals.policy is not None else status  # the board and the log say why
    return shown, parsed.cost_usd, record["stream"]["bytes"]
