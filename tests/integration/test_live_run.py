"""`probe-runner run` on a terminal draws the live board (issue 16, item 1); off a terminal it
prints one line per session, as before. The real CLI and the scripted provider, under a pty."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from terminal import on_a_terminal  # tests/ is on the path (tests/conftest.py)

from runner.demo import CORPUS, PLAN, SCENARIOS


def _run_on(tmp_path, scripted_provider, claude_command, tty: bool) -> tuple[int, str]:
    provider = scripted_provider(json.loads(SCENARIOS.read_text()), api_key="k")
    plan = json.loads(PLAN.read_text())
    plan.update(probes=plan["probes"][:1], arms=["present"], repetitions=2)
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")},
           "RUNNER_STORE": (tmp_path / f"store-{tty}").as_uri(), "RUNNER_LOCAL__WORKDIR": str(tmp_path / "work"),
           "RUNNER_HARNESS__COMMAND": claude_command[0], "RUNNER_PROVIDER__API_KEY": "k",
           "RUNNER_PROVIDER__BASE_URL": provider.base_url, "COLUMNS": "100", "TERM": "xterm"}
    argv = [sys.executable, "-m", "runner", "run", str(tmp_path / "plan.json"), "--corpus", str(CORPUS)]
    if not tty:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
        return done.returncode, done.stderr
    code, drawn = on_a_terminal(argv, env)
    watched = on_a_terminal([sys.executable, "-m", "runner", "status", "demo", "--watch"], env)
    return code, drawn + "\n--- status --watch ---\n" + watched[1]


def test_on_a_terminal_run_draws_the_board(tmp_path, scripted_provider, claude_command):
    code, drawn = _run_on(tmp_path, scripted_provider, claude_command, tty=True)
    assert code == 0, drawn
    flat = " ".join(drawn.split())
    assert "campaign demo: 2/2 done" in flat and "│ present │ 2 │ 0 │ 0 │" in flat, flat[-2000:]
    assert "every session has ended" in flat and "cost so far $0.0288" in flat, flat[-2000:]
    assert "[1/2]" not in drawn  # not the plain lines
    watched = " ".join(drawn.split("--- status --watch ---")[1].split())  # status --watch draws the same board
    assert "campaign demo: 2/2 done" in watched and "every session has ended" in watched, watched


def test_off_a_terminal_run_prints_a_line_per_session(tmp_path, scripted_provider, claude_command):
    code, said = _run_on(tmp_path, scripted_provider, claude_command, tty=False)
    assert code == 0, said
    assert "[1/2] HW-PRB-0007 present-00" in said and "[2/2] HW-PRB-0007 present-00" in said
    assert "\x1b[" not in said
