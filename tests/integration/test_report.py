"""``probe-runner report`` on a campaign the real CLI ran, opened in a real headless browser
(Debian's Chromium, driven by Playwright): the page loads with no error and no request beyond
its own file, shows each arm and each refusal, and escapes what sessions wrote. The screenshot
stays in ``test-output/report/`` at the repository's root."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from runner.plan import parse_plan
from runner.report.figures import campaign_figures
from runner.store.file import FileStore
from tests.support.campaigns import plan_data, write_corpus

ROOT = Path(__file__).resolve().parents[2]
OUTPUT = Path(os.environ.get("PROBE_RUNNER_TEST_OUTPUT", ROOT / "test-output")) / "report"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
HOSTILE = "/tmp/<img src=x onerror=document.title='pwned'>"  # a path a session names: text on the page, never markup
ANSWERS = ["current HW-DR-0052", "superseded HW-DR-0052"]

SCENARIOS = {"scenarios": [
    {"name": "read", "match": "TASK-READ", "usage": {"input_tokens": 1000, "output_tokens": 50}, "turns": [
        {"tool_uses": [{"name": "Read", "input": {"file_path": "{cwd}/docs/a.md"}}]},
        {"tool_uses": [{"name": "Grep", "input": {"pattern": "Status", "path": "{cwd}/docs"}}]},
        {"text": "The file states it.\nHW-DR-0052 current."}]},
    {"name": "outside", "match": "TASK-OUTSIDE", "usage": {"input_tokens": 2000, "output_tokens": 50}, "turns": [
        {"tool_uses": [{"name": "Read", "input": {"file_path": HOSTILE}}]},
        {"text": "I do not know."}]},
    {"name": "broken", "match": "TASK-BROKEN", "turns": [
        {"error": {"status": 400, "type": "invalid_request_error", "message": "scripted: this request is refused"}, "times": 50}]},
]}


def _probe(pid: str, task: str) -> dict:
    return {"id": pid, "path": f"docs/probes/{pid}.md", "title": f"Probe {pid}", "task": task,
            "answers": ANSWERS, "examines": ["docs/a.md"]}


@pytest.fixture(scope="module")
def campaign(tmp_path_factory, claude_command):
    """Three probes x two arms, run by `probe-runner run` with the real CLI: per arm one session
    with a declared answer, one that names a path outside the workspace and gives none, and one
    the provider refuses, which the recorder refuses in turn."""
    from runner.demo.provider import ScriptedProvider

    root = tmp_path_factory.mktemp("report")
    probes = [_probe("HW-PRB-0001", "TASK-READ: state the status."), _probe("HW-PRB-0002", "TASK-OUTSIDE: look around."),
              _probe("HW-PRB-0003", "TASK-BROKEN: this one fails.")]
    corpus = write_corpus(root / "corpus", probes)
    plan = plan_data("report-1", probes)
    (root / "plan.json").write_text(json.dumps(plan))
    env = {**os.environ, "RUNNER_STORE": (root / "store").as_uri(), "RUNNER_LOCAL__WORKDIR": str(root / "work"),
           "RUNNER_HARNESS__COMMAND": claude_command[0], "RUNNER_PROVIDER__API_KEY": "k",
           "RUNNER_HARNESS__ENV": json.dumps({"CLAUDE_CODE_MAX_RETRIES": "1"})}
    with ScriptedProvider(SCENARIOS) as provider:
        env["RUNNER_PROVIDER__BASE_URL"] = provider.base_url
        ran = subprocess.run([sys.executable, "-m", "runner", "run", str(root / "plan.json"), "--corpus", str(corpus)],
                             capture_output=True, text=True, env=env, timeout=600)
    assert ran.returncode == 12, ran.stdout + ran.stderr  # something was refused
    return {"root": root, "env": env, "store": FileStore(root / "store"), "plan": parse_plan(plan)}


def report(campaign, *args):
    return subprocess.run([sys.executable, "-m", "runner", "report", "report-1", *args], capture_output=True, text=True,
                          env=campaign["env"], timeout=300)


def test_the_figures_count_sessions_as_the_transcripts_do(campaign):
    """The contract: "Every other message records answer: null. The recorder reads the whole
    set and never the expected values." The report counts the answers the recorder derived, a
    null as "no declared answer", and no more; the refused sessions are not recorded."""
    f = campaign_figures(campaign["store"], campaign["plan"], 3600, now="2026-12-04T00:00:00+00:00")
    rows = {(s["probe"], s["arm"]): s for s in f["sessions"]}
    base = campaign["store"].root / "campaigns/report-1"
    for arm in ("present", "absent"):
        assert {k: v for k, v in rows[("HW-PRB-0001", arm)].items() if k != "duration_seconds"} == {
            "probe": "HW-PRB-0001", "session": f"{arm}-001", "arm": arm, "attempt": 1, "outcome": "recorded",
            "status": "succeeded", "answer": "current HW-DR-0052", "cost_usd": rows[("HW-PRB-0001", arm)]["cost_usd"],
            "calls": {"Grep": 1, "Read": 1}, "outside": [],
            "stream": (base / f"sessions/HW-PRB-0001/{arm}-001/stream.jsonl").as_uri(),
            "transcript": (base / f"transcripts/regression-{arm}.md").as_uri()}
        assert rows[("HW-PRB-0002", arm)]["outside"] == [HOSTILE] and rows[("HW-PRB-0002", arm)]["answer"] is None
        assert rows[("HW-PRB-0003", arm)]["outcome"] == "refused" and rows[("HW-PRB-0003", arm)]["transcript"] is None
        assert rows[("HW-PRB-0001", arm)]["duration_seconds"] > 0
        assert f["per_arm"][arm]["outcomes"] == {"recorded": 2, "refused": 1}
        assert f["per_arm"][arm]["transcript_current"] is True
    assert f["outcomes"] == {"recorded": 4, "refused": 2}
    assert f["answers"][0]["answers"] == {"current HW-DR-0052": {"present": 1, "absent": 1},
                                          "superseded HW-DR-0052": {"present": 0, "absent": 0},
                                          "no declared answer": {"present": 0, "absent": 0},
                                          "not recorded": {"present": 0, "absent": 0}}
    assert f["answers"][1]["answers"]["no declared answer"] == {"present": 1, "absent": 1}
    assert f["answers"][2]["answers"]["not recorded"] == {"present": 1, "absent": 1}
    stored = json.loads((base / "transcripts/refusals.json").read_text())["refusals"]
    assert [(r["probe"], r["arm"], r["reason"]) for r in f["refusals"]] == [(r["probe"], r["arm"], r["reason"]) for r in stored]
    assert all("scripted: this request is refused" in r["reason"] for r in f["refusals"])
    # The cost is the streams' own, summed exactly, as the transform's realized cost.
    assert Decimal(f["cost_usd"]) == sum(Decimal(s["cost_usd"]) for s in f["sessions"] if s["cost_usd"] is not None)
    assert f["tools"] == ["Grep", "Read"]


def test_a_transcript_older_than_the_streams_is_flagged(campaign, tmp_path):
    """The report counts from the streams; a stored transcript the transform has not rewritten
    since (here: changed by hand) is named as older, with the command that rewrites it."""
    from runner.report.page import render

    key = campaign["store"].root / "campaigns/report-1/transcripts/regression-absent.md"
    kept = key.read_bytes()
    try:
        key.write_bytes(kept + b"\n")
        f = campaign_figures(campaign["store"], campaign["plan"], 1)
        assert (f["per_arm"]["present"]["transcript_current"], f["per_arm"]["absent"]["transcript_current"]) == (True, False)
        assert render(f).count("older than the stored streams: run <code>probe-runner transform report-1</code>") == 1
    finally:
        key.write_bytes(kept)


def test_the_report_opens_in_a_browser_with_every_arm_and_refusal(campaign):
    from playwright.sync_api import sync_playwright

    out = campaign["root"] / "report.html"
    made = report(campaign, "--out", str(out))
    assert made.returncode == 0, made.stderr
    assert made.stdout.strip() == (f"report: {out} (6 sessions: 4 recorded, 2 refused; 2 refusal(s); realized cost "
                                   f"${Decimal(campaign_figures(campaign['store'], campaign['plan'], 1)['cost_usd']):.4f})")
    OUTPUT.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            problems: list[str] = []
            requests: list[str] = []
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(out.as_uri(), wait_until="load")
            for chart in ("outcomes", "cost", "duration", "calls"):  # plotly drew each chart
                page.locator(f"#chart-{chart} .main-svg").first.wait_for(state="visible", timeout=30_000)
            page.screenshot(path=str(OUTPUT / "report.png"), full_page=True)
            assert problems == []
            assert requests == [out.as_uri()]  # everything inline: nothing else was fetched
            legend = page.locator("#chart-outcomes .legendtext").all_text_contents()
            assert legend == ["recorded", "refused"]
            ticks = page.locator("#chart-outcomes .xtick").all_text_contents()
            assert ticks == ["present", "absent"]
            rows = page.locator("#refusals tr.refusal").all_inner_texts()
            assert len(rows) == 2
            for arm, row in zip(("present", "absent"), rows, strict=True):
                assert arm in row and "HW-PRB-0003" in row and "scripted: this request is refused" in row
            outside = page.locator("#outside").inner_text()
            assert HOSTILE in outside  # shown as text, so the handler never ran
            assert page.title() == "Campaign report-1: report"
            links = page.locator("#sessions a").evaluate_all("(as) => as.map(a => a.href)")
            assert (campaign["store"].root / "campaigns/report-1/sessions/HW-PRB-0003/absent-001/stream.jsonl").as_uri() in links
            assert all(Path(link.removeprefix("file://")).is_file() for link in links)
        finally:
            browser.close()
    print(f"screenshot: {OUTPUT / 'report.png'}")


def test_bad_input_is_one_clear_line(campaign, tmp_path):
    out = report(campaign, "--out", str(tmp_path / "no-such-dir" / "r.html"))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().endswith(f"--out {tmp_path / 'no-such-dir' / 'r.html'}: {tmp_path / 'no-such-dir'} is not a directory")
    out = subprocess.run([sys.executable, "-m", "runner", "report", "no-such-campaign"], capture_output=True, text=True,
                         env=campaign["env"], timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr and "no-such-campaign" in out.stderr
