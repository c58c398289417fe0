"""What ``probe-runner report`` shows, as plain data: the campaign's sessions as the transform
counts them (``transform_campaign``, the same reading ``run_transform`` writes from), the
ledger's books, and a link to each transcript and stream. Nothing here grades: answers are
counted per declared answer, as the recorder derived them, and no expectation is read.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime
from decimal import Decimal
from typing import Any

from runner import layout
from runner.budget import books
from runner.ledger import Ledger
from runner.phases import summary
from runner.plan import Plan
from runner.store import NotFound, Store
from runner.transform.run import SessionRecord, Transformed, exact_sum, transform_campaign

# A session's outcome in the report, in the order the page shows them.
OUTCOMES = ("recorded", "refused", "failed", "interrupted", "cancelled", "running", "not started")
NO_ANSWER = "no declared answer"  # an event whose answer is null
NOT_RECORDED = "not recorded"  # no event: refused, failed, not run yet
RECORDER_REFUSED = ("refused", "dropped")  # refusals.json statuses the recorder or the intake gave


def outcome_of(r: SessionRecord) -> str:
    """``recorded``: its event is in its arm's confirmed transcript; ``refused``: captured but
    refused (by the recorder, or by the intake confirmation), or refused before it ran;
    otherwise the ledger's state, ``running`` for a started attempt and ``not started`` for one
    journaled or not yet planned into the ledger."""
    if r.recorded:
        return "recorded"
    if r.outcome is not None or r.status == "refused":
        return "refused"
    return {"started": "running", "intended": "not started", "pending": "not started"}.get(r.status, r.status)


def _seconds(capture: dict[str, Any] | None) -> float | None:
    """The harness's wall time, from the capture record."""
    if not capture or not capture.get("started_at") or not capture.get("ended_at"):
        return None
    start, end = (datetime.fromisoformat(capture[k].replace("Z", "+00:00")) for k in ("started_at", "ended_at"))
    return round((end - start).total_seconds(), 3)


def _session(r: SessionRecord, link: Callable[[str], str], transcripts: dict[str, str]) -> dict[str, Any]:
    o = r.outcome
    return {
        "probe": r.spec.probe,
        "session": r.spec.name,
        "arm": r.spec.arm,
        "attempt": r.attempt,
        "outcome": outcome_of(r),
        "status": r.status,
        "answer": o.event.get("answer") if o is not None and o.event is not None and r.recorded else None,
        "cost_usd": None if o is None or o.cost_usd is None else str(o.cost_usd),
        "duration_seconds": _seconds(r.capture),
        "calls": dict(sorted(o.tools.items())) if o else {},
        "outside": list(o.outside_paths) if o else [],
        "stream": link(r.stream) if r.stream else None,
        "transcript": transcripts.get(r.spec.arm) if r.recorded else None,
    }


