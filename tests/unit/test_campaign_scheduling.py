"""The campaign's scheduling of slots and money together (runner/campaign.py run_sessions):
a session waiting for its pod steps its slot aside, and a session waiting for budget must not
hold a slot meanwhile. A review reproduced the deadlock the first order made: session A holds
$7 of a $10 budget and steps aside; B takes the freed slot and waits in the budget's gate for
A's money; A's pod runs, but its slot never comes back. The executor here is a test double of
the executors' contract (runner/executors/base.py) that steps aside as the Kubernetes executor
does; the sessions' streams are the real CLI's (tests/data)."""

from __future__ import annotations

import asyncio
import json
import threading
from decimal import Decimal
from pathlib import Path

from runner import demo
from runner.campaign import run_sessions
from runner.clock import now
from runner.executors.local import local_remedies
from runner.ledger import Ledger
from runner.plan import parse_plan
from runner.settings import BudgetSettings, KubeSettings
from runner.store.file import FileStore

# The install's remedy for a refused key (runner/k8s/confinement.py's fix_key), for team-a/pr
FIX_KEY = ("fix the key in the install's credentials Secret (its key api-key) and restart the gateway "
           "(`kubectl -n team-a rollout restart deployment/pr-gateway`)")

STREAM = (Path(__file__).parents[1] / "data" / "claude-code-2.1.197" / "read-write-answer.jsonl").read_bytes()  # $0.003


class AsideExecutor:
    """The first session's 'pod' waits to start: its slot steps aside until another session
    has asked to start, then it takes the slot back and runs."""

    name = "test-double"
    confinement = "a test double of the executors' contract"
    waiting_room = 1

    def __init__(self) -> None:
        self.first: str | None = None
        self.lock = threading.Lock()

    def preflight(self) -> None: ...

    def prepare(self, plan, final, share):
        return set()

    def halted(self):
        return None

    def remedies(self, campaign):
        return local_remedies(campaign)

    def finish(self, keys) -> None: ...

    def close(self) -> None: ...

    async def run(self, plan, probe, sealed, scratch, store, keys, also_collect, started, slot):
        with self.lock:
            first = self.first is None
            self.first = self.first or keys.session
        if first:
            assert slot.aside()
            await asyncio.sleep(1.0)  # the other session has had its chance to take the slot
            assert await slot.back(20), "the slot never came back"
        started()
        store.put(keys.stream, STREAM)
        return {"executor": self.name, "confinement": self.confinement, "network_confined": False,
                "harness": {}, "started_at": now(), "ended_at": now(), "exit_code": 0, "timed_out": False,
                "stream": store.describe(keys.stream), "workspace": "/workspace", "config_dir": "/config",
                "host_skills": [], "artifacts": None}


