"""What the transform makes of the canary checks a capture record carries: a session that ran
while a check failed is refused (it was not confined as stated), and the transcript's prose
states what was measured, not a constant."""

from __future__ import annotations

import json
from pathlib import Path

from runner import layout
from runner.plan import load_plan
from runner.settings import Settings
from runner.store import open_store
from runner.transform import run as transform_run

REPO = Path(__file__).resolve().parents[2]
STREAM = REPO / "tests" / "data" / "claude-code-2.1.197" / "read-write-answer.jsonl"


def _check(number: int, at: str, passed: bool, problem: str | None = None) -> dict:
    return {"check": number, "at": at, "passed": passed, "settled_seconds": 0.4,
            "routes": [{"route": "cluster DNS", "target": "10.96.0.10:53", "opened": not passed, "must_open": False},
                       {"route": "the provider through the egress proxy", "target": "api:443", "opened": True,
                        "must_open": True}],
            **({"problem": problem} if problem else {})}


def _stored_session(tmp_path: Path, checks: list[dict], **capture: object):
    plan = load_plan(REPO / "runner" / "demo" / "plan.json")
    store = open_store((tmp_path / "store").as_uri(), Settings(store=(tmp_path / "store").as_uri()))
    keys = layout.SessionKeys(plan.campaign, plan.probes[0].id, "present-001")
    store.put(keys.stream, STREAM.read_bytes())
    store.put(keys.seal, json.dumps({"manifest": {}}).encode())
    store.put(keys.capture, json.dumps({
        "executor": "kubernetes", "confinement": "pods", "workspace": "/workspace", "config_dir": "/session/config",
        "artifacts": {}, "timed_out": False, "confinement_checks": checks,
        "harness": {"allowed_tools": ["Read", "Write"]}, "started_at": "2026-12-03T10:00:00Z", **capture}).encode())
    return store, plan, keys


def test_a_session_that_ran_while_a_check_failed_is_refused_with_the_check(tmp_path):
    failed = _check(2, "2026-12-03T10:05:00Z", False, "a route opened: cluster DNS (10.96.0.10:53): answered")
    store, plan, keys = _stored_session(tmp_path, [_check(1, "2026-12-03T10:00:00Z", True), failed])
    outcome, _ = transform_run.session_outcome(store, plan, keys, frozenset())
    assert outcome.event is None
    assert outcome.refusals[-1] == ("confinement check 2 at 2026-12-03T10:05:00Z failed while this session ran: "
                                    "a route opened: cluster DNS (10.96.0.10:53): answered")
    # The same session with passing checks is an event (the refusal comes from the check alone).
    store, plan, keys = _stored_session(tmp_path / "b", [_check(1, "2026-12-03T10:00:00Z", True)])
    assert transform_run.session_outcome(store, plan, keys, frozenset())[0].event is not None


def test_the_prose_states_what_was_measured():
    captures = [{"executor": "kubernetes", "confinement_checks": [_check(1, "T1", True), _check(2, "T2", True)]},
                {"executor": "kubernetes", "confinement_checks": [_check(2, "T2", True), _check(3, "T3", True)]}]
    assert transform_run._measured_confinement(captures) == (
        "Confinement was measured, not assumed: 3 canary check(s) from T1 to T3 ran a pod with the session pods' "
        "labels, image and network policies, which tried 2 routes (cluster DNS; the provider through the egress "
        "proxy). In every check each route was closed but the provider through the egress proxy, which answered.")
    off = [{"executor": "kubernetes", "confinement_checks": []}]
    assert "not measured" in transform_run._measured_confinement(off)
    assert transform_run._measured_confinement([{"executor": "local"}]) is None


def test_a_session_whose_harness_was_oom_killed_is_refused_as_such(tmp_path):
    """Before, an OOM-killed harness was one more stream without a proper end; now the refusal
    names the memory limit, which is what an operator raises."""
    store, plan, keys = _stored_session(tmp_path, [_check(1, "2026-12-03T10:00:00Z", True)], oom_killed=True)
    outcome, _ = transform_run.session_outcome(store, plan, keys, frozenset())
    assert outcome.event is None
    assert outcome.refusals[-1] == ("the harness container was killed at its memory limit (OOMKilled): "
                                    "the session did not end on its own")
