"""The transform of one campaign: raw streams, artifacts and the plan in; transcripts and
refusals out.

It reads only the store (never a live session), so it can run anywhere and again at any time:
its outputs are derived documents, rewritten whole on every run. Each session whose capture
succeeded is transformed; each transcript is confirmed as ``headwater probe record`` would
before it is written; everything refused or not recorded lands in ``refusals.json`` with its
reason.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import multiprocessing
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from decimal import MAX_PREC, Decimal, localcontext
from typing import Any, NotRequired, TypedDict

from runner import digest, harnesses, layout
from runner.budget import realized_cost
from runner.clock import now
from runner.corpus import load_identifiers
from runner.errors import UserError
from runner.ledger import Ledger, SessionState, sessions_digest
from runner.plan import Plan, SessionSpec
from runner.seal import SealRecord
from runner.store import NotFound, Store
from runner.transform.events import SessionFacts, SessionOutcome, session_event
from runner.transform.intake import confirm_rendered
from runner.transform.transcript import rendered

log = logging.getLogger(__name__)

COMPARABILITY_PROSE = (
    "The batches of 2026-09-28 and 2026-09-30 ran under bypassPermissions and the configuration "
    "of the host. A rate from this transcript, recorded under the recorder contract, does not "
    "compare with a rate from those batches."
)


class Refusal(TypedDict):
    """One entry of ``refusals.json``: a session not recorded or refused by the recorder (scope
    "session"), an event the intake dropped ("event"), a transcript it refused ("transcript").
    Each scope writes its keys in an order of its own (the bytes of refusals.json keep it)."""

    scope: str
    probe: NotRequired[str | None]    # session and event scopes (an event may name none)
    session: NotRequired[str | None]
    arm: str
    status: str                       # the ledger's status, or "refused", "dropped"
    transcript: NotRequired[str]      # transcript scope: its key
    reason: str


class Refusals(TypedDict):
    """``refusals.json`` (layout.refusals_key)."""

    campaign: str
    refusals: list[Refusal]


class TransformedReceipt(TypedDict):
    """``transformed.json`` (layout.transformed_key), written last: which reading of the ledger
    the transcripts and SHA256SUMS are of."""

    at: str               # when, ISO 8601 (runner.clock.now)
    sessions_sha256: str  # ledger.sessions_digest of the planned sessions as read
    sums_sha256: str      # digest of SHA256SUMS as written


@dataclass
class ArmResult:
    arm: str
    key: str | None
    events: int
    refusal: str | None


@dataclass
class TransformReport:
    arms: list[ArmResult] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    cost_usd: Decimal = Decimal(0)


def _final_file(store: Store, keys: layout.SessionKeys, stored: set[str]) -> Callable[[str], bytes | None]:
    def read(rel: str) -> bytes | None:
        if rel not in stored:
            return None
        try:
            return store.get(keys.artifact(rel))
        except NotFound:
            return None
    return read


def session_outcome(store: Store, plan: Plan, keys: layout.SessionKeys,
                      identifiers: frozenset[str]) -> tuple[SessionOutcome, dict[str, Any]]:
    capture = json.loads(store.get(keys.capture))
    sealed: SealRecord = json.loads(store.get(keys.seal))
    arts = capture.get("artifacts") or {}
    timed_out = bool(capture.get("timed_out"))
    harness = harnesses.HARNESS
    facts = SessionFacts(
        probe=keys.probe,
        session=keys.session,
        workspace=capture["workspace"],
        config_dir=capture["config_dir"],
        manifest=sealed["manifest"],
        final_file=_final_file(store, keys, set(arts.get("stored", []))),
        identifiers=identifiers,
        artifacts_collected=bool(capture.get("artifacts")),
        not_collected_because=capture.get("artifacts_not_collected"),
        links=arts.get("links") or {},
        views=sealed.get("views") or {},
        changed=arts.get("changed") or {},
        deleted=frozenset(arts.get("deleted") or []),
        timed_out=timed_out,
        driver_produced=capture.get("driver_produced", []),
        declared_mcp_servers=frozenset(sealed.get("mcp_servers", [])),
        host_skills=frozenset(capture.get("host_skills", [])),
        allowed_tools=frozenset(harness.rule_tools(listed)) if isinstance(listed := (capture.get("harness") or {}).get("allowed_tools"), list) else None,
    )
    parsed = harness.parse(store.iter_lines(keys.stream), timed_out)
    probe = plan.probe(keys.probe)
    outcome = session_event(parsed, facts, probe.answers, plan.identifier_re)
    failed = [c for c in capture.get("confinement_checks") or [] if not c.get("passed")]
    if failed and outcome.event is not None:
        # "Confinement measured": a session that ran while a check found a route open, or the
        # provider path shut, was not confined as stated, so it is no event.
        c = failed[0]
        outcome = replace(outcome, event=None, refusals=[*outcome.refusals, (
            f"confinement check {c['check']} at {c['at']} failed while this session ran: {c.get('problem', '')}")])
    if capture.get("oom_killed"):
        # The kernel ended the session at its memory limit: what the stream shows is where it
        # died, not where it ended.
        outcome = replace(outcome, event=None, refusals=[*outcome.refusals, (
            "the harness container was killed at its memory limit (OOMKilled): the session did not end on its own")])
    return outcome, capture


_worker: tuple[Store, Plan, frozenset[str]] | None = None  # what each pool process parses against


def _start_worker(store: Store, plan: Plan, identifiers: frozenset[str]) -> None:
    global _worker
    _worker = (store, plan, identifiers)


def parse_pool(store: Store, plan: Plan, identifiers: frozenset[str], workers: int) -> ProcessPoolExecutor:
    """The processes that parse streams (``_worker_outcome``) against ``store`` and ``plan``,
    spawned, not forked: the runner has threads (a live board, the gateway)."""
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_start_worker,
                               initargs=(store, plan, identifiers))


def _worker_outcome(keys: layout.SessionKeys) -> tuple[SessionOutcome, dict[str, Any]]:
    assert _worker is not None, "the pool's initializer gives each process its store and plan"
    store, plan, identifiers = _worker
    return session_outcome(store, plan, keys, identifiers)


def _outcomes(store: Store, plan: Plan, identifiers: frozenset[str], sessions: list[tuple[layout.SessionKeys, int]],
              workers: int, min_bytes: int,
              progress: Callable[[int, int], None] | None) -> list[tuple[SessionOutcome, dict[str, Any]]]:
    """Each session's outcome, in the order given: parsed here, or by ``workers`` processes
    once the streams (their sizes as the ledger recorded them) hold ``min_bytes``. Each process
    parses one stream at a time, so its memory is bounded by the longest line as in one
    process; results come back in order, so the transcripts are byte for byte the same."""
    total = len(sessions)
    workers = min(workers, total)
    results: Iterator[tuple[SessionOutcome, dict[str, Any]]]
    size = sum(size for _, size in sessions)
    if workers <= 1 or size < min_bytes:
        results = (session_outcome(store, plan, keys, identifiers) for keys, _ in sessions)
        return _counted(results, total, progress)
    log.info("parsing %d streams (%d bytes) in %d processes", total, size, workers)
    try:
        with parse_pool(store, plan, identifiers, workers) as pool:
            chunk = max(1, min(16, total // (workers * 8)))
            return _counted(pool.map(_worker_outcome, [keys for keys, _ in sessions], chunksize=chunk), total, progress)
    except BrokenProcessPool:  # a process of the pool died (the kernel's OOM killer, most likely): nothing was written
        raise UserError(f"a transform process died while parsing the streams of {plan.campaign} ({workers} at once); "
                        "nothing was written. Give the transform more memory, or set RUNNER_TRANSFORM__WORKERS=1 "
                        "to parse one stream at a time in one process") from None


def _counted(results: Iterable[tuple[SessionOutcome, dict[str, Any]]], total: int,
             progress: Callable[[int, int], None] | None) -> list[tuple[SessionOutcome, dict[str, Any]]]:
    out = []
    for result in results:
        out.append(result)
        if progress is not None:
            progress(len(out), total)
    return out


def _measured_confinement(captures: list[dict[str, Any]]) -> str | None:
    """What the canary checks recorded with these sessions measured (kubernetes executor)."""
    if not any(c.get("executor") == "kubernetes" for c in captures):
        return None
    checks = {(c["at"], c["check"]): c for cap in captures for c in cap.get("confinement_checks") or []}
    if not checks:
        return ("Confinement was not measured for these sessions: the controller ran no canary check "
                "(kube.canary_enabled was false).")
    ats = sorted(at for at, _ in checks)
    tried = sorted({r["route"] for c in checks.values() for r in c.get("routes", [])})
    failed = [c for _, c in sorted(checks.items()) if not c.get("passed")]
    text = (f"Confinement was measured, not assumed: {len(checks)} canary check(s) from {ats[0]} to {ats[-1]} ran a "
            f"pod with the session pods' labels, image and network policies, which tried {len(tried)} routes "
            f"({'; '.join(tried)}). ")
    if not failed:
        opened = sorted({r["route"] for c in checks.values() for r in c.get("routes", []) if r.get("must_open")})
        return text + f"In every check each route was closed but {' and '.join(opened) or 'none'}, which answered."
    return text + " ".join(f"Check {c['check']} at {c['at']} failed: {c.get('problem', '')}; the sessions it "
                           "overlapped are refused." for c in failed)


def _not_recorded(status: str, st: SessionState | None) -> str:
    """Why a session has no event, as precisely as its ledger entry says."""
    reason = st.detail.get("reason") if st else None
    if reason:
        return f"{status}: {reason}"
    return {
        "pending": "the session has not run",
        "intended": "journaled but never started (nothing was spent); the next run starts it",
        "started": "interrupted: the session may or may not have executed (ledger recover settles it)",
        "interrupted": "interrupted: the session may or may not have executed",
        "cancelled": "cancelled with ledger cancel",
    }.get(status, f"{status} (exit status {st.detail.get('exit_code')})" if st and "exit_code" in st.detail else status)


MICRO = Decimal("0.000001")


def exact_sum(values: list[Decimal]) -> Decimal:
    """The sum of the result lines' cost literals, exactly: Decimal's default context keeps 28
    significant digits, so 0.10 + 1E-30 would round to 0.10 and lose the cent it starts."""
    with localcontext() as ctx:
        ctx.prec = MAX_PREC
        return sum(values, Decimal(0))


def _cents(total: Decimal) -> int:
    """Whole cents, rounded up, of an exact sum (the product computed as exactly as the sum)."""
    with localcontext() as ctx:
        ctx.prec = MAX_PREC
        return int(math.ceil(total * 100))


def _prose(plan: Plan, arm: str, outcomes: list[SessionOutcome], captures: list[dict[str, Any]], planned: int,
           not_recorded: int) -> list[str]:
    accepted = sum(1 for o in outcomes if o.event is not None)
    allowed = sorted({" ".join(c["harness"].get("allowed_tools", [])) for c in captures}) or ["none captured"]
    prose = [
        f"Campaign {plan.campaign}, {plan.tier.value} tier, {arm} arm: {planned} sessions planned, "
        f"{accepted} recorded as events, {len(outcomes) - accepted} refused by the recorder and "
        f"{not_recorded} not recorded; refusals.json names each refusal with its reason.",
        harnesses.HARNESS.conduct.format(allowed="; ".join(allowed)),
        COMPARABILITY_PROSE,
        *sorted({c["confinement"] for c in captures}),
        *([m] if (m := _measured_confinement(captures)) else []),
    ]
    outside = [(o, len(o.outside_paths)) for o in outcomes if o.outside_paths]
    if outside:
        detail = "; ".join(f"{o.probe} {o.session}: {n}" for o, n in outside)
        prose.append(f"Sessions named {sum(n for _, n in outside)} paths outside the workspace in all ({detail}).")
    else:
        prose.append("No session named a path outside the workspace.")
    prose.extend(notes_prose(outcomes))
    limited = [o for o in outcomes if o.timed_out and o.event is not None]
    if limited:
        prose.append(f"The time limit ended {len(limited)} session(s) before the harness finished "
                     f"({', '.join(f'{o.probe} {o.session}' for o in limited)}): each is recorded with the calls "
                     f"it made until then, and with answer null unless its result line had arrived; a session "
                     f"without a result line states no cost, so its cost is the gateway's meter where one metered it.")
    stopped = [o for o in outcomes if o.over_budget and o.event is not None]
    if stopped:
        prose.append(f"Its own spend limit (the CLI's {harnesses.HARNESS.budget_flag}, or the gateway's meter of every call made "
                     f"with its token) ended {len(stopped)} session(s) "
                     f"({', '.join(f'{o.probe} {o.session}' for o in stopped)}): each is recorded with the calls it "
                     f"made until then and answer null, as its stream says; the CLI stops after the answer that "
                     f"reaches the limit, so its cost may pass the limit by less than that answer's.")
    prose.extend(_gateway_prose(outcomes, captures))
    prose.append(_cost_prose(outcomes, captures))
    served = sorted({m for o in outcomes for m in o.served_models})
    if len(served) > 1:
        prose.append(f"The provider served more than one version: {', '.join(served)}.")
    return prose


def _cost_prose(outcomes: list[SessionOutcome], captures: list[dict[str, Any]]) -> str:
    unknown = [f"{o.probe} {o.session}" for o, c in zip(outcomes, captures, strict=True)
               if realized_cost(o.cost_usd, c.get("gateway")) is None]
    text = (f"cost_cents is the realized cost of the {len(outcomes)} captured sessions of this arm, refused ones "
            f"included: for each, the larger of its result line's {harnesses.HARNESS.stated_cost} and the provider gateway's meter "
            f"of its calls (as the budget's books settle it), summed exactly and rounded up to whole cents.")
    if unknown:
        text += (f" The cost of {len(unknown)} of them is not known ({', '.join(unknown)}): each ended without a "
                 f"result line and no gateway metered it, so cost_cents counts only the others and is a lower bound.")
    return text


def notes_prose(outcomes: list[SessionOutcome]) -> list[str]:
    """What the recorder saw of single events (an absent key, a file the session did not
    leave), as one paragraph."""
    noted = [f"{o.probe} {o.session}: {'; '.join(map(_plain, o.notes))}" for o in outcomes if o.event is not None and o.notes]
    return [f"Notes on single events. {'. '.join(noted)}."] if noted else []


def _plain(text: str) -> str:
    """A note as one line of plain prose: the paths in it are the session's, so a line break,
    a backtick or another control character in one is written as its escape, never as itself
    (a fence it opened would swallow the rest of the transcript)."""
    return "".join(c if c.isprintable() and c != "`" else f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"
                   for c in text)


def _gateway_prose(outcomes: list[SessionOutcome], captures: list[dict[str, Any]]) -> list[str]:
    """The provider gateway's meter beside the streams' own cost: a session can call the
    gateway outside the CLI with its token, and those calls are in the meter alone. Amounts are
    compared to the millionth of a dollar, as the CLI's costs are binary floats."""
    metered = [(o, c["gateway"]) for o, c in zip(outcomes, captures, strict=True) if "gateway" in c]
    if not metered:
        return []

    def usd(amount: Decimal) -> str:
        return f"${amount.quantize(MICRO)}"

    calls = sum(g["calls"] for _, g in metered)
    at_gateway = exact_sum([Decimal(g["cost_usd"]) for _, g in metered])
    in_streams = exact_sum([o.cost_usd for o, _ in metered if o.cost_usd is not None])
    text = (f"The provider gateway, which alone held the key, metered {calls} call(s) of {len(metered)} session(s) "
            f"at {usd(at_gateway)} from the provider's usage fields; their streams state {usd(in_streams)}.")
    apart = [f"{o.probe} {o.session} (gateway {usd(Decimal(g['cost_usd']))}, stream "
             f"{'none' if o.cost_usd is None else usd(o.cost_usd)})" for o, g in metered
             if o.cost_usd is None or abs(Decimal(g["cost_usd"]) - o.cost_usd) >= MICRO]
    if apart:
        text += (" They differ for " + "; ".join(apart) + ": calls the session made with its token outside the CLI, "
                 "or a stream that ended before its result line.")
    unpriced = sorted({m for _, g in metered for m in g.get("unpriced_models", [])})
    if unpriced:
        text += f" The gateway had no price for {', '.join(unpriced)}: those calls are counted in tokens only."
    refused = sum(g.get("refused", 0) for _, g in metered)
    if refused:
        text += f" It refused {refused} request(s) of these sessions (the reasons are in its log)."
    return [text]