def test_a_session_waiting_for_money_holds_no_slot_a_stepped_aside_one_needs(tmp_path):
    data = json.loads(demo.PLAN.read_text())
    data.update(probes=data["probes"][:1], arms=["present"], repetitions=2)
    plan = parse_plan(data, "plan")
    store = FileStore(tmp_path / "store")
    executor = AsideExecutor()
    budget = BudgetSettings(campaign_usd=Decimal("10"), session_usd=Decimal("5"), call_usd=Decimal("2"))  # $7 each
    done: list[object] = []
    t = threading.Thread(target=lambda: done.append(run_sessions(
        plan, demo.CORPUS, store, executor, tmp_path / "work", 1, [],
        budget=budget)), daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "deadlock: the second session held the slot the first needed back"
    states = Ledger(store, plan.campaign).sessions()
    assert sorted(s.status for s in states.values()) == ["succeeded", "succeeded"], states
    # One after the other: the second's reservation fitted only once the first settled at $0.003.
    starts = [e for e in Ledger(store, plan.campaign).entries if e["type"] in ("start", "outcome")]
    assert [e["type"] for e in starts] == ["start", "outcome", "start", "outcome"]


def test_every_remedy_is_worded_for_the_executor_the_campaign_runs_on():
    """Issue 29: "the halt messages say `probe-runner run` again, a local verb, for a submitted
    campaign ... word every remedy for the executor the campaign runs on"."""
    from runner.campaign import RunReport
    from runner.executors.kubernetes import kubernetes_remedies
    from runner.executors.local import local_remedies
    from runner.k8s.jobs import job_name

    job = job_name("c1")
    cluster, local = kubernetes_remedies("c1", KubeSettings(namespace="team-a", instance="pr")), local_remedies("c1")
    assert cluster.again == f"delete the campaign's ended controller Job (`kubectl delete job {job}`) and " \
                            "`probe-runner submit` it again"
    assert cluster.resume("P/s-001", "P/s-002") == "`probe-runner ledger resume c1 P/s-001 P/s-002 --job`"
    assert local.again == "`probe-runner run` it again"
    assert local.resume("P/s-001") == "`probe-runner ledger resume c1 P/s-001 --corpus DIR`"
    halted = RunReport(cluster, halted="the provider refused the key (HTTP 401)", refused=["P/s-001", "P/s-003"])
    assert halted.stopped() == (
        f"halted: the provider refused the key (HTTP 401); {FIX_KEY}, then `probe-runner ledger resume c1 P/s-001 "
        "P/s-003 --job` runs again the sessions that failed on it and starts those not started", "key")
    assert RunReport(local, halted="the key check refused it").stopped() == (
        "halted: the key check refused it; fix the provider's key, then `probe-runner run` it again", "key")
    assert RunReport(cluster, halted="the key check refused it").stopped() == (
        f"halted: the key check refused it; {FIX_KEY}, then delete the campaign's ended controller Job (`kubectl "
        f"delete job {job}`) and `probe-runner submit` it again", "key")
    # The confinement monitor's halts: the key's is the key's remedy and exit 2, a route's exit 12.
    from runner.executors.base import Halt

    both = RunReport(cluster)
    both.halt(Halt("check 2: the provider refused the key", key=True))
    both.halt(Halt("check 3: a route opened"))
    assert (both.halted, both.unconfined) == ("check 2: the provider refused the key", "check 3: a route opened")
    keyed = RunReport(cluster)
    keyed.halt(Halt("check 2: the provider refused the key", key=True))
    assert keyed.stopped()[1] == "key" and "fix the key in the install's credentials Secret" in keyed.stopped()[0]
    budget = RunReport(local, over_budget=["P/s-002"], budget_why="$1.25 does not fit")
    assert budget.stopped() == ("budget: 1 session(s) not started, e.g. P/s-002: $1.25 does not fit. Nothing of them is "
                                "journaled; raise the budget (--budget-usd) and `probe-runner run` it again to start "
                                "them", "budget")


class HeldExecutor(AsideExecutor):
    """Every session's harness 'runs' until the test releases it."""

    waiting_room = 1  # a worker beyond the concurrency: a second session is taken up and waits for a slot

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.runs = 0

    async def run(self, plan, probe, sealed, scratch, store, keys, also_collect, started, slot):
        with self.lock:
            self.runs += 1
        for _ in range(3000):  # released by the test's thread
            if self.release.is_set():
                break
            await asyncio.sleep(0.01)
        assert self.release.is_set(), "never released"
        self.first = keys.session  # no stepping aside here
        return await super().run(plan, probe, sealed, scratch, store, keys, also_collect, started, slot)


def _waiting_while_held(tmp_path, concurrency: int, budget: BudgetSettings | None) -> tuple[dict, dict, list[str]]:
    """Run two sessions with ``executor`` holding the first; what status says waits meanwhile,
    and what waiting.json holds once the run is over."""
    from runner import layout
    from runner.status import campaign_status
    from tests.support.waiting import until

    data = json.loads(demo.PLAN.read_text())
    data.update(probes=data["probes"][:1], arms=["present"], repetitions=2)
    plan = parse_plan(data, "plan")
    store = FileStore(tmp_path / "store")
    executor = HeldExecutor()
    t = threading.Thread(target=run_sessions, args=(plan, demo.CORPUS, store, executor, tmp_path / "work", concurrency, []),
                         kwargs={"budget": budget}, daemon=True)
    t.start()
    try:
        until(lambda: executor.runs == 1 and campaign_status(store, plan, {}).waiting, timeout=30,
              what="the second session listed as waiting")
        waiting = campaign_status(store, plan, {}).waiting
        assert executor.runs == 1  # it waits: it has not reached the executor
    finally:
        executor.release.set()
        t.join(60)
    assert not t.is_alive()
    after = json.loads(store.get(layout.waiting_key(plan.campaign)))["sessions"]
    return waiting, after, [s.key for s in plan.sessions()]


def test_a_session_waiting_for_a_slot_says_so_in_status(tmp_path):
    """Issue 31, item 2: "a session waiting says in which phase and why": a session waiting for
    a slot was listed nowhere (only pod waits were recorded)."""
    waiting, after, keys = _waiting_while_held(tmp_path, 1, None)
    (key, why), = waiting.items()
    assert key in keys and why == {"reason": "the campaign's concurrency: 1 of 1 sessions running", "phase": "slot_held",
                                   "since": why["since"]}
    assert after == {}  # it ran: no longer waiting


def test_a_session_waiting_for_the_budget_says_so_in_status(tmp_path):
    budget = BudgetSettings(campaign_usd=Decimal("10"), session_usd=Decimal("5"), call_usd=Decimal("2"))  # $7 each
    waiting, after, keys = _waiting_while_held(tmp_path, 2, budget)
    (key, why), = waiting.items()
    assert key in keys and why == {
        "reason": "the budget: $3.0000 of $10.0000 left, 1 session(s) of this run holding reservations that may settle "
                  "for less; a session reserves $7.0000",
        "phase": "budget_held", "since": why["since"]}
    assert after == {}


def test_the_sessions_waiting_in_every_share_of_a_split_campaign_are_listed(tmp_path):
    """Issue 32, item 5 with issue 31, item 2 ("a session waiting says in which phase and why"):
    each share's run writes its own waiting record (one writer each), and status lists what
    waits in every share, not in one."""
    from runner import layout
    from runner.share import Share
    from runner.status import campaign_status
    from tests.support.waiting import until

    data = json.loads(demo.PLAN.read_text())
    data.update(probes=data["probes"][:1], arms=["present"], repetitions=4)
    plan = parse_plan(data, "plan")
    store = FileStore(tmp_path / "store")
    executors = [HeldExecutor(), HeldExecutor()]
    threads = [threading.Thread(target=run_sessions, args=(plan, demo.CORPUS, store, executors[i], tmp_path / f"work{i}", 1, []),
                                kwargs={"share": Share(i, 2)}, daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    try:
        until(lambda: [e.runs for e in executors] == [1, 1] and len(campaign_status(store, plan, {}).waiting) == 2,
              timeout=30, what="a session running and one waiting in each share")
        waiting = campaign_status(store, plan, {}).waiting
    finally:
        for e in executors:
            e.release.set()
        for t in threads:
            t.join(60)
    assert sorted(waiting) == sorted([Share(0, 2).sessions(plan)[1].key, Share(1, 2).sessions(plan)[1].key])
    assert {w["phase"] for w in waiting.values()} == {"slot_held"}
    assert store.list(layout.waiting_prefix(plan.campaign)) == [layout.waiting_key(plan.campaign, f"{i}-of-2") for i in range(2)]
