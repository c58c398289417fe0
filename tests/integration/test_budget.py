"""A campaign budget that cannot be overrun (issue 15, items 4-6), through `probe-runner run`,
the local executor, the real Claude Code CLI and the scripted provider.

Issue 15: "No session starts whose reservation would take spent + reserved past the campaign
budget. So realized spend <= budget holds by construction ... and a restarted or resumed
campaign keeps the same books." The demo's status-of-0052 scenario answers three times, here each
50,000 input and 80 output tokens of claude-sonnet-4-5, which the CLI prices at $0.1512: a whole
session costs $0.4536. A CLI call may cost up to about $0.70 (its bound at the gateway: a 58 kB
body and 32,000 output tokens), so budget.call_usd is $0.75; with --session-budget-usd 0.5 a
session reserves $1.25.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
from support.cli import local_settings, probe_runner  # tests/ is on the path (tests/conftest.py)
from terminal import on_a_terminal

from runner.budget import books
from runner.demo import CORPUS, PLAN, SCENARIOS
from runner.errors import EXIT_BUDGET
from runner.hooks import STAGES
from runner.ledger import Ledger
from runner.store.file import FileStore

ANSWER_COST = Decimal("0.1512")  # 50,000 input and 80 output tokens at $3 and $15 per million
SESSION_COST = 3 * ANSWER_COST
RESERVATION = Decimal("1.25")    # --session-budget-usd 0.5 + budget.call_usd 0.75


def _plan(tmp_path: Path, repetitions: int) -> Path:
    plan = json.loads(PLAN.read_text())
    plan.update(probes=plan["probes"][:1], arms=["present"], repetitions=repetitions)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return path


@pytest.fixture
def env(tmp_path, scripted_provider, claude_command) -> dict[str, str]:
    scenarios = json.loads(SCENARIOS.read_text())
    for scenario in scenarios["scenarios"]:
        scenario["usage"] = {"input_tokens": 50000, "output_tokens": 80}
    provider = scripted_provider(scenarios)
    return {**os.environ, **local_settings(tmp_path, claude_command[0]), "RUNNER_PROVIDER__BASE_URL": provider.base_url,
            "RUNNER_BUDGET__CALL_USD": "0.75", "RUNNER_BUDGET__SESSION_USD": "0.5"}


def cli(*args: str, env: dict[str, str], kill_at: str | None = None) -> subprocess.CompletedProcess[str]:
    return probe_runner(*args, env=env, kill_at=kill_at)


def _ledger(tmp_path: Path) -> Ledger:
    return Ledger(FileStore(tmp_path / "store"), "demo")


def _usd(amount: Decimal | str) -> Decimal:
    """To the 1e-8 dollar: the CLI's costs are binary floats (0.014400000000000001)."""
    return Decimal(amount).quantize(Decimal("1e-8"))


def _realized(ledger: Ledger) -> Decimal:
    return sum((Decimal(e["detail"]["cost_usd"]) for e in ledger.entries
                if e["type"] == "outcome" and "cost_usd" in e["detail"]), Decimal(0))