def _served_version(plan: Plan, outcomes: list[SessionOutcome]) -> str:
    """The served version the provider exposed, or the model name where it exposed none."""
    served = sorted({m for o in outcomes if o.event is not None for m in o.served_models})
    return ", ".join(served) if served else plan.model


@dataclass
class SessionRecord:
    """One planned session as the transform saw it: its ledger state, and for a captured one
    what the recorder derived from its stream and whether its event is in the transcript."""

    spec: SessionSpec
    status: str  # the ledger's (pending where it has no entry)
    attempt: int
    outcome: SessionOutcome | None = None  # None: not captured, so not transformed
    capture: dict[str, Any] | None = None
    recorded: bool = False  # its event is in its arm's transcript, confirmed as the engine would
    stream: str | None = None  # the key of its attempt's stream, once the ledger has its outcome


@dataclass
class Transformed:
    """What a transform of the campaign makes, before anything is written."""

    report: TransformReport
    sessions: list[SessionRecord]  # every planned session, in the plan's order
    transcripts: dict[str, str]  # arm -> the transcript's text, for the arms whose transcript was confirmed
    read: str  # ledger.sessions_digest of the ledger as this transform read it


def transform_campaign(store: Store, plan: Plan, progress: Callable[[int, int], None] | None = None,
                       workers: int = 1, parallel_min_bytes: int = 0) -> Transformed:
    """The transform as a reading of the store: ``run_transform`` writes what it makes, and
    ``probe-runner report`` shows it, so both count sessions the same way. The captured
    sessions' streams are parsed by up to ``workers`` processes once they hold
    ``parallel_min_bytes`` (``_outcomes``); ``progress(done, total)`` is called as each is."""
    ledger = Ledger(store, plan.campaign)
    states = ledger.sessions()
    identifiers = load_identifiers(store, plan.campaign)
    report = TransformReport()
    records: list[SessionRecord] = []
    why: dict[int, str] = {}  # record index -> why it is not recorded
    to_parse: list[tuple[SessionRecord, layout.SessionKeys, int]] = []
    for spec in plan.sessions():
        st = states.get(spec.key)
        status = st.status if st else "pending"
        written = (st.detail.get("stream") or {}) if st else {}
        record = SessionRecord(spec, status, st.attempt if st else 0, stream=written.get("key"))
        # A session the time limit ended was watched until then: recorded with what it showed.
        if st is None or (status != "succeeded" and not (status == "failed" and st.detail.get("timed_out"))):
            why[len(records)] = f"not recorded: {_not_recorded(status, st)}"
        else:
            to_parse.append((record, layout.SessionKeys(plan.campaign, spec.probe, spec.name, st.attempt),
                             int(written.get("bytes") or 0)))
        records.append(record)
    parsed = _outcomes(store, plan, identifiers, [(keys, size) for _, keys, size in to_parse], workers, parallel_min_bytes,
                       progress)
    for (record, _, _), (outcome, capture) in zip(to_parse, parsed, strict=True):
        record.outcome, record.capture = outcome, capture
    for i, record in enumerate(records):  # the refusals in the plan's order, however the streams were parsed
        spec = record.spec
        if i in why:
            report.refusals.append({"scope": "session", "probe": spec.probe, "session": spec.name,
                                    "arm": spec.arm, "status": record.status, "reason": why[i]})
        for reason in record.outcome.refusals if record.outcome else []:
            report.refusals.append({"scope": "session", "probe": spec.probe, "session": spec.name,
                                    "arm": spec.arm, "status": "refused", "reason": reason})

    transcripts: dict[str, str] = {}
    for arm in (a.value for a in plan.arms):
        items = [r for r in records if r.spec.arm == arm]
        captured = [r for r in items if r.outcome is not None]
        outcomes = [r.outcome for r in captured if r.outcome is not None]
        captures = [r.capture for r in captured if r.capture is not None]
        realized = [realized_cost(o.cost_usd, c.get("gateway")) for o, c in zip(outcomes, captures, strict=True)]
        costs = [c for c in realized if c is not None]
        total = exact_sum(costs)
        report.cost_usd = exact_sum([report.cost_usd, total])
        key = layout.transcript_key(plan.campaign, plan.tier.value, arm)
        if not captured:
            report.arms.append(ArmResult(arm, None, 0, "no session of this arm was captured"))
            continue
        identity = {
            "model": plan.model,
            "served_version": _served_version(plan, outcomes),
            "tree": plan.identity.tree,
            "lock": plan.identity.lock,
            "selection": plan.identity.selection,
            "read_set": plan.identity.read_set,
            "seed": plan.identity.seed,
            "harness": plan.identity.harness,
            "tier": plan.tier.value,
            "arm": arm,
            "at": min(c["started_at"] for c in captures),
            "cost_cents": _cents(total) if costs else None,
        }
        events = [o.event for o in outcomes if o.event is not None]
        transcript = rendered(
            {"title": f"{plan.campaign} {plan.tier.value} {arm}", "campaign": plan.campaign},
            f"Probe transcript: {plan.campaign}, {plan.tier.value} tier, {arm} arm",
            _prose(plan, arm, outcomes, captures, len(items), len(items) - len(captured)),
            identity,
            events,
        )
        result = confirm_rendered(transcript, plan.identity.lock, {p.id for p in plan.probes})
        for d in result.dropped:
            # the intake's {"probe", "session", "reason"}, in its order
            report.refusals.append({"scope": "event", "arm": arm, "status": "dropped", "probe": d["probe"],
                                    "session": d["session"], "reason": d["reason"]})
        if result.refusal:
            reason = result.refusal
            if not costs:  # the contract's words, and the run's: why no cost is known
                reason += (f" (the cost of none of its {len(outcomes)} captured sessions is known: each ended without a result "
                        f"line and no provider gateway metered it)")
            report.refusals.append({"scope": "transcript", "arm": arm, "status": "refused", "transcript": key, "reason": reason})
            report.arms.append(ArmResult(arm, None, 0, reason))
            continue
        kept = {(e["probe"], e["session"]) for e in result.events}
        for r in captured:
            r.recorded = (r.spec.probe, r.spec.name) in kept
        transcripts[arm] = transcript.text
        report.arms.append(ArmResult(arm, key, len(result.events), None))
    return Transformed(report, records, transcripts, sessions_digest(states, [r.spec.key for r in records]))


