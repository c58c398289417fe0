"""The executor conformance suite (tests/support/executor_conformance.py) against the local
executor (bubblewrap, the real CLI) and the test-only plain executor (tests/support/plainexec.py,
issue 30's third-executor sketch), each behind the scripted provider answering the demo's
scenarios; and a whole campaign through the plain executor, to show that a third executor is a
module through the contract: the campaign, the transform and intake take its sessions as they
take the product's."""

from __future__ import annotations

import json

import pytest

from runner import demo
from runner.campaign import run_sessions
from runner.executors.local import LocalExecutor
from runner.ledger import Ledger
from runner.progress import RunEnded, RunEvent, RunPlanned, SessionEnded, SessionStarted
from runner.settings import Settings
from runner.store import open_store
from runner.transform.run import run_transform
from tests.support.executor_conformance import Conformant, ExecutorConformance, demo_plan
from tests.support.plainexec import PlainExecutor


def _settings(tmp_path, provider, claude_command) -> Settings:
    return Settings(store=(tmp_path / "store").as_uri(), provider={"base_url": provider.base_url, "api_key": "demo-key"},
                    harness={"command": claude_command[0], "timeout_seconds": 120}, local={"workdir": str(tmp_path / "work")})


@pytest.fixture
def provider(scripted_provider):
    return scripted_provider(json.loads(demo.SCENARIOS.read_text()))


class TestLocalExecutor(ExecutorConformance):
    @pytest.fixture
    def conformant(self, tmp_path, provider, claude_command):
        s = _settings(tmp_path, provider, claude_command)
        return Conformant(LocalExecutor(s), open_store(s.store), tmp_path / "work")


class TestPlainExecutor(ExecutorConformance):
    @pytest.fixture
    def conformant(self, tmp_path, provider, claude_command):
        s = _settings(tmp_path, provider, claude_command)
        return Conformant(PlainExecutor(s), open_store(s.store), tmp_path / "work")


def test_a_campaign_runs_through_the_third_executor_to_confirmed_transcripts(tmp_path, provider, claude_command):
    s = _settings(tmp_path, provider, claude_command)
    store, plan = open_store(s.store), demo_plan("plain-campaign")
    executor = PlainExecutor(s)
    events: list[RunEvent] = []
    report = run_sessions(plan, demo.CORPUS, store, executor, tmp_path / "work", 2, [], progress=events.append)
    assert report.stopped() is None and not report.interrupted and len(report.ran) == 4, report
    # the run told its progress as events: planned, each session started and ended, the end
    assert events[0] == RunPlanned(plan.campaign, {"present": 2, "absent": 2}) and events[-1] == RunEnded()
    assert sorted(e.key for e in events if isinstance(e, SessionStarted)) == sorted(s.key for s in plan.sessions())
    assert [e.status for e in events if isinstance(e, SessionEnded)] == ["succeeded"] * 4
    ledger = Ledger(store, plan.campaign)
    assert not ledger.verify()
    assert {s.status for s in ledger.sessions().values()} == {"succeeded"} and len(ledger.sessions()) == 4
    done = run_transform(store, plan)
    assert done.refusals == []
    arms = {a.arm: a for a in done.arms}
    assert set(arms) == {"present", "absent"} and all(a.key is not None and a.events == 2 for a in arms.values()), done
    transcript = store.get(arms["present"].key).decode()
    assert "unconfined: the harness ran as a plain process of the test host" in transcript
