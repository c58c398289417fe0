"""The campaign's books and the gate before each start (runner/budget.py; issue 15: "No
session starts whose reservation would take spent + reserved past the campaign budget")."""

from __future__ import annotations

import asyncio
from decimal import Decimal

import pytest

from runner import harnesses
from runner.budget import Books, Gate, OverBudget, books
from runner.errors import UserError
from runner.ledger import Ledger
from runner.plan import parse_plan
from runner.settings import load_settings
from runner.store.file import FileStore

D = Decimal
MONEY = {"reserved_usd": "0.25", "campaign_usd": "1"}


@pytest.fixture
def ledger(tmp_path) -> Ledger:
    return Ledger(FileStore(tmp_path), "c")


def _started(ledger: Ledger, session: str, money: dict | None = MONEY) -> None:
    ledger.intent(session, 1, {"d": 1})
    ledger.start(session, 1, money)


def test_the_books_read_back_from_the_journal(ledger):
    _started(ledger, "p/settled")
    ledger.outcome("p/settled", 1, "succeeded", {"cost_usd": "0.1"})
    _started(ledger, "p/cost-unknown")  # interrupted: it may have spent up to its reservation
    ledger.outcome("p/cost-unknown", 1, "interrupted", {"reason": "x"})
    _started(ledger, "p/running")       # no outcome yet: still reserved
    ledger.intent("p/never-started", 1, {"d": 1})
    ledger.outcome("p/never-started", 1, "refused", {"reason": "seal"})
    _started(ledger, "p/unbudgeted", None)  # a run without a budget reserves nothing, and settles at its cost
    ledger.outcome("p/unbudgeted", 1, "succeeded", {"cost_usd": "0.05"})
    assert books(ledger) == Books(spent=D("0.1") + D("0.25") + D("0.05"), reserved=D("0.25"), budget=D("1"))
    assert books(ledger).left() == D("0.35")
    assert books(ledger).left(D("2")) == D("1.35")
    assert Books().left() is None


def test_the_gate_refuses_only_what_cannot_fit_once_every_session_of_the_run_settled(ledger):
    async def scenario() -> None:
        gate = Gate(ledger, D("1"), D("0.4"))
        await gate.hold()
        await gate.hold()  # 0.8 of 1 held
        third = asyncio.create_task(gate.hold())
        done, _ = await asyncio.wait([third], timeout=0.2)
        assert not done, "a reservation past the budget was held"
        # The first settles for less than it reserved: 0.1 spent + 0.4 reserved + 0.4 fits in 1.
        _started(ledger, "p/a", {"reserved_usd": "0.4", "campaign_usd": "1"})
        ledger.outcome("p/a", 1, "succeeded", {"cost_usd": "0.1"})
        await gate.done(ledger, "p/a", 1)
        await asyncio.wait_for(third, 5)  # held, not refused
        assert (gate.spent, gate.reserved, gate.out) == (D("0.1"), D("0.8"), 2)
        # A session that never started gives its hold back; one that started and has no
        # outcome keeps it.
        await gate.done(ledger, "p/never", 1)
        _started(ledger, "p/lost", {"reserved_usd": "0.4", "campaign_usd": "1"})
        await gate.done(ledger, "p/lost", 1)
        assert (gate.spent, gate.reserved, gate.out) == (D("0.1"), D("0.4"), 0)
        await gate.hold()  # 0.1 + 0.4 + 0.4 fits
        _started(ledger, "p/lost2", {"reserved_usd": "0.4", "campaign_usd": "1"})
        await gate.done(ledger, "p/lost2", 1)  # started, no outcome: it stays reserved, and nothing of this run is out
        with pytest.raises(OverBudget, match=r"reserves \$0.4000 .* has \$0.1000 left \(\$0.1000 spent, \$0.8000 reserved\)"):
            await gate.hold()

    asyncio.run(scenario())


