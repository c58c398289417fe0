"""What an operator meets when the gateway refuses what every session of a campaign sends
(issue 43, item 6), through `probe-runner run`, the real CLI and the scripted provider.

Before: a plan the gateway refused had every session run into the same 400, each journaled
``succeeded`` at $0, so `ledger resume` refused to run them again. Now the first session whose
every call the gateway refused for a reason of the campaign's settings is failed with the
gateway's reason, no further session starts, the run stops with a recorded stop that names the
fix (exit 2), and the failed session is resumable once fixed. A campaign whose model cannot run
on the CLI is refused before anything is journaled or spent."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from support.cli import local_settings, probe_runner  # tests/ is on the path (tests/conftest.py)

from runner import layout
from runner.demo import CORPUS, PLAN, SCENARIOS
from runner.ledger import Ledger
from runner.store.file import FileStore

UNCLASSED = "brand-new-2026-12-01"


def _plan(tmp_path: Path, **over) -> Path:
    plan = json.loads(PLAN.read_text())
    plan.update(probes=plan["probes"][:1], arms=["present"], repetitions=3, **over)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return path


@pytest.fixture
def env(tmp_path, scripted_provider, claude_command) -> dict[str, str]:
    provider = scripted_provider(json.loads(SCENARIOS.read_text()))
    return {**os.environ, **local_settings(tmp_path, claude_command[0]), "RUNNER_PROVIDER__BASE_URL": provider.base_url,
            "RUNNER_CONCURRENCY": "1", "RUNNER_HARNESS__ENV": json.dumps({"CLAUDE_CODE_MAX_RETRIES": "1"})}


def test_a_beta_every_session_sends_that_the_gateway_refuses_fails_the_first_and_halts_the_run(tmp_path, env):
    """An operator's harness.env adds ANTHROPIC_BETAS (the CLI sends each): the gateway refuses
    every call of the first session for what every session sends; it is failed with the reason,
    the others are not started, and once fixed `ledger resume` runs it again."""
    env = {**env, "RUNNER_HARNESS__ENV": json.dumps({"CLAUDE_CODE_MAX_RETRIES": "1", "ANTHROPIC_BETAS": UNCLASSED})}
    plan = _plan(tmp_path)
    done = probe_runner("run", str(plan), "--corpus", str(CORPUS), env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"halted: the gateway refused every call of 1 session(s), for what every session of the campaign sends: the beta " \
           f"'{UNCLASSED}' is not qualified" in done.stderr
    assert "docs/operating.md, 'The gateway refused the model's calls'" in done.stderr and "succeeded" not in done.stderr
    store = FileStore(tmp_path / "store")
    campaign = json.loads(plan.read_text())["campaign"]
    states = Ledger(store, campaign).sessions()
    first = states["HW-PRB-0007/present-001"]
    assert first.status == "failed" and first.detail["reason"].startswith(f"the gateway refused every call: the beta '{UNCLASSED}'")
    assert {k: s.status for k, s in states.items() if k != first.key} == {}  # the others were never journaled: not started
    stop = json.loads(store.get(layout.stopped_key(campaign)))
    assert stop["exit"] == 2 and "The gateway refused the model's calls" in stop["why"]
    status = probe_runner("status", campaign, env=env)
    assert status.returncode == 0 and "failed" in status.stdout, status.stdout + status.stderr
    # fixed (the extra beta gone), the failed session is resumed and the rest start
    fixed = {**env, "RUNNER_HARNESS__ENV": json.dumps({"CLAUDE_CODE_MAX_RETRIES": "1"})}
    again = probe_runner("ledger", "resume", campaign, "HW-PRB-0007/present-001", "--corpus", str(CORPUS), env=fixed)
    assert again.returncode == 0, again.stdout + again.stderr
    assert {s.status for s in Ledger(store, campaign).sessions().values()} == {"succeeded"}


def _nothing_journaled_and_a_stop_a_watch_ends_on(tmp_path, env, plan: Path) -> None:
    campaign = json.loads(plan.read_text())["campaign"]
    store = FileStore(tmp_path / "store")
    assert Ledger(store, campaign).sessions() == {}
    watched = probe_runner("status", campaign, "--watch", "--interval", "0.1", env=env, timeout=60)
    assert watched.returncode == 2 and "cannot run" in watched.stdout, watched.stdout + watched.stderr


def test_a_model_the_cli_is_not_qualified_with_is_refused_before_anything_is_journaled(tmp_path, env):
    """"A CLI version or model that is not qualified is refused before the first session with a
    clear message naming the remedy (exit 2, nothing spent)"; the stop is recorded, so a watch
    ends on it with the run's exit."""
    plan = _plan(tmp_path, model="claude-3-7-sonnet")
    done = probe_runner("run", str(plan), "--corpus", str(CORPUS), env=env)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "cannot run: the model claude-3-7-sonnet is not qualified with Claude Code" in done.stderr
    assert "probe-runner harness qualify --cli" in done.stderr and "Traceback" not in done.stderr
    _nothing_journaled_and_a_stop_a_watch_ends_on(tmp_path, env, plan)


def test_a_budgeted_campaign_whose_calls_cannot_fit_is_refused_before_anything_is_spent(tmp_path, env):
    plan = _plan(tmp_path, model="claude-opus-5-5")
    budget = {**env, "RUNNER_BUDGET__SESSION_USD": "1", "RUNNER_BUDGET__CAMPAIGN_USD": "5"}
    done = probe_runner("run", str(plan), "--corpus", str(CORPUS), env=budget)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "one call of claude-opus-5-5 may ask for 128000 output tokens" in done.stderr and "RUNNER_BUDGET__CALL_USD" in done.stderr
    _nothing_journaled_and_a_stop_a_watch_ends_on(tmp_path, budget, plan)
