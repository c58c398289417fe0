"""The five confirmations ``headwater probe record`` makes, applied before a transcript is
written, so that what lands in the bucket is what the engine will accept.

1. The taxonomy: the lock the transcript names is the lock of the tree the campaign ran over
   (the plan's; the engine repeats this against its own tree).
2. The identity is complete: all twelve keys, none empty.
3. Membership: every event names a probe of the plan; an event that does not is dropped with
   a reason, and the rest stand.
4. No prose: every key of every block is a member of its closed set.
5. A realized cost: ``cost_cents`` is a whole number of cents.

A failure of 1, 2, 4 or 5 refuses the whole file; 3 drops single events.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runner.digest import is_digest
from runner.transform.transcript import CALL_KEYS, EVENT_KEYS, PRODUCED_KEYS, RUN_IDENTITY_KEYS, ParsedTranscript, Rendered, TranscriptError, parse, reread


@dataclass
class IntakeResult:
    refusal: str | None  # the confirmation that refused the whole file, and why
    dropped: list[dict[str, Any]] = field(default_factory=list)  # {"probe", "session", "reason"}
    events: list[dict[str, Any]] = field(default_factory=list)


def _closed(obj: object, allowed: tuple[str, ...], where: str) -> str | None:
    """Why ``obj`` is not a mapping holding only its closed key set, or None."""
    if not isinstance(obj, dict):
        return f"{where} is not a mapping"
    extra = sorted(str(k) for k in obj if k not in allowed)
    if extra:
        return f"{where} carries key(s) outside its closed set: {', '.join(extra)}"
    return None


def _check_prose(identity: dict[str, Any], events: list[Any]) -> str | None:
    problem = _closed(identity, RUN_IDENTITY_KEYS, "run identity")
    if problem:
        return problem
    for i, event in enumerate(events):
        problem = _closed(event, EVENT_KEYS, f"event {i}")
        if problem:
            return problem
        for name, allowed in (("calls", CALL_KEYS), ("produced", PRODUCED_KEYS)):
            if name not in event:
                continue
            items = event[name]
            if not isinstance(items, list):
                return f"event {i}: {name} is not a list"
            for j, item in enumerate(items):
                problem = _closed(item, allowed, f"event {i}: {name}[{j}]")
                if problem:
                    return problem
        if "answer" in event and event["answer"] is not None and not isinstance(event["answer"], str):
            return f"event {i}: answer is neither a string nor null"
    return None


def confirm_parsed(t: ParsedTranscript, plan_lock: str, probe_ids: set[str]) -> IntakeResult:
    identity, events = t.identity, t.events
    if not isinstance(identity, dict):
        return IntakeResult(refusal="identity: the run identity block is not a mapping")
    if not isinstance(events, list):
        return IntakeResult(refusal="no prose: the events block is not a list")
    lock = identity.get("lock")
    if not is_digest(lock) or lock != plan_lock:
        return IntakeResult(refusal=f"taxonomy: the transcript names lock {lock!r}, not the lock of the tree ({plan_lock})")
    missing = [k for k in RUN_IDENTITY_KEYS if identity.get(k) in (None, "")]
    if missing:
        return IntakeResult(refusal=f"identity: the run identity lacks {', '.join(missing)}")
    prose = _check_prose(identity, events)
    if prose:
        return IntakeResult(refusal=f"no prose: {prose}")
    cost = identity["cost_cents"]
    if not isinstance(cost, int) or isinstance(cost, bool) or cost < 0:
        return IntakeResult(refusal=f"realized cost: cost_cents is {cost!r}, not a whole number of cents")
    result = IntakeResult(refusal=None)
    for event in events:
        if not isinstance(event.get("probe"), str) or not event.get("probe") or not event.get("session"):
            result.dropped.append({"probe": event.get("probe"), "session": event.get("session"), "reason": "an event must name a probe and a session"})
        elif event["probe"] not in probe_ids:
            result.dropped.append({"probe": event["probe"], "session": event["session"],
                                   "reason": "membership: the probe is not a classified probe of this corpus"})
        else:
            result.events.append(event)
    return result


def confirm(text: str, plan_lock: str, probe_ids: set[str]) -> IntakeResult:
    """The confirmations of a transcript file, read as the engine reads it."""
    return _confirmed(parse, text, plan_lock, probe_ids)


def confirm_rendered(r: Rendered, plan_lock: str, probe_ids: set[str]) -> IntakeResult:
    """The confirmations of a transcript ``render`` just wrote, without reading again the blocks
    the dump vouches for (transcript.reread): the same verdict as ``confirm`` of its text."""
    return _confirmed(reread, r, plan_lock, probe_ids)


def _confirmed(read: Callable[..., Any], source: object, plan_lock: str, probe_ids: set[str]) -> IntakeResult:
    try:
        parsed = read(source)
    except TranscriptError as e:
        return IntakeResult(refusal=f"format: {e}")
    return confirm_parsed(parsed, plan_lock, probe_ids)
