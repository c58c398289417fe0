"""The gateway meters a call at the price of the model its request names, the price its bound
was checked at (issue 43, item 6): before, it priced the answer's model, and where only the
request's was priced the call was settled at its whole bound, silently. An answer naming another
model is noted in the meter; a dated id of the model asked for is not."""

from __future__ import annotations

import json
import time
from decimal import Decimal

from runner.gateway import tokens
from runner.gateway.server import Gateway, UsageReader
from runner.settings import DEFAULT_PRICES


def _answer(model: str, usage: dict) -> UsageReader:
    reader = UsageReader(event_stream=False)
    reader.feed(json.dumps({"model": model, "usage": usage}).encode())
    reader.close(200)
    return reader


def _meter(answered: str, asked: str = "claude-opus-4-1") -> dict:
    g = Gateway("http://127.0.0.1:9", "k", tokens.new_secret(), DEFAULT_PRICES)
    claims = tokens.Claims("c", "P-1", "s-001", 1, int(time.time() + 60), None, "2", "claude-opus-4-1")
    g._meter(claims).in_flight = 1
    g._count(claims, _answer(answered, {"input_tokens": 1000, "output_tokens": 100}), Decimal(0), False, True, asked)
    return g.meter(claims.attempt_key)


def test_a_call_is_metered_at_its_requests_model_and_another_answering_model_is_noted():
    """2.1.337 sends claude-opus-5-5 for a campaign on claude-opus-4-1; were its answer to name
    claude-opus-4-1 (priced at $15/$75), it is still metered at the request's $4/$20."""
    m = _meter("claude-opus-4-1", asked="claude-opus-5-5")
    assert Decimal(m["cost_usd"]) == (1000 * 4 + 100 * 20) / Decimal(10**6)
    assert m["answered_as"] == ["claude-opus-5-5 -> claude-opus-4-1"] and m["unpriced_models"] == []


def test_an_answer_naming_an_unpriced_model_is_metered_at_the_requests_price_not_left_unpriced():
    m = _meter("claude-experimental-9", asked="claude-opus-5-5")
    assert Decimal(m["cost_usd"]) == (1000 * 4 + 100 * 20) / Decimal(10**6) and m["unpriced_models"] == []


def test_a_dated_id_of_the_model_asked_for_is_no_note():
    m = _meter("claude-opus-5-5-20261101", asked="claude-opus-5-5")
    assert "answered_as" not in m and Decimal(m["cost_usd"]) == (1000 * 4 + 100 * 20) / Decimal(10**6)
