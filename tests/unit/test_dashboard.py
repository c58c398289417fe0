"""The chart's Grafana dashboard (helm/probe-runner/dashboards/probe-runner.json) against the
metrics contract of issue 31 (tests/support/dashboard.py's METRICS): it parses, every panel
queries the selected Prometheus, every expression reads only the contract's metrics and labels,
every metric has a panel, and the campaign variable filters every per-campaign series. Whether
each query parses and returns series is the real Prometheus's to say (the node tier, with
dashboard_queries()); the chart ships the same file (tests/integration/test_chart.py)."""

from __future__ import annotations

import re

import pytest

from tests.support.dashboard import METRICS, dashboard_queries, load, metric_names, panels, series_names

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# The panels issue 31 asks for, by title.
TITLES = {"Sessions by state and arm", "Session starts by arm", "Session outcomes by status",
          "Spend, reservations and budget left", "Throttle pauses", "API requests and retries by verb",
          "Exec transfers", "Bytes captured", "Gateway calls by outcome", "Gateway refusals by reason",
          "Upstream latency", "Upstream bytes by direction"}


def queried() -> list[tuple[dict, dict]]:
    return [(p, t) for p in panels(load()) for t in p.get("targets", [])]


def test_it_is_a_dashboard_with_a_datasource_and_a_campaign_variable():
    d = load()
    assert d["schemaVersion"] >= 36 and d["uid"] == "probe-runner" and d["title"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    campaign = variables["campaign"]
    assert campaign["type"] == "query" and campaign["datasource"] == DATASOURCE
    assert campaign["definition"] == campaign["query"]["query"] == "label_values(probe_runner_sessions, campaign)"
    assert campaign["multi"] and campaign["includeAll"] and campaign["allValue"] == ".*"


def test_every_panel_queries_the_selected_prometheus():
    ids = [p["id"] for p in panels(load())]
    assert len(ids) == len(set(ids))
    graphs = [p for p in panels(load()) if p["type"] != "row"]
    assert {p["title"] for p in graphs} >= TITLES
    for p in graphs:
        assert p["datasource"] == DATASOURCE and p["targets"], p["title"]
        assert all(t["datasource"] == DATASOURCE and t["expr"].strip() for t in p["targets"]), p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]


def test_panels_do_not_overlap():
    taken: set[tuple[int, int]] = set()
    for p in panels(load()):
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        cells = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & taken, p["title"]
        taken |= cells


def _labels_of(name: str) -> set[str]:
    base = re.sub(r"_(bucket|sum|count)$", "", name) if name not in METRICS else name
    return set(METRICS[base][1]) | ({"le"} if name.endswith("_bucket") else set())


def test_every_expression_reads_only_the_contracts_metrics_and_labels():
    allowed = series_names()
    for panel, target in queried():
        expr, title = target["expr"], panel["title"]
        read = metric_names(expr)
        assert read and read <= allowed, (title, expr, read - allowed)
        labels = set().union(*(_labels_of(n) for n in read))
        matched = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", "".join(re.findall(r"\{[^}]*\}", expr))))
        grouped = {w.strip() for g in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr) for w in g.split(",") if w.strip()}
        assert matched | grouped <= labels, (title, expr, (matched | grouped) - labels)
        legend = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))
        assert legend <= grouped, (title, target["legendFormat"])


def test_every_per_campaign_series_follows_the_campaign_variable():
    for panel, target in queried():
        for name, selector in re.findall(r"(probe_runner_\w+)(\{[^}]*\})?", target["expr"]):
            if "campaign" in _labels_of(name):
                assert 'campaign=~"$campaign"' in selector, (panel["title"], target["expr"])


def test_every_metric_of_the_contract_has_a_panel():
    read = set().union(*(metric_names(t["expr"]) for _, t in queried()))
    covered = {re.sub(r"_(bucket|sum|count)$", "", n) if n not in METRICS else n for n in read}
    assert covered == set(METRICS)
    histogram = [t["expr"] for _, t in queried() if "histogram_quantile" in t["expr"]]
    assert {re.match(r"histogram_quantile\(([0-9.]+),", e).group(1) for e in histogram} == {"0.5", "0.95", "0.99"}


def test_metric_names_tells_metrics_from_functions_keywords_and_labels():
    assert metric_names('sum by (arm) (rate(a_total{campaign=~"x|y", arm!="b"}[5m]))') == {"a_total"}
    assert metric_names("sum without(pod) (b) / on(le) group_left(x) c offset 1h > bool 0") == {"b", "c"}
    assert metric_names('histogram_quantile(0.9, sum by (le) (rate(h_bucket{s="by (x)"}[1m:30s])))') == {"h_bucket"}
    assert metric_names("count(up) * scalar(d)") == {"up", "d"}


def test_dashboard_queries_substitutes_grafanas_variables(tmp_path):
    got = dashboard_queries(campaign="status-2026-12-02", rate_interval="2m")
    assert len(got) == len(queried())
    assert {title for title, _ in got} >= TITLES
    for title, expr in got:
        assert "$" not in expr, (title, expr)
    assert ("Sessions by state and arm",
            'sum by (state, arm) (probe_runner_sessions{campaign=~"status-2026-12-02"})') in got
    assert any("[2m]" in expr for _, expr in got)
    odd = tmp_path / "d.json"
    odd.write_text('{"panels": [{"title": "t", "targets": [{"expr": "rate(x[$__interval])"}]}]}')
    with pytest.raises(ValueError, match="t: a variable"):
        dashboard_queries(path=odd)
    odd.write_text('{"panels": [{"title": "t", "targets": [{"expr": "x{c=~\\"${campaign}\\"}[${__rate_interval}]"}]}]}')
    assert dashboard_queries(campaign="c1", rate_interval="5m", path=odd) == [("t", 'x{c=~"c1"}[5m]')]
