"""What every executor must do, as the campaign relies on it (runner/executors/base.py's
``Executor``): issue 30's "a conformance suite every ... executor must pass, run against each
implementation". A tier runs it against an executor by subclassing ``ExecutorConformance`` with a
``conformant`` fixture yielding a ``Conformant``: the executor (not yet preflighted), a store,
a work directory, and a provider that answers the demo's scenarios (runner/demo/) with the real
CLI behind the executor. Every case drives the executor through the contract's hooks in the
campaign's order (preflight, prepare, run, finish, close) and nothing else."""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from runner import demo, digest, harnesses, layout
from runner.executors.base import CaptureRecord, Executor, Remedies, Slots
from runner.plan import Plan, parse_plan
from runner.seal import seal
from runner.store import NotFound, Store


def demo_plan(campaign: str) -> Plan:
    import json

    data = json.loads(demo.PLAN.read_text())
    data["campaign"] = campaign
    data["repetitions"] = 1
    return parse_plan(data, "plan")


@dataclass
class Conformant:
    executor: Executor
    store: Store
    workdir: Path
    plan: Plan = field(default_factory=lambda: demo_plan("conformance"))


@dataclass
class Ran:
    record: CaptureRecord
    keys: layout.SessionKeys
    started_before_stream: list[bool]  # at each call of started(): whether the stream was not yet stored


def run_attempt(c: Conformant, probe_index: int, arm: str = "present", attempt: int = 1) -> Ran:
    """One session attempt through the contract, as campaign.run_attempt drives it."""
    plan = c.plan
    probe = plan.probes[probe_index]
    spec = next(s for s in plan.sessions() if s.probe == probe.id and s.arm == arm)
    keys = layout.SessionKeys(plan.campaign, spec.probe, spec.name, attempt)
    scratch = c.workdir / plan.campaign / spec.probe / f"{spec.name}.{attempt}"
    scratch.mkdir(parents=True)
    sealed = seal(demo.CORPUS, plan, probe, arm, scratch / "workspace")
    calls: list[bool] = []

    def started() -> None:
        try:
            c.store.get(keys.stream)
            calls.append(False)
        except NotFound:
            calls.append(True)

    async def run() -> CaptureRecord:
        async with Slots(1).take() as slot:
            return await c.executor.run(plan, probe, sealed, scratch, c.store, keys, lambda k, ws: set(), started, slot)

    record = asyncio.run(run())
    c.executor.finish(keys)
    return Ran(record, keys, calls)


class ExecutorConformance:
    @pytest.fixture
    def ready(self, conformant: Conformant):
        """The executor preflighted and prepared for a fresh campaign, closed afterwards."""
        conformant.executor.preflight()
        assert conformant.executor.prepare(conformant.plan, set()) == set()  # a fresh campaign: nothing to adopt
        yield conformant
        conformant.executor.close()
        conformant.executor.close()  # closing twice is harmless

    def test_a_session_returns_a_whole_capture_record_and_its_verified_stream(self, ready):
        ran = run_attempt(ready, 0)
        record = ran.record
        hints = CaptureRecord.__annotations__  # as written: the module's annotations are strings (ForwardRefs here)
        required = {k for k, hint in hints.items() if not getattr(hint, "__forward_arg__", str(hint)).startswith("NotRequired[")}
        assert required and required <= set(record) <= set(hints), (required - set(record), set(record) - set(hints))
        assert record["executor"] == ready.executor.name and record["confinement"] == ready.executor.confinement
        assert ran.started_before_stream == [True]  # journaled once, before anything was stored
        raw = ready.store.get(ran.keys.stream)
        assert record["stream"] == {**record["stream"], "key": ran.keys.stream, "bytes": len(raw),
                                    "sha256": "sha256:" + hashlib.sha256(raw).hexdigest()}
        parsed = harnesses.HARNESS.parse(raw.splitlines(keepends=True), False)
        assert parsed.complete, parsed.problems
        assert record["exit_code"] == 0 and record["timed_out"] is False
        assert record["started_at"] <= record["ended_at"]
        assert (parsed.init or {}).get("cwd") == record["workspace"]  # the paths as the session saw them
        # its phases (runner/phases.py): the harness's milestones in order, none of the campaign's
        phases = record["phases"]
        ran = [phases[m] for m in ("harness_started", "first_reply", "harness_exited", "stream_collected") if m in phases]
        assert len(ran) >= 3 and ran == sorted(ran), phases
        assert not {"queued", "budget_held", "slot_held", "outcome_journaled"} & set(phases), phases

    def test_the_files_a_session_wrote_are_collected(self, ready):
        ran = run_attempt(ready, 1)  # the superseding-decision scenario writes notes/supersession.md
        artifacts = ran.record["artifacts"]
        assert artifacts is not None, ran.record.get("artifacts_not_collected")
        assert "notes/supersession.md" in artifacts["changed"] and "notes/supersession.md" in artifacts["stored"], artifacts
        stored = ready.store.get(ran.keys.artifact("notes/supersession.md"))
        assert artifacts["changed"]["notes/supersession.md"] == digest.of_bytes(stored)
        assert stored == b"HW-DR-0061 supersedes HW-DR-0041: the answer became a set of words.\n"
        assert artifacts["deleted"] == []

    def test_remedies_speak_of_the_campaign(self, conformant):
        remedies = conformant.executor.remedies("c-1")
        assert isinstance(remedies, Remedies) and remedies.campaign == "c-1"
        assert remedies.resume("s1", "s2").startswith("`probe-runner ledger resume c-1 s1 s2")
        assert remedies.again and remedies.fix_key

    def test_nothing_halts_a_confined_run(self, ready):
        assert ready.executor.halted() is None
        run_attempt(ready, 0)
        assert ready.executor.halted() is None

    def test_a_second_attempt_keeps_its_own_stream(self, ready):
        first, second = run_attempt(ready, 0), run_attempt(ready, 0, attempt=2)
        assert first.keys.stream != second.keys.stream
        assert {first.record["stream"]["key"], second.record["stream"]["key"]} == {first.keys.stream, second.keys.stream}
        assert ready.store.get(first.keys.stream) and ready.store.get(second.keys.stream)
