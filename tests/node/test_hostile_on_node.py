"""A hostile session on the real node (issue 28, item 6): submitted with ``probe-runner submit``
into the installed chart, the real Claude Code CLI in the harness image, its Bash running
tools/hostile.py (tests/integration/hostile_attack.py) with the token and gateway URL it finds
in its environment. Each route is refused with its reason in the gateway's log, or metered at
the provider's usage; the gateway's pods are found by a scan of the pod network and called by
their own addresses; and the campaign's books stay within its budget and match the meter.
The same session through the local executor is tests/integration/test_hostile_session.py."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from decimal import Decimal

import hostile  # tests/hostile.py
import pytest

from runner import layout
from runner.k8s import jobs

pytestmark = pytest.mark.timeout(900)
REASONS = ("the tool type 'web_fetch_20250910' is not a client-side tool", "the request holds 'mcp_servers'",
           "the model 'claude-opus-4-1' is not the campaign's",
           "max_tokens 10000000 is over the most claude-sonnet-4-5's qualified CLI asks for (32000; "
           "gateway.max_tokens)",
           "the beta 'context-1m-2025-08-07' is refused", "token refused: forged")


def _cli(env: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runner", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def _usd(usage: dict) -> Decimal:
    return (usage["input_tokens"] * 3 + usage["output_tokens"] * 15) / Decimal(10**6)  # Sonnet's list price


def test_a_hostile_session_on_the_real_node_is_refused_or_metered_and_the_books_hold(install, provider, bucket,
                                                                                    tmp_path):
    user = install.settings_env(tmp_path)
    campaign = f"hostile-{secrets.token_hex(3)}"
    (tmp_path / "plan.json").write_text(json.dumps(hostile.plan_data(campaign)))
    corpus = hostile.corpus(tmp_path / "corpus")
    submitted = _cli(user, "submit", str(tmp_path / "plan.json"), "--corpus", str(corpus),
                     "--session-budget-usd", "1", "--budget-usd", "10")
    assert submitted.returncode == 0, submitted.stderr
    watched = _cli(user, "status", campaign, "--watch", "--interval", "2", timeout=600)
    ns = install.namespace
    job_logs = install.node.kubectl("-n", ns, "logs", f"job/{jobs.job_name(campaign)}", check=False).stdout
    gateway_logs = install.node.kubectl("-n", ns, "logs", f"deploy/{install.release}-gateway", check=False).stdout
    assert watched.returncode == 0, watched.stderr + job_logs
    status = json.loads(_cli(user, "status", campaign, "--json").stdout)
    assert status["sessions"] == {"succeeded": 1}, (status, job_logs)
    _, s3 = bucket
    keys = layout.SessionKeys(campaign, hostile.PROBE["id"], "present-001")
    raw = s3.get_object(Bucket="probes", Key=keys.stream)["Body"].read().decode()
    results = [b["content"] for line in raw.splitlines() if (o := json.loads(line)).get("type") == "user"
               for b in o["message"]["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]
    (report,) = results
    text = report if isinstance(report, str) else report[0]["text"]
    seen = dict(line.split(" ", 1) for line in text.splitlines() if " " in line)
    assert "gateway-pods" in seen, text
    pods = int(seen.pop("gateway-pods"))
    assert pods == 1  # the install's one replica, found by the scan and called by its own address
    assert seen == {"server-tool": "400", "mcp-server": "400", "other-model": "400", "huge-max-tokens": "400",
                    "1m-beta": "400", "forged-token": "401", "cut-stream": "200", "direct-0": "200", "direct-1": "200",
                    "side-call": "200"}, report
    for reason in REASONS:
        assert reason in gateway_logs, (reason, gateway_logs[-3000:])
    capture = json.loads(s3.get_object(Bucket="probes", Key=keys.capture)["Body"].read())
    meter = capture["gateway"]
    # the CLI's two calls; the cut stream (read to its end), the two direct calls and the side call
    # the forged token's refusal names no attempt it could be counted on
    assert meter["refused"] == len(REASONS) - 1 and meter["calls"] == 2 + 4, meter
    assert Decimal(meter["cost_usd"]) == 2 * _usd(hostile.CLI_USAGE) + 4 * _usd(hostile.SIDE_USAGE), meter
    assert "held_usd" not in meter  # the gateway gave back what it held beyond the spend
    assert Decimal(status["budget"]["spent_usd"]) == Decimal(meter["cost_usd"]) <= 10, status