def test_a_budget_that_fits_three_sessions_starts_three_and_a_larger_one_finishes_without_repeats(tmp_path, env):
    """$2.55 fits two reservations at once ($2.50) but not a third beside them; once both settle at
    $0.4536, a third fits ($0.9072 + $1.25); then $1.3608 + $1.25 does not: exit 3, the fourth not
    journaled. Raised to $2.70, the same command starts the fourth alone."""
    plan = _plan(tmp_path, 4)
    first = cli("run", str(plan), "--corpus", str(CORPUS), "--concurrency", "2", "--budget-usd", "2.55", env=env)
    assert first.returncode == EXIT_BUDGET, first.stderr
    assert "budget: 1 session(s) not started" in first.stderr and "Traceback" not in first.stderr
    ledger = _ledger(tmp_path)
    states = ledger.sessions()
    assert sorted(s.status for s in states.values()) == ["succeeded"] * 3 and len(states) == 3  # the 4th: not journaled
    assert _usd(_realized(ledger)) == 3 * SESSION_COST and _realized(ledger) <= Decimal("2.55")
    starts = [e for e in ledger.entries if e["type"] == "start"]
    assert {(e["reserved_usd"], e["campaign_usd"]) for e in starts} == {("1.25", "2.55")}
    status = cli("status", "demo", "--json", env=env)
    money = json.loads(status.stdout)["budget"]
    assert _usd(money["spent_usd"]) == 3 * SESSION_COST and Decimal(money["reserved_usd"]) == 0
    assert _usd(money["left_usd"]) == Decimal("2.55") - 3 * SESSION_COST
    # Nothing starts the fourth until the budget is raised: a watch ends at once, as the run did
    # (before, it waited for the fourth for good).
    watched = subprocess.run([sys.executable, "-m", "runner", "status", "demo", "--watch", "--interval", "0.1"],
                             capture_output=True, text=True, env=env, timeout=60)
    assert watched.returncode == EXIT_BUDGET, watched.stdout + watched.stderr
    assert watched.stdout.startswith("[##################......] 3/4 final, 0 running, cost $")
    assert watched.stdout.splitlines()[0].endswith(", refusals 1, the last run stopped (see below)"), watched.stdout
    assert "\nthe last run stopped (" in watched.stdout and "): budget: 1 session(s) not started" in watched.stdout
    assert json.loads(status.stdout)["stopped"]["exit"] == EXIT_BUDGET
    # On a terminal: the live board says why, and ends the same way.
    code, drawn = on_a_terminal([sys.executable, "-m", "runner", "status", "demo", "--watch", "--interval", "0.1"],
                                {**env, "COLUMNS": "200"}, timeout=60)
    flat = " ".join(drawn.split())
    assert code == EXIT_BUDGET and "the last run stopped: budget: 1 session(s) not started" in flat, flat

    # Issue 29: "a remedy ends on the old failure ... a newer run supersedes an older stop". A run
    # submitted since (submit marks it before its Job journals anything) is what the campaign
    # waits on now, not the stop before it.
    from runner.service.stored import mark_run
    from runner.store.file import FileStore

    mark_run(FileStore(tmp_path / "store"), "demo", "submit")
    assert json.loads(cli("status", "demo", "--json", env=env).stdout)["stopped"] is None

    second = cli("run", str(plan), "--corpus", str(CORPUS), "--concurrency", "2", "--budget-usd", "2.70", env=env)
    assert second.returncode == 0, second.stderr
    assert "HW-PRB-0007" in second.stderr and second.stderr.count("succeeded") == 1  # only the fourth ran
    ledger = _ledger(tmp_path)
    assert {s.status for s in ledger.sessions().values()} == {"succeeded"} and len(ledger.sessions()) == 4
    intents = [(e["session"], e["attempt"]) for e in ledger.entries if e["type"] == "intent"]
    assert len(intents) == len(set(intents)) == 4 and {a for _, a in intents} == {1}  # no session ran twice
    assert json.loads(cli("status", "demo", "--json", env=env).stdout)["stopped"] is None  # the run since finished it
    assert _usd(_realized(ledger)) == 4 * SESSION_COST and _realized(ledger) <= Decimal("2.70")
    assert ledger.verify() == []


def test_a_session_stopped_by_its_own_limit_is_an_observation_the_prose_names(tmp_path, env):
    """At --session-budget-usd 0.2 the CLI stops after its second answer ($0.3024: the CLI
    checks after each answer, so it crosses the limit by less than one answer). The session is
    recorded with answer null (the contract: "Every other message records answer: null."), its
    cost stays under its reservation, and the prose names it."""
    plan = _plan(tmp_path, 1)
    env = {**env, "RUNNER_BUDGET__SESSION_USD": "0.2"}
    done = cli("run", str(plan), "--corpus", str(CORPUS), "--budget-usd", "1", env=env)
    assert done.returncode == 0, done.stderr
    ledger = _ledger(tmp_path)
    (state,) = ledger.sessions().values()
    assert state.status == "succeeded" and _usd(state.detail["cost_usd"]) == 2 * ANSWER_COST
    assert Decimal(state.detail["cost_usd"]) < Decimal("0.2") + Decimal("0.75")  # its reservation
    store = FileStore(tmp_path / "store")
    stream = [json.loads(line) for line in store.get(state.detail["stream"]["key"]).splitlines()]
    assert stream[-1]["subtype"] == "error_max_budget_usd"
    transcript = " ".join(store.get("campaigns/demo/transcripts/campaign-present.md").decode().split())
    assert "with its token) ended 1 session(s) (HW-PRB-0007 present-001)" in transcript
    assert "answer: null" in transcript


