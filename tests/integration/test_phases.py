"""Start phases, attributed (issue 31, item 2), on this host: `probe-runner run` with the real
Claude Code CLI under the local executor and the scripted provider. Each session's capture
record carries the campaign's and the driver's milestones in order and no pod's (this executor
has none to see); the first reply comes after the provider was first asked; `status` (text and
--json) and the report's figures give each phase's p50/p95/p99 over the sessions, and the
slowest sessions with their longest phase."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from runner import layout
from runner.clock import timestamp
from runner.demo.provider import ScriptedProvider
from runner.ledger import Ledger
from runner.phases import ORDER
from runner.plan import parse_plan
from runner.report.figures import campaign_figures
from runner.store.file import FileStore
from tests.support.campaigns import plan_data, write_corpus
from tests.support.cli import local_settings, probe_runner

LOCAL = ["queued", "budget_held", "slot_held", "harness_started", "first_reply", "harness_exited", "stream_collected",
         "artifacts_collected"]
SCENARIOS = {"scenarios": [{"name": "read", "match": "TASK-READ", "usage": {"input_tokens": 1000, "output_tokens": 50}, "turns": [
    {"tool_uses": [{"name": "Read", "input": {"file_path": "{cwd}/docs/a.md"}}]},
    {"text": "The file states it.\nHW-DR-0052 current."}]}]}


class TimedProvider(ScriptedProvider):
    """The scripted provider, noting when (this host's clock) each main-loop request arrived."""

    def __init__(self, scenarios: dict[str, Any]) -> None:
        super().__init__(scenarios)
        self.asked: list[float] = []

    def _record(self, rec: dict[str, Any]) -> None:
        if rec.get("kind") == "main":
            self.asked.append(time.time())
        super()._record(rec)


@pytest.fixture(scope="module")
def campaign(tmp_path_factory, claude_command):
    root = tmp_path_factory.mktemp("phases")
    probes = [{"id": f"HW-PRB-000{i}", "path": f"docs/probes/HW-PRB-000{i}.md", "title": f"Probe {i}",
               "task": "TASK-READ: state the status.", "answers": ["current HW-DR-0052"], "examines": ["docs/a.md"]}
              for i in (1, 2)]
    corpus = write_corpus(root / "corpus", probes)
    plan = plan_data("phases-1", probes)
    (root / "plan.json").write_text(json.dumps(plan))
    env = local_settings(root, claude_command[0])
    with TimedProvider(SCENARIOS) as provider:
        env["RUNNER_PROVIDER__BASE_URL"] = provider.base_url
        ran = probe_runner("run", str(root / "plan.json"), "--corpus", str(corpus), "--concurrency", "2",
                           "--budget-usd", "20", "--session-budget-usd", "1", env=env, timeout=600)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    return {"env": env, "store": FileStore(root / "store"), "plan": parse_plan(plan), "asked": provider.asked}


def captures(campaign) -> dict[str, dict]:
    store, plan = campaign["store"], campaign["plan"]
    return {spec.key: json.loads(store.get(layout.SessionKeys(plan.campaign, spec.probe, spec.name, 1).capture))
            for spec in plan.sessions()}


def test_each_capture_record_has_the_local_milestones_in_order(campaign):
    ledger = Ledger(campaign["store"], campaign["plan"].campaign)
    records = captures(campaign)
    assert len(records) == 4
    for key, record in records.items():
        phases = record["phases"]
        assert list(sorted(phases, key=ORDER.index)) == LOCAL, key  # the campaign's and the driver's; no pod's
        stamps = [phases[m] for m in LOCAL]
        assert stamps == sorted(stamps), (key, phases)
        assert all(datetime.fromisoformat(s.replace("Z", "+00:00")).tzinfo == UTC and s.endswith("Z") and len(s) == 24
                   for s in stamps)
        # the record's own times are the harness's: the phases bracket them
        assert phases["slot_held"] <= record["started_at"] <= phases["harness_started"]
        assert phases["stream_collected"] <= record["ended_at"] <= phases["artifacts_collected"]
        # outcome_journaled is the ledger's, after the record was written
        assert phases["artifacts_collected"] <= ledger.entry("outcome", key, 1)["at"]


def test_the_first_reply_comes_after_the_provider_was_asked(campaign):
    """Between the harness's start and its first reply, the CLI asked the provider: the reply is
    the provider's answer reaching the stream, not the CLI's own start."""
    asked = campaign["asked"]
    assert len(asked) >= 8  # two turns per session
    for key, record in captures(campaign).items():
        p = record["phases"]
        started, replied = timestamp(p["harness_started"]), timestamp(p["first_reply"])
        assert any(started <= t <= replied + 0.001 for t in asked), (key, p, asked)


def test_status_gives_each_phases_percentiles_and_the_slowest_sessions(campaign):
    done = probe_runner("status", "phases-1", "--json", env=campaign["env"])
    assert done.returncode == 0, done.stderr
    phases = json.loads(done.stdout)["phases"]
    assert list(phases["phases"]) == LOCAL[1:] + ["outcome_journaled"]
    for name, p in phases["phases"].items():
        assert p["sessions"] == 4 and 0 <= p["p50"] <= p["p95"] <= p["p99"], (name, p)
    slowest = phases["slowest"]
    assert len(slowest) == 4 and {s["session"] for s in slowest} == {spec.key for spec in campaign["plan"].sessions()}
    assert [s["seconds"] for s in slowest] == sorted((s["seconds"] for s in slowest), reverse=True)
    assert all(s["phase"] in phases["phases"] and 0 < s["phase_seconds"] <= s["seconds"] for s in slowest)
    text = probe_runner("status", "phases-1", env=campaign["env"]).stdout
    assert "phases of 4 captured session(s), seconds p50 / p95 / p99:" in text
    assert f"slowest: {slowest[0]['session']} {slowest[0]['seconds']:.3f} s (longest {slowest[0]['phase']}" in text
    for name in phases["phases"]:
        assert f"\n  {name} " in text


def test_the_reports_figures_agree_with_status(campaign):
    f = campaign_figures(campaign["store"], campaign["plan"], 3600)
    status = json.loads(probe_runner("status", "phases-1", "--json", env=campaign["env"]).stdout)["phases"]
    assert f["phases"]["phases"] == status["phases"]
    assert f["phases"]["slowest"] == status["slowest"]  # four sessions: fewer than either shows
