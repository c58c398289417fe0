"""The price table (issue 43, item 3): it covers every model the qualified CLI versions know,
each at the CLI's own arithmetic as its qualification measured it (docs/qualification/), a
long-context premium billed and bounded, and prices an operator sets merged over the defaults."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest

from runner import harnesses
from runner.gateway import policy
from runner.settings import DEFAULT_PRICES, GatewaySettings, ModelPrice, load_settings, price_of

REPORTS = sorted((Path(__file__).parents[2] / "docs" / "qualification").glob("*.json"))
H = harnesses.HARNESS


def test_every_model_a_qualified_version_sends_has_a_price():
    sent = {s.model for q in H.qualified.values() for s in q.models.values()}
    assert {m for m in sent if price_of(DEFAULT_PRICES, m) is None} == set()


@pytest.mark.parametrize("report", REPORTS, ids=[r.stem for r in REPORTS])
def test_each_price_is_the_clis_own_arithmetic(report):
    """"each checked against the CLI's own arithmetic": the qualification's measured rates (one
    answer of 50,000 tokens of each kind) and its cost of a prompt over 200k tokens."""
    from runner.qualify.observe import LONG

    doc = json.loads(report.read_text())
    assert doc["version"] in H.qualified
    for model, m in doc["models"].items():
        if model not in H.qualified[doc["version"]].models:
            continue  # not qualified: 2.1.197 prices the 5.5 models it predates at its fallback, which the report says
        price = price_of(DEFAULT_PRICES, m["sent"]["models"][0])
        assert price is not None, model
        ours = {"input": price.input, "output": price.output, "cache_write": price.cache_write, "cache_read": price.cache_read}
        assert {k: Decimal(v) for k, v in m["cli_rates"].items()} == ours, model
        assert abs(policy.cost(price, LONG) - Decimal(m["cli_long_prompt_usd"])) <= Decimal("0.000001"), model


def test_a_long_prompt_is_billed_and_bounded_at_its_premium():
    """Haiku 5.5 bills a call whose prompt is over 100,000 tokens at 5x its rates, every token."""
    price = DEFAULT_PRICES["claude-haiku-5-5"]
    short = {"input_tokens": 60_000, "cache_read_input_tokens": 40_000, "output_tokens": 1000}
    assert policy.cost(price, short) == (60_000 * Decimal("0.10") + 40_000 * Decimal("0.01") + 1000 * Decimal("0.50")) / 10**6
    long = short | {"input_tokens": 60_001}
    assert policy.cost(price, long) == (60_001 * Decimal("0.50") + 40_000 * Decimal("0.05") + 1000 * Decimal("2.50")) / 10**6
    call = policy.Call("claude-haiku-5-5", 1000, False, 200_000)
    assert policy.bound(price, call, 1_000_000) == (200_000 * Decimal("0.625") + 1000 * Decimal("2.50")) / 10**6


def test_prices_set_are_merged_over_the_defaults(monkeypatch):
    """Pricing one model (the chart's gateway.prices, RUNNER_GATEWAY__PRICES) leaves the others priced."""
    new = {"input": "1", "output": "2", "cache_write": "1.25", "cache_read": "0.1"}
    g = GatewaySettings(prices={"claude-new-1": new})
    assert g.prices["claude-new-1"] == ModelPrice(**new) and g.prices["claude-opus-4-5"] == DEFAULT_PRICES["claude-opus-4-5"]
    monkeypatch.setenv("RUNNER_GATEWAY__PRICES", json.dumps({"claude-opus-4-5": new}))
    prices = load_settings(store="file:///tmp/p").gateway.prices
    assert prices["claude-opus-4-5"] == ModelPrice(**new) and prices["claude-sonnet-4-5"] == DEFAULT_PRICES["claude-sonnet-4-5"]