@pytest.mark.parametrize("stage", STAGES)
def test_the_books_hold_after_a_sigkill_at_each_stage(tmp_path, env, stage):
    """Two sessions one at a time under a $2.20 budget; the runner is SIGKILLed when the first
    reaches ``stage``. Killed before its start, nothing is reserved and the restart runs both.
    Killed after its start, its reservation stays in the journaled books (it may have spent
    up to it): the restart does not start the second, since $1.25 + $1.25 > $2.20 (before,
    with the reservation forgotten, it would have). `ledger recover` settles the first at its
    whole reservation; raised to $2.60 the second runs. Realized spend never passes the
    budget, and no session runs twice."""
    plan = _plan(tmp_path, 2)
    run = ("run", str(plan), "--corpus", str(CORPUS), "--concurrency", "1")
    killed = cli(*run, "--budget-usd", "2.20", env=env, kill_at=stage)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    ledger = _ledger(tmp_path)
    assert ledger.verify() == []
    started = stage not in ("before-intent", "after-intent")
    assert books(ledger).reserved == (RESERVATION if started else 0) and books(ledger).spent == 0

    again = cli(*run, "--budget-usd", "2.20", env=env)
    ledger = _ledger(tmp_path)
    first, second = (ledger.state(f"HW-PRB-0007/present-00{n}") for n in (1, 2))
    if not started:
        assert again.returncode == 0, again.stderr
        assert first.status == second.status == "succeeded"
        assert _usd(books(ledger).spent) == 2 * SESSION_COST and books(ledger).reserved == 0
    else:
        assert again.returncode == EXIT_BUDGET, again.stderr
        assert "interrupted: HW-PRB-0007/present-001 started and has no outcome" in again.stderr
        assert first.status == "started" and second.status == "pending"
        assert books(ledger).reserved == RESERVATION and books(ledger).spent == 0
        recovered = cli("ledger", "recover", "demo", env=env)
        assert recovered.returncode == 0, recovered.stderr
        raised = cli(*run, "--budget-usd", "2.60", env=env)
        # 12: the interrupted first session is the transcript's refusal, as without a budget.
        assert raised.returncode == 12 and "session HW-PRB-0007 present-001" in raised.stdout, raised.stderr
        ledger = _ledger(tmp_path)
        assert ledger.state("HW-PRB-0007/present-001").status == "interrupted"
        assert ledger.state("HW-PRB-0007/present-002").status == "succeeded"
        assert _usd(books(ledger).spent) == RESERVATION + SESSION_COST and books(ledger).reserved == 0
    assert books(ledger).spent + books(ledger).reserved <= Decimal("2.60")
    intents = [(e["session"], e["attempt"]) for e in ledger.entries if e["type"] == "intent"]
    assert len(intents) == len(set(intents)) and {a for _, a in intents} == {1}
    assert all("reserved_usd" in e for e in ledger.entries if e["type"] == "start")
    assert ledger.verify() == []


def test_a_campaign_whose_budget_starts_nothing_says_its_transcripts_hold_no_session(tmp_path, env):
    """Issue 29: "`status` says "transcripts: ready" for a campaign in which nothing ran". A
    budget below one session's reservation starts none: the run exits 3, its transform writes
    the (empty) transcripts and the refusals, and status says what they hold."""
    plan = _plan(tmp_path, 2)
    run = cli("run", str(plan), "--corpus", str(CORPUS), "--budget-usd", "1", env=env)
    assert run.returncode == EXIT_BUDGET, run.stderr
    status = cli("status", "demo", env=env)
    assert "transcripts: ready" not in status.stdout, status.stdout
    assert "of no session: none has ended" in status.stdout, status.stdout


def test_shares_run_at_once_never_reserve_more_than_the_campaigns_budget_together(tmp_path, env):
    """Issue 15's rule across controllers (issue 32, item 5; the guide: "spend twice its limit
    across replicas"): "No session starts whose reservation would take spent + reserved past the
    campaign budget." Two processes each run one share of 4 sessions at once under $2.55. Had
    each held the whole budget, each would run both its sessions, and both shares' second
    reservations ($0.4536 + $1.25 each) would be out together: $3.41. Each holds its part,
    $1.275 (2 of 4 sessions): one reservation, then its second no longer fits, and it stops
    over its part (exit 3). Read back from the one ledger in its order, spent + reserved never
    passes $2.55, and the last share to end records the campaign's stop."""
    plan = _plan(tmp_path, 4)
    run = [sys.executable, "-m", "runner", "run", str(plan), "--corpus", str(CORPUS), "--concurrency", "2",
           "--budget-usd", "2.55", "--shares", "2", "--share-index"]
    procs = [subprocess.Popen([*run, str(i)], env={**env, "RUNNER_LOCAL__WORKDIR": str(tmp_path / f"work-{i}")},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == EXIT_BUDGET, err
        assert "this controller's part of the campaign's budget ($1.2750 of $2.5500" in err and "Traceback" not in err
    ledger = _ledger(tmp_path)
    states = ledger.sessions()
    ran = sorted(k for k, s in states.items() if s.status == "succeeded")
    assert ran == ["HW-PRB-0007/present-001", "HW-PRB-0007/present-002"] and len(states) == 2  # one of each share
    reserved = spent = Decimal(0)
    for e in ledger.entries:  # the books at every point of the journal, both shares' entries together
        if e["type"] == "start":
            assert e["campaign_usd"] == "2.55" and e["reserved_usd"] == "1.25"
            reserved += RESERVATION
        elif e["type"] == "outcome":
            reserved, spent = reserved - RESERVATION, spent + Decimal(e["detail"]["cost_usd"])
        assert spent + reserved <= Decimal("2.55")
    assert ledger.verify() == []
    status = json.loads(cli("status", "demo", "--json", env=env).stdout)
    assert status["stopped"]["exit"] == EXIT_BUDGET and status["transcripts"]["ready"], status
