"""`probe-runner harness qualify` through the real CLI (issue 43, items 1, 3 and 5): what a CLI
sends each model, its own prices against the gateway's, and the conformance sessions through
the gateway; a CLI that sends a beta with no class is not qualified and the report names it;
and a campaign on every model of each qualified version runs end to end through the gateway."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from runner import harnesses
from runner.qualify import conformance
from tests.support.clis import qualified_versions

H = harnesses.HARNESS


def _qualify(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runner", "harness", "qualify", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_the_pinned_cli_is_qualified_with_sonnet_and_its_report_is_the_tables(tmp_path, claude_command):
    out = tmp_path / "report.json"
    done = _qualify("--cli", claude_command[0], "--model", "claude-sonnet-4-5", "--jobs", "1", "--out", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(out.read_text())
    assert doc["version"] == H.version and doc["qualified"] is True
    m = doc["models"]["claude-sonnet-4-5"]
    sends = H.qualified[H.version].models["claude-sonnet-4-5"]
    assert (m["sent"]["models"], set(m["sent"]["betas"]), m["sent"]["max_tokens"]) == ([sends.model], set(sends.betas), sends.max_tokens)
    assert m["cli_rates"] == {"input": "3", "output": "15", "cache_write": "3.75", "cache_read": "0.3"}
    assert m["conformance"] == {"sessions": 5, "passed": 5, "failures": {}}
    assert f"Claude Code {H.version}" in done.stdout and "QUALIFIED" in done.stdout and "Traceback" not in done.stderr


def test_a_cli_that_sends_a_beta_with_no_class_is_not_qualified_and_the_report_says_what_to_do(tmp_path, claude_command):
    """"a new beta, header or key is listed with what it must be classed as before it is allowed"."""
    wrapper = tmp_path / "claude"
    wrapper.write_text(f"#!/bin/sh\nANTHROPIC_BETAS=brand-new-2026-12-01 exec {claude_command[0]} \"$@\"\n")
    wrapper.chmod(0o755)
    out = tmp_path / "report.json"
    done = _qualify("--cli", str(wrapper), "--model", "claude-haiku-4-5", "--no-conformance", "--out", str(out))
    assert done.returncode == 1, done.stdout + done.stderr
    doc = json.loads(out.read_text())
    assert doc["qualified"] is False and "brand-new-2026-12-01" in doc["models"]["claude-haiku-4-5"]["sent"]["betas"]
    (finding,) = [f for f in doc["findings"] if "brand-new" in f["what"] and not f["table"]]
    assert finding["blocking"] and finding["what"] == "beta 'brand-new-2026-12-01' has no class"
    assert "runner/harnesses/claude_code/betas.py" in finding["todo"] and "refused" in finding["todo"]
    assert "NOT QUALIFIED" in done.stdout


def test_a_cli_that_is_neither_a_file_nor_a_version_is_a_clear_error():
    done = _qualify("--cli", "/no/such/claude")
    assert done.returncode == 2 and "is neither an executable file nor a version" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("version", qualified_versions())
def test_a_campaign_on_every_model_of_a_qualified_version_runs_end_to_end_through_the_gateway(version, qualified_cli):
    """Done means: "A campaign on each model of the price table, on each qualified CLI version,
    runs end to end through the gateway with the scripted provider, and its transcripts pass the
    contract suites": the conformance campaign of each model (every tool of the one list, reads
    and writes, the answer, a time-limited and a max-turns session, the CLI's stated cost equal
    to the gateway's meter), four models at once."""
    cli = qualified_cli(version)[0]
    models = H.qualified[version].models

    def one(model: str) -> tuple[str, dict]:
        return model, conformance.run(Path(cli), model, [models[model].model]).record()

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = dict(pool.map(one, sorted(models)))
    assert {m: r for m, r in results.items() if r["failures"] or r["passed"] != r["sessions"]} == {}
    assert len(results) == len(models) >= 2
