"""The campaign report as one HTML file: the figures of ``figures.py`` drawn with plotly, laid
out by a Jinja template that escapes every value (paths and reasons come from sessions), and
plotly.js inline, so the file opens anywhere with no server and no network. Its Content
Security Policy lets the page load nothing from anywhere: only its own inline script and styles.
"""

from __future__ import annotations

import html
from importlib import resources
from typing import Any

import jinja2
import plotly.graph_objects as go
import plotly.io as pio
from markupsafe import Markup
from plotly.offline import get_plotlyjs

from runner.budget import dollars
from runner.report.figures import OUTCOMES

COLOURS = {"recorded": "#2e7d32", "refused": "#c62828", "failed": "#ef6c00", "interrupted": "#6a1b9a",
           "cancelled": "#757575", "running": "#1565c0", "not started": "#bdbdbd"}
ARM_COLOURS = ["#1565c0", "#ef6c00", "#2e7d32", "#6a1b9a", "#00838f", "#ad1457"]
CONFIG = {"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["sendDataToCloud"]}


def _label(text: str) -> str:
    """A value from a stream as plotly text: plotly reads a few tags in labels, so none gets in."""
    return html.escape(text, quote=False)


def _layout(fig: go.Figure, title: str | None, y: str, **kw: Any) -> go.Figure:
    """A chart under its section's heading (no title of its own), or one of two under one."""
    fig.update_layout(title={"text": title, "x": 0} if title else None, yaxis_title=y, template="plotly_white", height=340,
                      margin={"l": 60, "r": 20, "t": 50 if title else 20, "b": 40}, legend={"orientation": "h", "y": -0.15}, **kw)
    return fig


def _outcomes(f: dict[str, Any]) -> go.Figure:
    arms = f["arms"]
    fig = go.Figure([go.Bar(name=k, x=arms, y=[f["per_arm"][a]["outcomes"].get(k, 0) for a in arms], marker_color=COLOURS[k])
                     for k in OUTCOMES if any(f["per_arm"][a]["outcomes"].get(k) for a in arms)])
    return _layout(fig, None, "sessions", barmode="stack", legend_traceorder="normal")


def _per_session(f: dict[str, Any], value: str, title: str, y: str) -> go.Figure | None:
    traces = []
    for i, arm in enumerate(f["arms"]):
        rows = [s for s in f["sessions"] if s["arm"] == arm and s[value] is not None]
        if rows:
            traces.append(go.Box(name=arm, y=[float(s[value]) for s in rows], boxpoints="all", jitter=0.4, pointpos=0,
                                 hovertext=[f"{s['probe']} {s['session']}" for s in rows],
                                 marker_color=ARM_COLOURS[i % len(ARM_COLOURS)]))
    return _layout(go.Figure(traces), title, y, showlegend=False) if traces else None


def _calls(f: dict[str, Any]) -> go.Figure | None:
    tools = f["tools"]
    traces = []
    for i, arm in enumerate(f["arms"]):
        rows = [s for s in f["sessions"] if s["arm"] == arm and s["outcome"] in ("recorded", "refused") and s["stream"]]
        if rows and tools:
            traces.append(go.Box(name=arm, x=[_label(t) for s in rows for t in tools], y=[s["calls"].get(t, 0) for s in rows for t in tools],
                                 boxpoints="all", jitter=0.4, pointpos=0, marker_color=ARM_COLOURS[i % len(ARM_COLOURS)],
                                 hovertext=[f"{s['probe']} {s['session']}" for s in rows for _ in tools]))
    return _layout(go.Figure(traces), None, "calls in one session", boxmode="group") if traces else None


def _usd(amount: object) -> str:
    return "—" if amount is None else dollars(amount)


def _seconds(value: object) -> str:
    return "—" if value is None else f"{float(str(value)):.1f} s"


def render(figures: dict[str, Any]) -> str:
    """The report's HTML: one file, every asset inline."""
    charts = {}
    for name, fig in (("outcomes", _outcomes(figures)),
                      ("cost", _per_session(figures, "cost_usd", "Cost per session (as its stream states it)", "US dollars")),
                      ("duration", _per_session(figures, "duration_seconds", "Duration per session (the harness's wall time)", "seconds")),
                      ("calls", _calls(figures))):
        charts[name] = None if fig is None else pio.to_html(fig, full_html=False, include_plotlyjs=False,
                                                            div_id=f"chart-{name}", config=CONFIG)
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["usd"] = _usd
    env.filters["seconds"] = _seconds
    env.filters["seconds3"] = lambda v: f"{float(v):.3f} s"
    template = env.from_string(resources.files("runner.report").joinpath("page.html.j2").read_text("utf-8"))
    return template.render(f=figures, charts=charts, outcomes=OUTCOMES, colours=COLOURS,
                           plotly_js=get_plotlyjs(), markup=Markup)
