"""The chart's Grafana dashboard (helm/probe-runner/dashboards/probe-runner.json) read as its
queries, and the metric names it may query: the contract between runner/metrics.py and the
dashboard (issue 31, item 1).

``dashboard_queries()`` gives every panel's PromQL with Grafana's variables replaced, so a check
against a real Prometheus can run each one as Grafana would; ``metric_names()`` gives the metrics
an expression reads, for the unit test that holds the dashboard to ``METRICS``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).resolve().parents[2] / "helm" / "probe-runner" / "dashboards" / "probe-runner.json"

# name -> (type, labels): what the controller and the gateway serve. Counters end in _total.
METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    # the controller (one per campaign's Job)
    "probe_runner_sessions": ("gauge", ("campaign", "arm", "state")),
    "probe_runner_session_starts_total": ("counter", ("campaign", "arm")),
    "probe_runner_session_outcomes_total": ("counter", ("campaign", "arm", "status")),
    "probe_runner_spend_usd_total": ("counter", ("campaign",)),
    "probe_runner_budget_reserved_usd": ("gauge", ("campaign",)),
    "probe_runner_budget_left_usd": ("gauge", ("campaign",)),
    "probe_runner_throttle_pauses_total": ("counter", ("campaign",)),
    "probe_runner_api_requests_total": ("counter", ("verb",)),
    "probe_runner_api_retries_total": ("counter", ("verb",)),
    "probe_runner_exec_transfers_total": ("counter", ()),
    "probe_runner_captured_bytes_total": ("counter", ("campaign",)),
    "probe_runner_session_phase_seconds": ("histogram", ("campaign", "phase")),
    # the gateway
    "probe_runner_gateway_calls_total": ("counter", ("outcome",)),
    "probe_runner_gateway_refusals_total": ("counter", ("reason",)),
    "probe_runner_gateway_canary_refusals_total": ("counter", ("reason",)),
    "probe_runner_gateway_upstream_seconds": ("histogram", ()),
    "probe_runner_gateway_upstream_bytes_total": ("counter", ("direction",)),
}


def series_names() -> set[str]:
    """The names a query may select: each metric's, and a histogram's _bucket, _sum and _count."""
    out = set()
    for name, (kind, _) in METRICS.items():
        out |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"} if kind == "histogram" else {name}
    return out


# What is not a metric name in the dashboard's PromQL: keywords and modifiers (functions and
# aggregations are known by the "(" after them).
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or", "unless",
             "inf", "nan"}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
# An identifier, then what makes it a call: "(", or an aggregation's "by (...)"/"without (...)" before it.
_IDENT = re.compile(r"(?<![\w:.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\(|\s+(?:by|without)\s*\()?")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: every identifier that is not a function or
    aggregation (followed by "(" or by its by/without clause), a keyword, a label name inside {...} or by/without (...), or part
    of a range or a string."""
    text = _STRING.sub('""', expr)
    text = re.sub(r"\{[^}]*\}", "{}", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "[]", text)  # ranges and subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1 ()", text)
    names = set()
    for m in _IDENT.finditer(text):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in _KEYWORDS:
            continue
        names.add(word)
    return names


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, those inside collapsed rows too."""
    out = []
    for p in dashboard.get("panels", []):
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def load(path: Path = DASHBOARD) -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(path.read_text())
    return dashboard


def dashboard_queries(campaign: str = ".*", rate_interval: str = "1m", path: Path = DASHBOARD) -> list[tuple[str, str]]:
    """[(panel title, expr)] for every target of every panel, with ``$campaign`` replaced by
    ``campaign`` (a regex, as Grafana gives a multi-value variable: ".*" for All) and
    ``$__rate_interval`` by ``rate_interval`` (a Prometheus duration). A variable left over is an
    error: the query would not parse."""
    values = {"campaign": campaign, "__rate_interval": rate_interval}
    out = []
    for panel in panels(load(path)):
        for target in panel.get("targets", []):
            expr = re.sub(r"\$\{(\w+)\}|\$(\w+)",
                          lambda m: values.get(m.group(1) or m.group(2), m.group(0)), target["expr"])
            if "$" in expr:
                raise ValueError(f"{panel['title']}: a variable dashboard_queries does not know in {expr!r}")
            out.append((panel["title"], expr))
    return out
