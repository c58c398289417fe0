"""Where a session's time goes (issue 31, item 2): its milestones in their order, the phases
between them, and what a campaign's sessions make of them (pure; the standard library alone,
so the pod's capture reader uses ``FirstReply`` too).

A session's milestones (the capture record's ``phases``, executors.base.Phases) are
timestamps, each taken by the process that saw it (its docstring there says which). A *phase*
is named after the milestone that ends it and lasts from the milestone before it that the
session has to it: a milestone an executor cannot see (the local executor has no pod) is
absent, and its time falls to the next phase, never to a made-up stamp. Stamps come from the
controller's clock and, for a pod's harness and reader, from the node's: a phase across the two
is as exact as the clocks agree, and a negative one (the node's clock behind) is kept as
measured.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

# The milestones in the order a session reaches them; each names the phase that ends with it.
ORDER = (
    "queued",               # the run took the session up (not a phase's end: where its time starts)
    "budget_held",          # waiting for the budget: its reservation fits
    "slot_held",            # waiting for a slot (and a throttle pause)
    "pod_created",          # intent journaled, workspace sealed, the pod created
    "scheduled",            # the scheduler placed the pod
    "sandbox_ready",        # the kubelet made its sandbox and network
    "image_pulled",         # the first container's image pulled and the container made
    "containers_started",   # every container started
    "workspace_delivered",  # the sealed workspace unpacked in the pod
    "harness_started",      # the CLI started (after the confinement checks and the policy wait)
    "first_reply",          # the CLI wrote its first line after its init line: the model's first message
    "harness_exited",       # the session ran to the end of its stream
    "stream_collected",     # the stream stored, verified
    "artifacts_collected",  # the files it left stored, the gateway's meter read
    "outcome_journaled",    # the outcome in the ledger
)
PHASES = ORDER[1:]
PERCENTILES = (50, 95, 99)


def seconds_between(start: str, end: str) -> float:
    """``end`` - ``start`` in seconds, both stamps as runner.clock.now() writes them."""
    a, b = (datetime.fromisoformat(s.replace("Z", "+00:00")) for s in (start, end))
    return round((b - a).total_seconds(), 3)


def durations(milestones: Mapping[str, object]) -> dict[str, float]:
    """Each phase a session's milestones bound, in ORDER: from the milestone before it that
    is there to its own (a milestone that is not there ends no phase)."""
    out: dict[str, float] = {}
    last: str | None = None
    for name in ORDER:
        at = milestones.get(name)
        if not isinstance(at, str):
            continue
        if last is not None:
            out[name] = seconds_between(last, at)
        last = at
    return out


def percentile(values: list[float], p: float) -> float:
    """The ``p``-th percentile by the nearest rank (a value that was measured, never one
    interpolated between two sessions)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


@dataclass(frozen=True)
class PhaseStats:
    """One phase over a campaign's sessions: how many reached it, and its percentiles in seconds."""

    sessions: int
    p50: float
    p95: float
    p99: float


@dataclass(frozen=True)
class Slow:
    """One of the slowest sessions: from its first milestone to its last, and the phase that
    took it longest."""

    session: str
    seconds: float
    phase: str
    phase_seconds: float


@dataclass(frozen=True)
class PhaseSummary:
    """A campaign's phases: per phase in ORDER (those some session reached), and its slowest sessions."""

    phases: dict[str, PhaseStats]
    slowest: list[Slow]


def summary(sessions: Mapping[str, Mapping[str, object]], slowest: int = 5) -> PhaseSummary:
    """p50/p95/p99 per phase over ``sessions`` (session key -> its milestones) and the
    ``slowest`` sessions by their whole time, each with its longest phase."""
    each = {key: durations(m) for key, m in sessions.items()}
    stats = {}
    for phase in PHASES:
        values = [d[phase] for d in each.values() if phase in d]
        if values:
            stats[phase] = PhaseStats(len(values), *(percentile(values, p) for p in PERCENTILES))
    ranked = []
    for key, d in each.items():
        if d:
            longest = max(d, key=lambda p: d[p])
            ranked.append(Slow(key, round(sum(d.values()), 3), longest, d[longest]))
    ranked.sort(key=lambda s: (-s.seconds, s.session))
    return PhaseSummary(stats, ranked[:slowest])


class FirstReply:
    """Watches a stream go by for its first byte after its first line: the CLI writes its init
    line as it starts and its next line once it holds the model's first whole message (the
    runner asks for no partial messages), so that byte is when the provider's first answer
    reached the CLI and the CLI wrote it, not the provider's first byte on the wire."""

    def __init__(self) -> None:
        self.past_first_line = False
        self.seen = False

    def saw(self, chunk: bytes) -> bool:
        """Whether ``chunk``, the next bytes of the stream, holds that first byte."""
        if self.seen or not chunk:
            return False
        if not self.past_first_line:
            end = chunk.find(b"\n")
            if end < 0:
                return False
            self.past_first_line = True
            chunk = chunk[end + 1:]
        self.seen = bool(chunk)
        return self.seen
