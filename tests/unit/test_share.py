"""A campaign split across controllers (runner/share.py; issue 32, item 5: "split a campaign
across controllers as an Indexed Job, each index owning a fixed share of the sessions, the
ledger's guarantees kept (no session twice, every session once, one verifiable export)")."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import subprocess
import sys
from decimal import Decimal

import pytest

from runner.budget import Gate, OverBudget, books
from runner.demo import PLAN
from runner.errors import UserError
from runner.k8s import jobs, manifests, names
from runner.ledger import Ledger
from runner.plan import parse_plan
from runner.settings import Settings
from runner.share import WHOLE, Share
from runner.store.file import FileStore

D = Decimal


def _plan(repetitions: int = 5):
    raw = json.loads(PLAN.read_text())
    raw["repetitions"] = repetitions
    return parse_plan(raw, "plan")


@pytest.mark.parametrize("count", [1, 2, 3, 7, 40])
def test_every_session_is_in_exactly_one_share_and_the_shares_differ_by_at_most_one(count):
    plan = _plan()  # 2 probes x 2 arms x 5 repetitions = 20 sessions
    shares = [Share(i, count).sessions(plan) for i in range(count)]
    keys = [spec.key for part in shares for spec in part]
    assert sorted(keys) == sorted(spec.key for spec in plan.sessions()) and len(keys) == len(set(keys))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1
    # Fixed by the plan alone: asked again (a restarted controller), a share is the same sessions.
    assert [Share(i, count).sessions(_plan()) for i in range(count)] == shares


def test_the_shares_parts_of_the_concurrency_add_up_to_it_and_none_is_empty():
    for campaign in (3, 4, 10, 500):
        for count in range(1, campaign + 1, max(1, campaign // 7)):
            parts = [Share(i, count).concurrency(campaign) for i in range(count)]
            assert sum(parts) == campaign and min(parts) >= 1 and max(parts) - min(parts) <= 1
    with pytest.raises(UserError, match=r"concurrency 2 cannot be split across 3 controllers"):
        Share(0, 3).concurrency(2)  # every share refuses, the one whose part would be 1 too


def test_the_shares_parts_of_the_budget_never_add_up_to_more_than_it():
    plan = _plan(repetitions=7)  # 28 sessions: 3 shares own 10, 9 and 9
    for budget in (D("10"), D("1"), D("0.000007"), D("2.55")):
        parts = [Share(i, 3).budget(budget, plan) for i in range(3)]
        assert sum(parts) <= budget and all(p >= 0 for p in parts)
        assert budget - sum(parts) < D("0.000003")  # rounded down to a micro-dollar each, no more
    assert Share(0, 3).budget(D("2.8"), plan) == D("1")  # 10 of 28 sessions
    assert WHOLE.budget(D("2.8"), plan) == D("2.8")


def test_a_share_is_refused_when_its_index_is_outside_its_count():
    for index, count in ((2, 2), (-1, 2), (0, 0)):
        with pytest.raises(UserError, match=r"a share's index is 0 to its count - 1"):
            Share(index, count)


def test_the_shares_confinement_checks_never_share_a_number():
    numbers = [Share(i, 3).check_number(n) for i in range(3) for n in range(1, 6)]
    assert len(set(numbers)) == len(numbers) and min(numbers) == 1
    assert [WHOLE.check_number(n) for n in (1, 2, 3)] == [1, 2, 3]


def test_a_shares_gate_holds_its_sessions_to_its_part_and_journals_the_campaigns_budget(tmp_path):
    """Issue 15's rule, per share: "No session starts whose reservation would take spent +
    reserved past the campaign budget". Two shares that each held the whole budget could
    together reserve twice it; held to their parts, they cannot."""
    ledger = Ledger(FileStore(tmp_path), "c")
    ledger.intent("p/other", 1, {"d": 1})  # another share's session, started: not this share's books
    ledger.start("p/other", 1, {"reserved_usd": "0.4", "campaign_usd": "1"})
    ledger.intent("p/mine", 1, {"d": 1})
    ledger.start("p/mine", 1, {"reserved_usd": "0.4", "campaign_usd": "1"})
    ledger.outcome("p/mine", 1, "succeeded", {"cost_usd": "0.05"})
    assert books(ledger, {"p/mine", "p/later"}).spent == D("0.05") and books(ledger, {"p/mine"}).reserved == 0
    gate = Gate(ledger, D("1"), D("0.4"), limit=D("0.5"), sessions={"p/mine", "p/later"})
    assert (gate.budget, gate.spent, gate.reserved) == (D("0.5"), D("0.05"), 0)
    asyncio.run(gate.hold())  # 0.05 + 0.4 fits 0.5; the other share's 0.4 is not counted here
    assert gate.money() == {"reserved_usd": "0.4", "campaign_usd": "1"}  # the journal keeps the campaign's budget
    asyncio.run(gate.done(ledger, "p/later", 1))  # never started: given back
    gate.reserved += D("0.4")  # held again, as a second hold would
    with pytest.raises(OverBudget, match=r"this controller's part of the campaign's budget \(\$0.5000 of \$1.0000, in "
                                         r"proportion to its share of the sessions\) has \$0.0500 left"):
        asyncio.run(gate.hold())


def test_an_indexed_controller_job_is_the_plain_one_with_a_pod_per_share():
    """Each index retried alone (a lost controller delays its share only); exit 3, over its part
    of the budget, fails its index alone; bad input and an unconfined cluster fail the Job."""
    settings = Settings(store="s3://b/p", kube={"namespace": "probes", "instance": "team-a", "store_secret": "bucket"})
    plain = jobs.controller_job(settings, "c")
    split = jobs.controller_job(settings.model_copy(update={"kube": settings.kube.model_copy(update={"controllers": 3})}),
                                "c")
    expected = copy.deepcopy(plain)
    del expected["spec"]["backoffLimit"]
    expected["spec"].update({
        "completionMode": "Indexed", "completions": 3, "parallelism": 3, "backoffLimitPerIndex": 3,
        "podFailurePolicy": {"rules": [
            {"action": "FailJob", "onExitCodes": {"containerName": "controller", "operator": "In", "values": [2, 12]}},
            {"action": "FailIndex", "onExitCodes": {"containerName": "controller", "operator": "In", "values": [3]}},
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
        ]}})
    expected["spec"]["template"]["spec"]["containers"][0]["command"] = [
        "probe-runner", "controller", "--campaign", "c", "--shares", "3"]
    assert split == expected
    # A resume Job runs its few sessions in one pod, whatever kube.controllers says.
    resume = jobs.controller_job(settings.model_copy(update={"kube": settings.kube.model_copy(update={"controllers": 3})}),
                                 "c", resume=["p/s"])
    assert "completionMode" not in resume["spec"] and "--shares" not in jobs.job_command(resume)


def test_a_shares_pods_are_labelled_with_it_and_its_watch_selects_them_alone():
    settings = Settings()
    plan = _plan(1)
    route = manifests.Route("http://gw:8080", token="t")
    whole = manifests.session_pod(settings, plan, "p", "present-001", 1, "task", route)
    mine = manifests.session_pod(settings, plan, "p", "present-001", 1, "task", route, "1-of-2")
    assert mine["metadata"]["labels"] == {**whole["metadata"]["labels"], names.SHARE: "1-of-2"}
    assert {k: v for k, v in mine.items() if k != "metadata"} == {k: v for k, v in whole.items() if k != "metadata"}
    assert names.selector("i", names.SESSION_COMPONENT, "c", "1-of-2") == {
        **names.selector("i", names.SESSION_COMPONENT, "c"), names.SHARE: "1-of-2"}
    canary = manifests.canary_pod(settings, "c", 4, "", route, "1-of-2")
    assert canary["metadata"]["labels"][names.SHARE] == "1-of-2"


@pytest.mark.parametrize(("args", "said"), [
    (["--shares", "2"], "--shares 2 needs --share-index (0 to 1)"),
    (["--shares", "2", "--share-index", "2"], "share 2 of 2: a share's index is 0 to its count - 1"),
    (["--shares", "3", "--share-index", "0", "--concurrency", "2"], "concurrency 2 cannot be split across 3 controllers"),
])
def test_a_share_that_cannot_run_is_refused_with_what_to_give(tmp_path, args, said):
    plan = tmp_path / "plan.json"
    plan.write_text(PLAN.read_text())
    (tmp_path / "corpus").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_") and k != "JOB_COMPLETION_INDEX"}
    done = subprocess.run([sys.executable, "-m", "runner", "run", str(plan), "--corpus", str(tmp_path / "corpus"), *args],
                          capture_output=True, text=True, env={**env, "RUNNER_STORE": (tmp_path / "s").as_uri(),
                                                               "RUNNER_LOCAL__WORKDIR": str(tmp_path / "w"), "RUNNER_PROVIDER__API_KEY": "k"},
                          timeout=60)
    assert done.returncode == 2 and said in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "s").exists()  # refused before anything was written
