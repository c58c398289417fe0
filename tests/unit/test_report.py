"""The campaign report's figures from a ledger with no captured session yet (every state the
ledger can hold), and its page: every value escaped, every asset inline."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import pytest

from runner import layout
from runner.demo import PLAN
from runner.ledger import Ledger
from runner.plan import parse_plan
from runner.report.figures import campaign_figures
from runner.report.page import render
from runner.store.file import FileStore

NOW = "2026-12-04T12:00:00+00:00"


def _fetched(page: str) -> list[str]:
    """Every src and href of the page's elements but in-page anchors (the parser reads a
    script's text as text, so the URLs in plotly.js's strings are not among them)."""
    found: list[str] = []

    class Parser(HTMLParser):
        def handle_starttag(self, tag, attrs):
            found.extend(v for k, v in attrs if k in ("src", "href") and v and not v.startswith("#"))

    Parser().feed(page)
    return found


@pytest.fixture
def campaign(tmp_path):
    """The demo's plan (2 probes x 2 arms x 2 repetitions), its sessions in every state but
    succeeded: what `report` shows of a campaign that is running, or went wrong."""
    store = FileStore(tmp_path / "store")
    plan = parse_plan(json.loads(PLAN.read_text()) | {"campaign": "c1"})
    store.put(layout.identifiers_key("c1"), json.dumps({"identifiers": []}).encode())
    ledger = Ledger(store, "c1")
    s = [spec.key for spec in plan.sessions()]  # HW-PRB-0007 present-001, -002, absent-001, -002, then HW-PRB-0008's
    for key in s[:6]:
        ledger.intent(key, 1, {})
    for key in s[1:6]:
        ledger.start(key, 1, {"reserved_usd": "1.00", "campaign_usd": "10"})
    ledger.outcome(s[2], 1, "failed", {"reason": "OSError: the node went away"})
    ledger.outcome(s[3], 1, "interrupted", {"reason": "the runner stopped"})
    ledger.outcome(s[4], 1, "interrupted")
    ledger.close(s[4], 1)
    ledger.outcome(s[5], 1, "refused", {"reason": "cannot seal the workspace: x"})
    return store, plan


def test_every_ledger_state_is_an_outcome_of_the_report(campaign):
    store, plan = campaign
    f = campaign_figures(store, plan, 3600, now=NOW)
    sessions = [(s["probe"], s["session"], s["status"], s["outcome"]) for s in f["sessions"]]
    assert sessions == [
        ("HW-PRB-0007", "present-001", "intended", "not started"),
        ("HW-PRB-0007", "present-002", "started", "running"),
        ("HW-PRB-0007", "absent-001", "failed", "failed"),
        ("HW-PRB-0007", "absent-002", "interrupted", "interrupted"),
        ("HW-PRB-0008", "present-001", "cancelled", "cancelled"),
        ("HW-PRB-0008", "present-002", "refused", "refused"),
        ("HW-PRB-0008", "absent-001", "pending", "not started"),
        ("HW-PRB-0008", "absent-002", "pending", "not started"),
    ]
    assert f["sessions"][2] == {"probe": "HW-PRB-0007", "session": "absent-001", "arm": "absent", "attempt": 1,
                                "outcome": "failed", "status": "failed", "answer": None, "cost_usd": None,
                                "duration_seconds": None, "calls": {}, "outside": [], "stream": None, "transcript": None}
    empty_arm = {"cost_usd": "0", "costed": 0, "mean_cost_usd": None, "median_seconds": None, "max_seconds": None,
                 "calls": 0, "outside": 0, "transcript": None, "transcript_current": None}
    assert {k: v for k, v in f.items() if k not in ("sessions", "answers")} == {
        "campaign": "c1", "tier": "campaign", "model": plan.model, "store": store.uri, "generated_at": NOW,
        "link_seconds": 3600, "arms": ["present", "absent"], "probes": 2, "repetitions": 2, "planned": 8,
        "outcomes": {"refused": 1, "failed": 1, "interrupted": 1, "cancelled": 1, "running": 1, "not started": 3},
        "cost_usd": "0", "gateway": None,
        # four attempts settled at their whole reservation (none stated a cost), one still holds its own
        "budget": {"campaign_usd": "10", "spent_usd": "4.00", "reserved_usd": "1.00", "left_usd": "5.00"},
        "per_arm": {
            "present": {"sessions": 4, "outcomes": {"refused": 1, "cancelled": 1, "running": 1, "not started": 1}, **empty_arm},
            "absent": {"sessions": 4, "outcomes": {"failed": 1, "interrupted": 1, "not started": 2}, **empty_arm},
        },
        "tools": [],
        "refusals": [{"scope": "session", "probe": "HW-PRB-0008", "session": "present-002", "arm": "present",
                      "status": "refused", "reason": "not recorded: refused: cannot seal the workspace: x"}],
        "not_recorded": {"not recorded: the session has not run": 2,
                         "not recorded: journaled but never started (nothing was spent); the next run starts it": 1,
                         "not recorded: interrupted: the session may or may not have executed (ledger recover settles it)": 1,
                         "not recorded: failed: OSError: the node went away": 1,
                         "not recorded: interrupted: the runner stopped": 1,
                         "not recorded: cancelled with ledger cancel": 1},
        "phases": {"phases": {}, "slowest": []},  # no session was captured: none has phases
    }
    assert f["answers"][0] == {"probe": "HW-PRB-0007", "title": plan.probes[0].title, "answers": {
        **{a: {"present": 0, "absent": 0} for a in plan.probes[0].answers},
        "no declared answer": {"present": 0, "absent": 0}, "not recorded": {"present": 2, "absent": 2}}}


def test_the_page_escapes_what_sessions_wrote_and_loads_nothing(campaign):
    store, plan = campaign
    f = campaign_figures(store, plan, 3600, now=NOW)
    hostile = "</script><script>document.title='pwned'</script><img src=x onerror=alert(1)>"
    f["refusals"][0]["reason"] = hostile
    f["sessions"][0]["outside"] = [hostile]
    page = render(f)
    assert hostile not in page and "&lt;img src=x onerror=alert(1)&gt;" in page
    # plotly.js, then the one chart there is data for: no session was captured, so no cost,
    # duration or call was.
    assert page.count("<script>") == 2 and 'id="chart-outcomes"' in page
    assert not any(f'id="chart-{c}"' in page for c in ("cost", "duration", "calls"))
    # Nothing the browser would fetch: no src or href but in-page anchors, and a policy that
    # lets the page load nothing from anywhere.
    assert _fetched(page) == []
    assert "default-src 'none'" in page
    assert "No session stated a cost yet." in page and "No captured session made a call." in page


def test_without_the_report_extra_the_command_says_what_to_install(tmp_path):
    """The runner image installs the package without its report extra, so plotly may be absent."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['plotly'] = None; from runner.cli import main; "
            f"sys.exit(main(['report', 'c1', '--store', {(tmp_path / 'store').as_uri()!r}]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "pip install 'probe-runner[report]'" in out.stderr
