"""A campaign at a glance, from its ledger and stored streams: sessions by state, the cost the
captured streams state, the refusals, whether its transcripts are ready to pull. Read by
``probe-runner status`` (and its --watch), with where the captured sessions' time went
(runner/phases.py), as one typed record (``CampaignStatus``) whose
``as_json`` is what ``status --json`` prints."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from typing import Any, TypedDict

from runner import digest, harnesses, layout
from runner.budget import books
from runner.executors.base import Phases, WaitingRecord, WaitReason
from runner.ledger import Ledger, SessionState, sessions_digest
from runner.phases import PhaseSummary, summary
from runner.plan import Plan
from runner.store import NotFound, Store

FINAL = ("succeeded", "failed", "refused", "interrupted", "cancelled")  # states no run changes by itself


class ArmCounts(TypedDict):
    """One arm's sessions: ended, running, not started yet."""

    done: int
    running: int
    waiting: int


@dataclass(frozen=True)
class BudgetStatus:
    """The budget's books as status shows them, amounts as decimal strings (None: no budget, so nothing is left)."""

    campaign_usd: str | None
    spent_usd: str
    reserved_usd: str
    left_usd: str | None


@dataclass(frozen=True)
class Transcripts:
    """Whether the transcripts are ready to pull, and when the last transform ended (None: none has)."""

    ready: bool
    written_at: str | None


@dataclass(frozen=True)
class Stopped:
    """Why the last run stopped with sessions left that no retry of it starts, the exit status
    it ended with, and when (layout.stopped_key)."""

    why: str
    exit: int
    at: str


@dataclass(frozen=True)
class CampaignStatus:
    """A campaign at one moment (field order is ``status --json``'s key order)."""

    campaign: str
    total: int                           # sessions planned
    final: int                           # of them, in a state no run changes by itself (FINAL)
    sessions: dict[str, int]             # state -> sessions in it ("pending": none journaled)
    arms: dict[str, ArmCounts]
    running: dict[str, str]              # session key -> when its attempt started ("" when not journaled)
    cost_usd: str                        # as the captured streams state it, a decimal string
    budget: BudgetStatus
    refusals: list[dict[str, Any]]       # refusals.json's, or the sessions refused so far
    waiting: dict[str, WaitReason]       # session key -> why it waits to start (budget, slot, throttle pause, pod), and in which phase
    transcripts: Transcripts
    stopped: Stopped | None
    phases: PhaseSummary = field(default_factory=lambda: PhaseSummary({}, []))  # per phase over the captured sessions

    def as_json(self) -> dict[str, Any]:
        """The record as ``status --json`` prints it."""
        return asdict(self)


def campaign_status(store: Store, plan: Plan, costs: dict[str, Decimal | None],
                    budget: Decimal | None = None, captured: dict[str, Phases] | None = None) -> CampaignStatus:
    """Sessions by state, the cost stated by the streams captured so far, the budget's books
    (spent, reserved and, against ``budget`` or else the one the last start was journaled
    under, left), and the refusals (refusals.json once the transform wrote it, else the
    sessions refused so far), the transcripts (``_transcripts``) and why the last run stopped
    (``_stopped``), and the captured sessions' phases (``_phases``). ``costs`` caches each
    stream's cost by key, ``captured`` each capture record's phases: neither ever changes."""
    ledger = Ledger(store, plan.campaign)
    states = ledger.sessions()
    counts: dict[str, int] = {}
    arms: dict[str, ArmCounts] = {arm.value: {"done": 0, "running": 0, "waiting": 0} for arm in plan.arms}
    running: dict[str, str] = {}
    for spec in plan.sessions():
        st = states.get(spec.key)
        status = st.status if st else "pending"
        counts[status] = counts.get(status, 0) + 1
        counted = arms[spec.arm]
        if status in FINAL:
            counted["done"] += 1
        elif status == "started":
            counted["running"] += 1
        else:
            counted["waiting"] += 1
        if st is not None and status == "started":
            start = ledger.entry("start", spec.key, st.attempt)
            running[spec.key] = start["at"] if start else ""
    b = books(ledger)
    limit = budget if budget is not None else b.budget
    left = b.left(limit)
    money = BudgetStatus(None if limit is None else str(limit), str(b.spent), str(b.reserved), None if left is None else str(left))
    for st in states.values():
        key = (st.detail.get("stream") or {}).get("key") if st.outcome else None
        if key and key not in costs:
            costs[key] = harnesses.HARNESS.parse(store.iter_lines(key), False).cost_usd
    cost = sum((c for c in costs.values() if c is not None), Decimal(0))
    if (written := _read(store, layout.refusals_key(plan.campaign))) is not None:
        refusals = json.loads(written)["refusals"]
    else:
        refusals = [{"scope": "session", "session": s.key, "reason": s.detail.get("reason", "")}
                    for s in states.values() if s.status == "refused"]
    total = sum(counts.values())
    read = sessions_digest(states, [spec.key for spec in plan.sessions()])
    return CampaignStatus(plan.campaign, total, sum(counts.get(k, 0) for k in FINAL), counts, arms, running, str(cost),
                          money, refusals, _waiting(store, plan, states), _transcripts(store, plan, read),
                          _stopped(store, plan, read), _phases(store, plan, ledger, states, {} if captured is None else captured))


