"""Provider throttling seen in a real stream holds back the next session start.

The real CLI meets a scripted 429 in each session, retries (a ``system/api_retry`` line in
its stdout) and completes; with concurrency 1 the second session may only start after the
campaign's pause, which the ledger's own timestamps show.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from runner import demo
from runner.clock import timestamp
from runner.ledger import Ledger
from runner.store import open_store

SCENARIO = {"scenarios": [{"name": "throttled", "turns": [
    {"error": {"status": 429, "type": "rate_limit_error", "message": "slow down"}, "times": 1},
    {"text": "The decision says so.\ncurrent HW-DR-0052"},
]}]}


def _at(entry: dict) -> float:
    return timestamp(entry["at"])


def _run(campaign: str, repetitions: int, provider, claude_command, tmp_path, **settings: str):
    """``probe-runner run`` of the demo's first probe, present arm, one session at a time, against
    the scripted provider; returns the process and the store's URI."""
    data = json.loads(demo.PLAN.read_text())
    data.update(campaign=campaign, arms=["present"], repetitions=repetitions, probes=data["probes"][:1])
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(data))
    store = (tmp_path / "store").as_uri()
    env = {**os.environ, "RUNNER_STORE": store, "RUNNER_PROVIDER__BASE_URL": provider.base_url,
           "RUNNER_PROVIDER__API_KEY": "k", "RUNNER_HARNESS__COMMAND": claude_command[0],
           "RUNNER_LOCAL__WORKDIR": str(tmp_path / "work"), **settings}
    proc = subprocess.run([sys.executable, "-m", "runner", "run", str(plan), "--corpus", str(demo.CORPUS),
                           "--concurrency", "1"], env=env, capture_output=True, text=True, timeout=180)
    return proc, store


def test_throttled_session_pauses_the_next_start(scripted_provider, claude_command, tmp_path):
    proc, store = _run("throttle", 2, scripted_provider(SCENARIO), claude_command, tmp_path, RUNNER_THROTTLE__BASE_SECONDS="3")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "provider throttling in HW-PRB-0007/present-001 (1 retries): new sessions wait 3 s" in proc.stderr, proc.stderr
    ledger = Ledger(open_store(store), "throttle")
    first_done = next(e for e in ledger.entries if e["type"] == "outcome" and e["session"] == "HW-PRB-0007/present-001")
    second_intent = next(e for e in ledger.entries if e["type"] == "intent" and e["session"] == "HW-PRB-0007/present-002")
    assert first_done["status"] == "succeeded"
    assert _at(second_intent) - _at(first_done) >= 2.9
    assert {s.status for s in ledger.sessions().values()} == {"succeeded"}


REFUSED = {"scenarios": [{"name": "refused", "turns": [
    {"error": {"status": 401, "type": "authentication_error", "message": "invalid x-api-key"}, "times": 99},
]}]}


def test_refused_credentials_stop_new_session_starts(scripted_provider, claude_command, tmp_path):
    """A provider that refuses the key refuses every session: the first one says so in its
    stream (the CLI retries the 401 as it retries throttling), it is recorded as failed so that
    it can be resumed, and no other session is started (nothing journaled, nothing spent)."""
    provider = scripted_provider(REFUSED)
    proc, store = _run("refused", 3, provider, claude_command, tmp_path,  # one retry, not ten over 3 min:
                       RUNNER_HARNESS__ENV=json.dumps({"CLAUDE_CODE_MAX_RETRIES": "1"}))
    assert proc.returncode == 2, proc.stderr + proc.stdout  # a setting to fix: a controller Job fails at once
    assert "halted: the provider refused the key with HTTP 401 in an earlier session" in proc.stderr
    assert "the provider refused the key with HTTP 401 in HW-PRB-0007/present-001: no further session is started" in proc.stderr
    assert proc.stderr.count("not started (the provider refused the key with HTTP 401 in an earlier session)") == 2, proc.stderr
    assert "not started: 2 session(s)" in proc.stderr and "Traceback" not in proc.stderr
    ledger = Ledger(open_store(store), "refused")
    states = ledger.sessions()
    assert set(states) == {"HW-PRB-0007/present-001"}  # the others were never journaled
    assert states["HW-PRB-0007/present-001"].status == "failed"
    outcome = next(e for e in ledger.entries if e["type"] == "outcome")
    assert outcome["detail"]["reason"] == "the provider refused the key with HTTP 401"
    assert len(provider.main_loop_requests()) == 2  # the first session's call and its one retry, nothing else


def test_a_key_without_the_permission_halts_at_once(scripted_provider, claude_command, tmp_path):
    """403 (a key the provider knows but that may not call the Messages API) is refused as 401 is,
    and the CLI does not retry it: the first session fails at once and halts the starts. The
    halt names the session to resume."""
    provider = scripted_provider(SCENARIO, api_key="the-right-key", refusal_status=403)
    proc, store = _run("forbidden", 3, provider, claude_command, tmp_path)  # the gateway holds "k"
    assert proc.returncode == 2, proc.stderr + proc.stdout
    assert "the provider refused the key with HTTP 403 in HW-PRB-0007/present-001" in proc.stderr, proc.stderr
    assert ("fix the provider's key, then `probe-runner ledger resume forbidden HW-PRB-0007/present-001 --corpus DIR` "
            "runs again the sessions that failed on it and starts those not started") in proc.stderr, proc.stderr
    states = Ledger(open_store(store), "forbidden").sessions()
    assert {k: s.status for k, s in states.items()} == {"HW-PRB-0007/present-001": "failed"}
    calls = [r for r in provider.requests if r["path"].split("?")[0] == "/v1/messages"]
    assert [r["status"] for r in calls] == [403], calls  # not retried