def run_transform(store: Store, plan: Plan, workers: int = 1, parallel_min_bytes: int = 0) -> TransformReport:
    """Transform the campaign and write what it makes: each confirmed transcript (one the
    intake confirmation refused is deleted), refusals.json, SHA256SUMS over them, and last the
    receipt (layout.transformed_key) that says which reading of the ledger they are of."""
    done = transform_campaign(store, plan, workers=workers, parallel_min_bytes=parallel_min_bytes)
    for arm in done.report.arms:
        if arm.key is not None:
            store.put(arm.key, done.transcripts[arm.arm].encode("utf-8"))
    for r in done.report.refusals:
        if r["scope"] == "transcript":
            store.delete(r["transcript"])
    report = done.report
    refusals: Refusals = {"campaign": plan.campaign, "refusals": report.refusals}
    store.put(layout.refusals_key(plan.campaign), json.dumps(refusals, indent=2).encode() + b"\n")
    prefix, sums = layout.transcripts_prefix(plan.campaign), layout.sums_key(plan.campaign)
    listed = "".join(f"{hashlib.sha256(store.get(k)).hexdigest()}  {k[len(prefix):]}\n"
                     for k in store.list(prefix) if k != sums).encode()
    store.put(sums, listed)
    receipt: TransformedReceipt = {"at": now(), "sessions_sha256": done.read, "sums_sha256": digest.of_bytes(listed)}
    store.put(layout.transformed_key(plan.campaign), json.dumps(receipt, indent=2).encode() + b"\n")
    return report
