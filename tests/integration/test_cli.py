"""The CLI as a user meets it: real processes, the real CLI under bwrap, the bundled demo."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import pytest
from support.cli import local_settings, probe_runner  # tests/ is on the path (tests/conftest.py)

from runner.demo import CORPUS, PLAN, SCENARIOS

cli = probe_runner


@pytest.fixture
def env(tmp_path, claude_command):
    return local_settings(tmp_path, claude_command[0])


@pytest.mark.parametrize("command", [[], ["run"], ["demo"], ["status"], ["report"], ["pull"], ["ledger"], ["ledger", "resume"]])
def test_help_explains_itself(command):
    out = cli(*command, "--help")
    assert out.returncode == 0 and out.stdout.startswith("Usage: probe-runner")


def test_a_bad_plan_is_one_line_naming_the_field(tmp_path, env):
    plan = json.loads(PLAN.read_text())
    plan["probes"][1]["id"] = plan["probes"][0]["id"]
    plan["tier"] = "nightly"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    out = cli("run", str(path), "--corpus", str(CORPUS), env=env)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert f"{path}: tier: Input should be 'regression', 'campaign' or 'documentation'" in out.stderr
    path.write_text("{\"campaign\": ")
    out = cli("run", str(path), "--corpus", str(CORPUS), env=env)
    assert out.returncode == 2 and "not valid JSON" in out.stderr and "line 1" in out.stderr


def test_a_missing_corpus_or_store_scheme_is_a_clear_error(tmp_path, env):
    out = cli("run", str(PLAN), "--corpus", str(tmp_path / "nope"), env=env)
    assert out.returncode == 2 and "is not a directory" in out.stderr
    out = cli("status", "demo", "--store", "ftp://x", env=env)
    assert out.returncode == 2 and "file:///absolute/dir or s3://bucket/prefix" in out.stderr


def test_without_bwrap_nothing_runs_and_nothing_is_spent(tmp_path, env, scripted_provider):
    provider = scripted_provider(json.loads(SCENARIOS.read_text()))
    out = cli("run", str(PLAN), "--corpus", str(CORPUS),
              env={**env, "RUNNER_LOCAL__BWRAP": "/nonexistent/bwrap", "RUNNER_PROVIDER__BASE_URL": provider.base_url})
    assert out.returncode == 12, out.stderr
    assert "bubblewrap" in out.stderr and "Traceback" not in out.stderr
    assert provider.main_loop_requests() == []
    ledger = tmp_path / "store/campaigns/demo/ledger"
    assert not ledger.exists() or not any(b'"type":"start"' in p.read_bytes() for p in ledger.iterdir())


def test_run_continues_and_never_repeats_a_session(tmp_path, env, scripted_provider):
    provider = scripted_provider(json.loads(SCENARIOS.read_text()))
    run_env = {**env, "RUNNER_PROVIDER__BASE_URL": provider.base_url}
    first = cli("run", str(PLAN), "--corpus", str(CORPUS), env=run_env)
    assert first.returncode == 0, first.stderr
    assert "[8/8]" in first.stderr and "cost so far" in first.stderr
    requests = len(provider.main_loop_requests())
    second = cli("run", str(PLAN), "--corpus", str(CORPUS), env=run_env)
    assert second.returncode == 0, second.stderr
    assert len(provider.main_loop_requests()) == requests  # nothing ran again
    assert "transcript campaign-present" in second.stdout
    status = cli("status", "demo", "--json", env=env)
    assert json.loads(status.stdout)["sessions"] == {"succeeded": 8}
    # people read the cost to the hundredth of a cent; --json keeps the exact sum of the streams
    exact = Decimal(json.loads(status.stdout)["cost_usd"])
    assert f"realized cost: ${exact:.4f}\n" in second.stdout
    assert f"cost so far: ${exact:.4f} " in cli("status", "demo", env=env).stdout
    verify = cli("ledger", "verify", "demo", env=env)
    assert verify.returncode == 0 and "chain verifies" in verify.stdout
    pulled = cli("pull", "demo", "--dest", str(tmp_path / "out"), env=env)
    assert pulled.returncode == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["campaign-absent.md", "campaign-present.md", "refusals.json"]


def test_status_watch_ends_only_once_the_transcripts_can_be_pulled(tmp_path, env, scripted_provider):
    """A run journals every outcome, then transforms: a watch that ended at the last outcome let
    a pull right after it find no SHA256SUMS (the controller Job's transform was still writing)."""
    provider = scripted_provider(json.loads(SCENARIOS.read_text()))
    plan = json.loads(PLAN.read_text())
    plan.update(probes=plan["probes"][:1], arms=["present"], repetitions=1)
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    ran = cli("run", str(tmp_path / "plan.json"), "--corpus", str(CORPUS), env={**env, "RUNNER_PROVIDER__BASE_URL": provider.base_url})
    assert ran.returncode == 0, ran.stderr
    stored = tmp_path / "store/campaigns/demo"

    # The moment between the last outcome and the end of the transform: no receipt, no sums.
    (stored / "transformed.json").unlink(missing_ok=True)
    (stored / "transcripts/SHA256SUMS").unlink()
    watch = subprocess.Popen([sys.executable, "-m", "runner", "status", "demo", "--watch", "--interval", "0.1"],
                             env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(3)
        assert watch.poll() is None, watch.communicate()  # it waits for the transform
        early = cli("pull", "demo", "--dest", str(tmp_path / "early"), env=env)
        assert early.returncode == 2 and "`probe-runner status demo --watch` waits for it" in early.stderr
        assert cli("transform", "demo", env=env).returncode == 0
        out, err = watch.communicate(timeout=60)
    finally:
        watch.kill()
    assert watch.returncode == 0, err
    bars = [line for line in out.splitlines() if line.startswith("[")]
    assert len(bars) == 2, out
    assert bars[0].startswith("[########################] 1/1 final, 0 running, cost $")
    assert bars[0].endswith(", refusals 0, waiting for the transform to write the transcripts")
    assert bars[1] == bars[0].replace("waiting for the transform to write the transcripts", "transcripts ready")
    assert out.endswith("`probe-runner pull demo --dest DIR` fetches them\n"), out
    assert cli("pull", "demo", "--dest", str(tmp_path / "out"), env=env).returncode == 0

    # The receipt names the sums the transform wrote; status reads it.
    receipt = json.loads((stored / "transformed.json").read_text())
    sums = (stored / "transcripts/SHA256SUMS").read_bytes()
    assert receipt["sums_sha256"] == "sha256:" + hashlib.sha256(sums).hexdigest()
    assert f"transcripts: ready (written {receipt['at']}); `probe-runner pull demo --dest DIR`" in cli("status", "demo", env=env).stdout
    (stored / "transformed.json").unlink()  # as a transform of an earlier version left them
    assert json.loads(cli("status", "demo", "--json", env=env).stdout)["transcripts"] == {"ready": False, "written_at": None}
    assert "`probe-runner transform demo` writes them if no run will" in cli("status", "demo", env=env).stdout


def test_demo_prints_where_the_transcripts_are(tmp_path, env):
    out = cli("demo", env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("transcript ")]
    assert len(lines) == 2
    for ln in lines:
        path = Path(ln.split(": ", 1)[1].split(" (")[0].removeprefix("file://"))
        assert path.read_text().startswith("---\nkind: probe_transcript\n")


def test_a_started_session_is_never_rerun_until_recovered_and_resumed(tmp_path, env, scripted_provider):
    from runner.corpus import store_plan
    from runner.ledger import Ledger
    from runner.plan import load_plan
    from runner.store.file import FileStore

    provider = scripted_provider(json.loads(SCENARIOS.read_text()))
    run_env = {**env, "RUNNER_PROVIDER__BASE_URL": provider.base_url}
    store = FileStore(tmp_path / "store")
    plan = load_plan(PLAN)
    store_plan(store, plan)
    ledger = Ledger(store, "demo")  # a runner died after journaling the start of one session
    ledger.intent("HW-PRB-0007/present-001", 1, {"left": "by a killed runner"})
    ledger.start("HW-PRB-0007/present-001", 1)

    out = cli("run", str(PLAN), "--corpus", str(CORPUS), env=run_env)
    assert out.returncode == 1, out.stderr
    assert "interrupted: HW-PRB-0007/present-001 started and has no outcome" in out.stderr
    assert "[7/7]" in out.stderr  # the other seven ran, that one did not
    assert not (tmp_path / "store/campaigns/demo/sessions/HW-PRB-0007/present-001").exists()

    rec = cli("ledger", "recover", "demo", env=env)
    assert rec.returncode == 0 and "interrupted: HW-PRB-0007/present-001 (attempt 1)" in rec.stdout
    before = len(provider.main_loop_requests())
    again = cli("run", str(PLAN), "--corpus", str(CORPUS), env=run_env)
    assert again.returncode == 12, again.stderr  # listed under refused: not recorded, interrupted
    assert "present-001 (present): not recorded: interrupted: recovered: started with no outcome" in again.stdout
    assert len(provider.main_loop_requests()) == before  # and nothing ran again
    status = json.loads(cli("status", "demo", "--json", env=env).stdout)["sessions"]
    assert status == {"succeeded": 7, "interrupted": 1}

    bad = cli("ledger", "resume", "demo", "HW-PRB-0007/present-001", "--corpus", str(CORPUS), env=run_env)
    assert bad.returncode == 2 and "the plan or corpus changed" in bad.stderr  # the declaration differs

    cancel = cli("ledger", "cancel", "demo", "HW-PRB-0007/present-001", env=env)
    assert cancel.returncode == 0
    status = json.loads(cli("status", "demo", "--json", env=env).stdout)["sessions"]
    assert status == {"succeeded": 7, "cancelled": 1}
    # The transcripts say "interrupted" of it: not ready until a transform reads the cancel.
    assert "transcripts: not ready: the last transform (ended " in cli("status", "demo", env=env).stdout
    assert cli("transform", "demo", env=env).returncode == 12  # the cancelled session is listed, not recorded
    assert "transcripts: ready" in cli("status", "demo", env=env).stdout
    assert cli("ledger", "verify", "demo", env=env).returncode == 0


def test_a_run_refused_before_its_first_session_is_a_stop_a_watch_ends_on(tmp_path, env):
    """Issue 29, item 3: a watch must end where the run did. A run refused before any session
    (the first confinement or key check; here bubblewrap missing) exits at once, and for a
    controller Job that exit is final; before, it recorded no stop, so `status --watch` waited on
    sessions nothing would start, for good. Now the stop is recorded with its words and exit."""
    env = {**env, "RUNNER_LOCAL__BWRAP": str(tmp_path / "no-bwrap")}
    ran = cli("run", str(PLAN), "--corpus", str(CORPUS), env=env)
    assert ran.returncode == 12 and "bubblewrap" in ran.stderr and "Traceback" not in ran.stderr, ran.stderr
    watched = cli("status", "demo", "--watch", "--interval", "0.1", env=env, timeout=60)
    assert watched.returncode == 12, watched.stdout + watched.stderr
    assert "the last run stopped (" in watched.stdout and "is not installed: a session cannot be confined" in watched.stdout
    assert json.loads(cli("status", "demo", "--json", env=env).stdout)["stopped"]["exit"] == 12
