"""What `run`, `submit`, the controller and `doctor --plan` refuse before anything is spent
(issue 43, items 3 and 6): a harness version or a model that is not qualified, an unpriced model
in a budgeted campaign, a model one of whose calls cannot fit in budget.call_usd. Each reason
names what to do."""

from __future__ import annotations

import dataclasses

import pytest

from runner import admission, harnesses
from runner.errors import UserError
from runner.harnesses.contract import Qualified, Sends
from runner.plan import parse_plan
from runner.settings import Settings

D = "sha256:" + "a" * 64


def _settings(**over) -> Settings:
    return Settings(store="file:///tmp/admission", **over)


def _budgeted(**over) -> Settings:
    return _settings(budget={"campaign_usd": "10", "session_usd": "1", **over})


def test_every_qualified_pair_on_its_own_runs_unbudgeted_and_sonnet_runs_budgeted():
    for version, q in harnesses.HARNESS.qualified.items():
        for model in q.models:
            assert admission.refusals(model, f"{version} (Claude Code)", _settings()) == []
    assert admission.refusals("claude-sonnet-4-5", None, _budgeted()) == []


def test_a_version_that_is_not_qualified_names_the_qualify_command():
    (why,) = admission.refusals("claude-sonnet-4-5", "2.0.1 (Claude Code)", _settings())
    assert why.startswith("the harness is Claude Code 2.0.1, which the recorder is not qualified with")
    assert "probe-runner harness qualify --cli 2.0.1 --model MODEL" in why and harnesses.HARNESS.install in why


def test_a_model_that_is_not_qualified_names_the_qualify_command():
    (why,) = admission.refusals("claude-3-7-sonnet", None, _settings())  # priced, never qualified
    assert why.startswith(f"the model claude-3-7-sonnet is not qualified with Claude Code {harnesses.HARNESS.version}")
    assert f"probe-runner harness qualify --cli {harnesses.HARNESS.version} --model claude-3-7-sonnet" in why
    # 2.1.197 prices the 5.5 models it predates at its fallback: its qualification did not qualify them
    (why,) = admission.refusals("claude-opus-5-5", "2.1.197 (Claude Code)", _settings())
    assert why.startswith("the model claude-opus-5-5 is not qualified with Claude Code 2.1.197")


def test_a_budgeted_campaign_on_an_unpriced_model_names_where_its_price_is_set(monkeypatch):
    pin = harnesses.HARNESS.version
    q = harnesses.HARNESS.qualified[pin]
    models = {**q.models, "claude-new-1": Sends("claude-new-1", frozenset(), 32000)}
    monkeypatch.setattr(harnesses, "HARNESS", dataclasses.replace(harnesses.HARNESS, qualified={pin: Qualified(pin, models)}))
    assert admission.refusals("claude-new-1", None, _settings()) == []  # no budget: metered in tokens
    (why,) = admission.refusals("claude-new-1", None, _budgeted())
    assert why.startswith("the model claude-new-1 has no price at the gateway") and "RUNNER_GATEWAY__PRICES" in why
    assert "merged with the defaults" in why


def test_a_model_whose_largest_call_cannot_fit_in_call_usd_names_the_value_to_raise_it_to():
    """Opus 5.5 asks for 128,000 output tokens: $2.56 at $20 per million, over the default $2.00."""
    (why,) = admission.refusals("claude-opus-5-5", None, _budgeted())
    assert "may ask for 128000 output tokens, up to $2.56 of output, not under budget.call_usd ($2.00)" in why
    assert "raise RUNNER_BUDGET__CALL_USD (e.g. to $7.56" in why
    assert admission.refusals("claude-opus-5-5", None, _budgeted(call_usd="7.56")) == []
    assert admission.refusals("claude-opus-5-5", None, _settings(budget={"campaign_usd": "10", "session_usd": "1"},
                                                                 gateway={"max_tokens": 64000})) == []
    # without the gateway nothing holds a call to its bound: call_usd is only part of the reservation
    assert admission.refusals("claude-opus-5-5", None, _settings(budget={"campaign_usd": "10", "session_usd": "1"},
                                                                 gateway={"enabled": False})) == []


def test_admit_raises_the_reasons_as_bad_input():
    plan = parse_plan({"campaign": "c1", "tier": "regression", "model": "claude-3-7-sonnet",
                       "identity": {"lock": D, "tree": D, "selection": D, "read_set": D, "seed": 1, "harness": "h"},
                       "arms": ["present"], "repetitions": 1, "identifier_pattern": r"HW-DR-\d{4}",
                       "probes": [{"id": "HW-PR-0001", "path": "p.md", "title": "t", "task": "x", "answers": []}]})
    with pytest.raises(UserError, match="^campaign c1 cannot run: the model claude-3-7-sonnet is not qualified") as e:
        admission.admit(plan, None, _settings())
    assert e.value.exit_code == 2
