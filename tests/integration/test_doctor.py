"""`probe-runner doctor` (issue 16, item 3): every check holds on this machine with the real
CLI, bwrap and the scripted provider, and each fails once with its own message and exit 1
("doctor's every check failing once with its message")."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from ports import free_port  # released at once: nothing listens there

KEY = "sk-ant-doctor"


@pytest.fixture
def env(tmp_path, scripted_provider, claude_command) -> dict[str, str]:
    provider = scripted_provider({"scenarios": [{"name": "x", "turns": [{"text": "x"}]}]}, api_key=KEY)
    return {**{k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")},
            "RUNNER_STORE": (tmp_path / "store").as_uri(), "RUNNER_LOCAL__WORKDIR": str(tmp_path / "work"),
            "RUNNER_HARNESS__COMMAND": claude_command[0], "RUNNER_PROVIDER__API_KEY": KEY,
            "RUNNER_PROVIDER__BASE_URL": provider.base_url}


def doctor(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runner", "doctor"], env=env, capture_output=True, text=True, timeout=120)


def test_every_check_holds_here(env):
    done = doctor(env)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["ok   confinement", "ok   harness", "ok   store", "ok   provider"]
    assert "a token count, HTTP 200; nothing spent" in lines[3]


def _old_cli(tmp_path) -> str:
    fake = tmp_path / "claude-old"
    fake.write_text("#!/bin/sh\necho '2.0.1 (Claude Code)'\n")
    fake.chmod(0o755)
    return str(fake)


@pytest.mark.parametrize("case, change, says", [
    ("confinement", {"RUNNER_LOCAL__BWRAP": "no-such-bwrap"},
     "FAIL confinement: bubblewrap (no-such-bwrap) is not installed: a session cannot be confined, so none runs"),
    ("harness", "old", "the recorder is qualified with 2.1.197, 2.1.337 (pinned 2.1.337): npm install -g "
                       "@anthropic-ai/claude-code@2.1.337, or qualify it: probe-runner harness qualify --cli"),
    ("store", {"RUNNER_STORE": "file:///proc/doctor/store"}, "FAIL store: store file:///proc/doctor/store is not writable"),
    ("provider refuses", {"RUNNER_PROVIDER__API_KEY": "sk-ant-wrong"}, "refused the key (HTTP 401): check RUNNER_PROVIDER__API_KEY"),
    ("provider unreachable", "closed", "cannot be reached"),
    ("no credentials", {"RUNNER_PROVIDER__API_KEY": None}, "FAIL provider: no credentials: set RUNNER_PROVIDER__API_KEY"),
])
def test_each_check_fails_with_what_to_do(env, tmp_path, case, change, says):
    if change == "old":
        change = {"RUNNER_HARNESS__COMMAND": _old_cli(tmp_path)}
    elif change == "closed":
        change = {"RUNNER_PROVIDER__BASE_URL": f"http://127.0.0.1:{free_port()}"}
    env = {k: v for k, v in {**env, **change}.items() if v is not None}
    done = doctor(env)
    assert done.returncode == 1, done.stdout + done.stderr
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == (2 if case == "harness" else 1), failed  # an old CLI that is a script is no ELF either
    assert any(says in line for line in failed), failed
    assert "Traceback" not in done.stderr and "checks failed: " in done.stderr


def _plan_file(tmp_path, model: str) -> str:
    import json

    from runner.demo import PLAN

    plan = json.loads(PLAN.read_text()) | {"model": model}
    path = tmp_path / f"plan-{model}.json"
    path.write_text(json.dumps(plan))
    return str(path)


def test_the_plans_model_is_checked_as_run_would_check_it(env, tmp_path):
    """Issue 43, item 4: `doctor` reports whether the plan's (CLI version, model) pair is
    qualified, and whether a budget can meter it, before money is spent."""
    from runner import harnesses

    ok = subprocess.run([sys.executable, "-m", "runner", "doctor", "--plan", _plan_file(tmp_path, "claude-opus-4-1")], env=env,
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    (line,) = [line for line in ok.stdout.splitlines() if line.startswith("ok   model:")]
    assert line == (f"ok   model: claude-opus-4-1 is qualified with Claude Code {harnesses.HARNESS.version}, whose requests "
                    "name claude-opus-5-5; metered at $4/$20 per million input/output tokens")
    bad = subprocess.run([sys.executable, "-m", "runner", "doctor", "--plan", _plan_file(tmp_path, "claude-opus-5-5"),
                          "--session-budget-usd", "1"], env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    (line,) = [line for line in bad.stdout.splitlines() if line.startswith("FAIL model:")]
    assert "may ask for 128000 output tokens" in line and "RUNNER_BUDGET__CALL_USD" in line
