"""The harness's table of qualified versions is what their kept qualification reports observed
(docs/qualification/VERSION.json, issue 43 "its report is kept in the repository"), and each
kept report, compared again against the table and the prices as they are now, qualifies: so the
gateway allows exactly what was seen, and a table or price edit that no report backs fails here."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest

from runner import harnesses
from runner.qualify import report, table
from runner.settings import DEFAULT_PRICES

DOCS = Path(__file__).parents[2] / "docs" / "qualification"
REPORTS = sorted(DOCS.glob("*.json"))
H = harnesses.HARNESS


def _docs() -> list[dict]:
    return [json.loads(p.read_text()) for p in REPORTS]


def test_every_qualified_version_has_its_report_and_the_table_is_written_from_them():
    assert sorted(d["version"] for d in _docs()) == sorted(H.qualified)
    source = (Path(__file__).parents[2] / "runner" / "harnesses" / "claude_code" / "qualified.py").read_text()
    assert source == table.render(_docs()), "python -m runner.qualify.table docs/qualification/*.json > runner/harnesses/claude_code/qualified.py"
    for doc in _docs():
        assert dict(H.qualified[doc["version"]].models) == table.sends_of(doc)


@pytest.mark.parametrize("path", REPORTS, ids=[p.stem for p in REPORTS])
def test_each_kept_report_qualifies_the_tables_models_against_the_table_and_prices_as_they_are(path):
    """Each model of the table qualifies (nothing blocks it, its conformance sessions all as
    expected); a model the report did not qualify is not in the table, with its reason kept."""
    doc = json.loads(path.read_text())
    again = report.report(doc["version"], doc["cli"], report.results_of(doc), DEFAULT_PRICES)
    assert again["findings"] == doc["findings"]  # the kept verdict is the one the table and prices give now
    table_models = set(H.qualified[doc["version"]].models)
    for model, m in again["models"].items():
        assert m["qualified"] is (model in table_models), model
        if model in table_models:
            assert m["conformance"] == {"sessions": 5, "passed": 5, "failures": {}}, model
        else:
            assert [f for f in again["findings"] if f["model"] == model and f["blocking"] and not f["table"]], model
    assert not [f for f in again["findings"] if f["model"] is None]


def test_the_pinned_version_is_qualified_with_every_model_it_was_run_with():
    doc = json.loads((DOCS / f"{H.version}.json").read_text())
    assert doc["qualified"] is True and len(doc["models"]) >= 10


def _result(**sent) -> report.ModelResult:
    base = {"models": ["claude-sonnet-4-5"], "routes": ["POST /v1/messages"], "queries": ["beta=true"],
            "headers": ["anthropic-beta", "x-app"], "keys": ["model", "messages", "max_tokens"],
            "betas": sorted(H.qualified[H.version].models["claude-sonnet-4-5"].betas), "max_tokens": 32000,
            "context_window": 200000, "requests": 2, "ended": "success"}
    rates = {"input": Decimal(3), "output": Decimal(15), "cache_write": Decimal("3.75"), "cache_read": Decimal("0.3")}
    return report.ModelResult("claude-sonnet-4-5", base | sent, rates, Decimal("0.78"),
                              {"sessions": 5, "passed": 5, "failures": {}})


def test_what_the_pinned_cli_sends_with_sonnet_qualifies_and_each_difference_is_named_with_what_to_do():
    assert report.findings(H.version, [_result()], DEFAULT_PRICES) == []
    found = report.findings(H.version, [_result(betas=[*_result().sent["betas"], "brand-new-2026-12-01"],
                                                keys=["model", "messages", "max_tokens", "mcp_servers"],
                                                headers=["anthropic-beta", "x-app", "x-new-header"],
                                                routes=["POST /v1/messages", "POST /v1/files"])], DEFAULT_PRICES)
    said = {(f.what, f.blocking) for f in found}
    assert ("beta 'brand-new-2026-12-01' has no class", True) in said
    assert ("body key 'mcp_servers' is refused by the gateway", True) in said
    assert ("header 'x-new-header' is not passed by the gateway", False) in said
    assert ("route POST /v1/files is refused by the gateway", True) in said
    assert any(f.table and "betas differ from the table" in f.what for f in found)


def test_a_price_the_cli_states_otherwise_than_the_gateway_blocks_qualification():
    r = _result()
    r.rates["output"] = Decimal(16)
    (f,) = report.findings(H.version, [r], DEFAULT_PRICES)
    assert f.blocking and f.what == "claude-sonnet-4-5's price differs from the CLI's arithmetic (output: CLI 16, gateway 15)"
    r = _result()
    r.long_usd = Decimal("1.56")  # the CLI bills a long prompt at twice the rates: a premium the table lacks
    (f,) = report.findings(H.version, [r], DEFAULT_PRICES)
    assert f.blocking and "a prompt over 200k tokens" in f.what and "long_context" in f.what


def test_a_model_no_price_covers_names_where_its_price_is_set():
    r = _result(models=["claude-new-1"])
    r.model = "claude-new-1"
    found = [f for f in report.findings(H.version, [r], DEFAULT_PRICES) if not f.table]
    assert any(f.blocking and f.what.startswith("claude-new-1 has no price at the gateway; the CLI's own: input 3") for f in found)