def _answers(plan: Plan, sessions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per probe, how many sessions of each arm gave each declared answer, gave none of them,
    or have no event."""
    arms = [a.value for a in plan.arms]
    out = []
    for probe in plan.probes:
        rows = {a: dict.fromkeys(arms, 0) for a in [*probe.answers, NO_ANSWER, NOT_RECORDED]}
        for s in sessions:
            if s["probe"] == probe.id:
                row = NOT_RECORDED if s["outcome"] != "recorded" else s["answer"] if s["answer"] is not None else NO_ANSWER
                rows[row][s["arm"]] += 1
        out.append({"probe": probe.id, "title": probe.title, "answers": rows})
    return out


def _by_outcome(sessions: list[dict[str, Any]]) -> dict[str, int]:
    """Sessions counted by outcome, in OUTCOMES' order, the outcomes with none left out."""
    return {k: n for k in OUTCOMES if (n := sum(1 for s in sessions if s["outcome"] == k))}


def _arm(arm: str, sessions: list[dict[str, Any]], transcript: str | None, current: bool | None) -> dict[str, Any]:
    costs = [Decimal(s["cost_usd"]) for s in sessions if s["cost_usd"] is not None]
    times = [s["duration_seconds"] for s in sessions if s["duration_seconds"] is not None]
    return {
        "sessions": len(sessions),
        "outcomes": _by_outcome(sessions),
        "cost_usd": str(exact_sum(costs)),
        "costed": len(costs),
        "mean_cost_usd": str(exact_sum(costs) / len(costs)) if costs else None,
        "median_seconds": statistics.median(times) if times else None,
        "max_seconds": max(times) if times else None,
        "calls": sum(sum(s["calls"].values()) for s in sessions),
        "outside": sum(len(s["outside"]) for s in sessions),
        "transcript": transcript,
        "transcript_current": current,
    }


def campaign_figures(store: Store, plan: Plan, link_seconds: int, progress: Callable[[int, int], None] | None = None,
                     now: str | None = None, workers: int = 1, parallel_min_bytes: int = 0) -> dict[str, Any]:
    """Everything the page shows, as JSON-able data (amounts as decimal strings). Links open
    the store's objects (``Store.link``), presigned for ``link_seconds`` on S3. A transcript is
    ``transcript_current`` when the stored one is what a transform would write now."""
    done: Transformed = transform_campaign(store, plan, progress, workers, parallel_min_bytes)

    def link(key: str) -> str:
        return store.link(key, link_seconds)

    transcripts: dict[str, str] = {}
    current: dict[str, bool | None] = {}
    for arm in done.report.arms:
        key = layout.transcript_key(plan.campaign, plan.tier.value, arm.arm)
        try:
            stored: str | None = store.get(key).decode("utf-8", "replace")
        except NotFound:
            stored = None
        if stored is not None:
            transcripts[arm.arm] = link(key)
        current[arm.arm] = None if stored is None else stored == done.transcripts.get(arm.arm)
    sessions = [_session(r, link, transcripts) for r in done.sessions]
    refusals = [r for r in done.report.refusals if r["status"] in RECORDER_REFUSED]
    not_recorded: dict[str, int] = {}
    for r in done.report.refusals:
        if r["status"] not in RECORDER_REFUSED:
            not_recorded[r["reason"]] = not_recorded.get(r["reason"], 0) + 1
    ledger = Ledger(store, plan.campaign)
    b = books(ledger)
    left = b.left()
    phases = {}  # the captured sessions' milestones, outcome_journaled from the ledger's entry (runner/phases.py)
    for captured in done.sessions:
        if captured.capture and captured.stream:
            entry = ledger.entry("outcome", captured.spec.key, captured.attempt)
            phases[captured.spec.key] = {**(captured.capture.get("phases") or {}),
                                         **({"outcome_journaled": entry["at"]} if entry else {})}
    metered = [r.capture["gateway"] for r in done.sessions if r.capture and "gateway" in r.capture]
    return {
        "campaign": plan.campaign,
        "tier": plan.tier.value,
        "model": plan.model,
        "store": store.uri,
        "generated_at": now or datetime.now().astimezone().isoformat(timespec="seconds"),
        "link_seconds": link_seconds,
        "arms": [a.value for a in plan.arms],
        "probes": len(plan.probes),
        "repetitions": plan.repetitions,
        "planned": len(sessions),
        "outcomes": _by_outcome(sessions),
        "cost_usd": str(done.report.cost_usd),
        "gateway": {"sessions": len(metered), "calls": sum(g["calls"] for g in metered),
                    "cost_usd": str(exact_sum([Decimal(g["cost_usd"]) for g in metered]))} if metered else None,
        "budget": {"campaign_usd": None if b.budget is None else str(b.budget), "spent_usd": str(b.spent),
                   "reserved_usd": str(b.reserved), "left_usd": None if left is None else str(left)},
        "per_arm": {arm: _arm(arm, [s for s in sessions if s["arm"] == arm], transcripts.get(arm), current.get(arm))
                    for arm in (a.value for a in plan.arms)},
        "answers": _answers(plan, sessions),
        "tools": sorted({t for s in sessions for t in s["calls"]}),
        "refusals": refusals,
        "not_recorded": dict(sorted(not_recorded.items(), key=lambda kv: -kv[1])),
        "sessions": sessions,
        "phases": asdict(summary(phases, slowest=10)),
    }