def _phases(store: Store, plan: Plan, ledger: Ledger, states: dict[str, SessionState],
            captured: dict[str, Phases]) -> PhaseSummary:
    """The phases of the sessions whose outcome names a stored stream (their capture record's
    milestones, and outcome_journaled from the outcome entry's ``at``); ``captured`` caches
    each record's by key."""
    sessions: dict[str, Phases] = {}
    for spec in plan.sessions():
        st = states.get(spec.key)
        if st is None or not st.outcome or not st.detail.get("stream"):
            continue
        key = layout.SessionKeys(plan.campaign, spec.probe, spec.name, st.attempt).capture
        if key not in captured:
            written = _read(store, key)
            captured[key] = json.loads(written).get("phases", {}) if written is not None else {}
        entry = ledger.entry("outcome", spec.key, st.attempt)
        sessions[spec.key] = {**captured[key], **({"outcome_journaled": entry["at"]} if entry and "at" in entry else {})}
    return summary(sessions)


def _stopped(store: Store, plan: Plan, read: str) -> Stopped | None:
    """Why the last run stopped with sessions left that no retry of it starts (its words and
    exit status, layout.stopped_key), while the ledger is as that run left it and no run began
    or was submitted after it (layout.run_key: the remedy of a stop is a new run, which
    supersedes it before it journals anything); None otherwise."""
    if (written := _read(store, layout.stopped_key(plan.campaign))) is None:
        return None
    record = json.loads(written)
    if record["sessions_sha256"] != read:
        return None
    if (began := _read(store, layout.run_key(plan.campaign))) is not None and json.loads(began)["at"] > record["at"]:
        return None
    return Stopped(record["why"], record["exit"], record["at"])


def _transcripts(store: Store, plan: Plan, read: str) -> Transcripts:
    """Whether the transcripts are ready to pull: the transform's receipt names the ledger as it
    is now and the SHA256SUMS stored now. Not ready while a transform is writing (sessions end
    in the ledger before the controller's transform writes), or once the ledger moved on after
    it (a session cancelled or resumed since). ``read``: ledger.sessions_digest of the ledger
    now. ``written_at``: when the last transform ended."""
    if (written := _read(store, layout.transformed_key(plan.campaign))) is None:
        return Transcripts(False, None)
    receipt = json.loads(written)
    ready = (receipt["sessions_sha256"] == read
             and (sums := _read(store, layout.sums_key(plan.campaign))) is not None
             and digest.of_bytes(sums) == receipt["sums_sha256"])
    return Transcripts(ready, receipt["at"])


def _waiting(store: Store, plan: Plan, states: dict[str, Any]) -> dict[str, WaitReason]:
    """Why sessions not final yet wait to start (the budget, a slot, a throttle pause, their
    pod), as the campaign's run last recorded it (layout.waiting_key), or each share's run
    (runner/share.py: one record each, under layout.waiting_prefix; a share owns its sessions,
    so no two records name one)."""
    recorded: dict[str, WaitReason] = {}
    for key in [layout.waiting_key(plan.campaign), *store.list(layout.waiting_prefix(plan.campaign))]:
        if (written := _read(store, key)) is not None:
            record: WaitingRecord = json.loads(written)
            recorded.update(record.get("sessions") or {})
    return {k: v for k, v in recorded.items() if k not in states or states[k].status not in FINAL}


def _read(store: Store, key: str) -> bytes | None:
    """An object's bytes, or None where there is none: one request per poll of a watch, where
    asking whether it exists first made two."""
    try:
        return store.get(key)
    except NotFound:
        return None