def test_a_waiting_session_is_refused_once_the_last_session_out_settles_at_its_whole_reservation(ledger):
    """The wait ends on every settlement, a refusal too: a session waiting for money that never
    comes back is told so, not left waiting."""
    async def scenario() -> None:
        gate = Gate(ledger, D("1"), D("0.6"))
        await gate.hold()
        waiting = asyncio.create_task(gate.hold())
        await asyncio.sleep(0.05)
        assert not waiting.done()
        _started(ledger, "p/a", {"reserved_usd": "0.6", "campaign_usd": "1"})
        ledger.outcome("p/a", 1, "failed", {})  # no cost stated: settled at the whole reservation
        await gate.done(ledger, "p/a", 1)
        with pytest.raises(OverBudget):
            await asyncio.wait_for(waiting, 5)

    asyncio.run(scenario())


def test_a_restarted_run_starts_from_the_journaled_books(ledger):
    _started(ledger, "p/a", {"reserved_usd": "0.4", "campaign_usd": "1"})
    _started(ledger, "p/b", {"reserved_usd": "0.4", "campaign_usd": "1"})
    ledger.outcome("p/b", 1, "succeeded", {"cost_usd": "0.3"})
    gate = Gate(Ledger(ledger.store, "c"), D("1"), D("0.4"))
    assert (gate.spent, gate.reserved) == (D("0.3"), D("0.4"))
    with pytest.raises(OverBudget):
        asyncio.run(gate.hold())  # 0.3 + 0.4 + 0.4 > 1, and p/a is not this run's to wait for
    gate.adopt()  # this run follows p/a to its end after all: it settles at 0.2
    ledger.outcome("p/a", 1, "succeeded", {"cost_usd": "0.2"})
    asyncio.run(gate.done(ledger, "p/a", 1))
    asyncio.run(gate.hold())
    assert (gate.spent, gate.reserved) == (D("0.5"), D("0.4"))


def test_a_campaign_budget_needs_a_session_limit_and_the_cli_gets_it(monkeypatch):
    monkeypatch.setenv("RUNNER_BUDGET__CAMPAIGN_USD", "5")
    with pytest.raises(UserError, match="budget.campaign_usd needs budget.session_usd"):
        load_settings()
    monkeypatch.setenv("RUNNER_BUDGET__SESSION_USD", "0.5")
    settings = load_settings()
    assert settings.budget.reservation() == D("2.50")
    from runner import demo

    plan = parse_plan(__import__("json").loads(demo.PLAN.read_text()), "plan")
    argv = harnesses.HARNESS.flags(plan, settings)
    assert argv[argv.index("--max-budget-usd") + 1] == "0.5"
    monkeypatch.delenv("RUNNER_BUDGET__CAMPAIGN_USD")
    monkeypatch.delenv("RUNNER_BUDGET__SESSION_USD")
    assert "--max-budget-usd" not in harnesses.HARNESS.flags(plan, load_settings())


def test_an_attempt_settles_at_the_gateways_meter_where_it_is_more():
    """A review found the books settled at the stream's cost alone, so a session whose Bash
    spent with its token outside the CLI gave that money back to the campaign. The books now
    settle at the larger of the stream's cost and the gateway's meter, and at the whole
    reservation where the gateway could not price a call."""
    from runner.budget import settled_cost

    assert settled_cost(D("0.0096"), None) == D("0.0096")  # no gateway (Kubernetes today)
    assert settled_cost(D("0.0096"), {"cost_usd": "0.6396", "unpriced_models": []}) == D("0.6396")
    assert settled_cost(D("0.02"), {"cost_usd": "0.0096", "unpriced_models": []}) == D("0.02")
    assert settled_cost(None, {"cost_usd": "0.3", "unpriced_models": []}) == D("0.3")  # a stream cut before its result
    assert settled_cost(D("0.01"), {"cost_usd": "0", "unpriced_models": ["claude-next-9"]}) is None
    assert settled_cost(None, None) is None
