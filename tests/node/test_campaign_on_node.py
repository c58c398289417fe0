"""End to end on the real node, as a user and an operator would do it: the chart installed with
the real helm (restricted Pod Security), a campaign submitted with ``probe-runner submit``
(bucket: moto on the host), the controller Job running real session pods from the built images
(the real Claude Code CLI, holding a token of its own attempt, through the provider gateway,
which calls the scripted provider over TLS under its host name with the key),
``status --watch`` to the end, verified transcripts pulled."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys

import pytest

from runner import demo
from runner.k8s import jobs

pytestmark = pytest.mark.timeout(1200)


def _cli(env: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runner", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def test_a_campaign_runs_in_real_pods_from_submit_to_pull(install, provider, bucket, tmp_path):
    node, user = install.node, install.settings_env(tmp_path)
    campaign = f"node-{secrets.token_hex(3)}"
    plan = json.loads(demo.PLAN.read_text())
    plan.update(campaign=campaign, repetitions=1)  # 2 probes x 2 arms
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan))

    submitted = _cli(user, "submit", str(plan_file), "--corpus", str(demo.CORPUS))
    assert submitted.returncode == 0, submitted.stderr
    watched = _cli(user, "status", campaign, "--watch", "--interval", "2", timeout=900)
    job_logs = node.kubectl("-n", install.namespace, "logs", f"job/{jobs.job_name(campaign)}", check=False).stdout
    assert watched.returncode == 0, watched.stderr + job_logs
    bars = [line for line in watched.stdout.splitlines() if line.startswith("[")]
    assert bars[-1].startswith("[########################] 4/4 final, 0 running"), watched.stdout
    # The watch ends once the Job's transform wrote the transcripts, not at the last outcome: a
    # pull right after it once found no SHA256SUMS.
    assert bars[-1].endswith(", transcripts ready"), watched.stdout
    assert "succeeded: 4" in watched.stdout

    status = json.loads(_cli(user, "status", campaign, "--json").stdout)
    assert status["sessions"] == {"succeeded": 4}, (status, job_logs)

    # Each capture record names the digest its harness ran from, and the confinement checks.
    _, s3 = bucket
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="probes", Prefix=f"campaigns/{campaign}/")["Contents"]]
    captures = [json.loads(s3.get_object(Bucket="probes", Key=k)["Body"].read()) for k in keys if k.endswith("capture.json")]
    assert len(captures) == 4, keys
    for c in captures:
        assert c["harness"]["image_id"] and "sha256:" in c["harness"]["image_id"], c["harness"]
        assert c["confinement_checks"] and all(ch["passed"] for ch in c["confinement_checks"])
        # Owned by the controller Job: the downward API gave the controller its Job's name.
        assert c["pod"]["owner"] == jobs.job_name(campaign), c["pod"]
        # Every call went through the gateway, which metered it into the attempt's Lease.
        assert c["gateway"]["calls"] >= 1 and not c["gateway"]["refused"], c["gateway"]
    # The provider saw the key on every call, never a session's token (the sessions held no key).
    assert {r["credential"] for r in provider.server.requests if r["path"].startswith("/v1/messages")} == {"key"}
    # The demo's superseding-decision sessions write their note into a 0700 directory (mkdir -m
    # 700, as mktemp -d makes): before, the reader's tar (another uid) could not enter it, the
    # session failed and its files were lost.
    noted = [c for c in captures if "notes/supersession.md" in (c["artifacts"] or {}).get("stored", [])]
    assert len(noted) == 2, [c["artifacts"] for c in captures]

    dest = tmp_path / "pulled"
    pulled = _cli(user, "pull", campaign, "--dest", str(dest))
    assert pulled.returncode == 0, pulled.stderr
    transcripts = sorted(dest.glob("*.md"))
    assert len(transcripts) == 2, list(dest.iterdir())
    for t in transcripts:
        text = t.read_text()
        assert "Confinement was measured, not assumed" in text
        assert ("In every check each route was closed but the provider gateway and the provider gateway's key check "
                "(a token count), which answered.") in text

    # The controller's transform parsed the streams in 2 processes of its pod (the chart's
    # transformParallelMinBytes is 0 here, its CPU limit 2): read-only root, non-root, spawned
    # interpreters. Its transcripts are byte for byte what one process makes of the same streams.
    node.kubectl("-n", install.namespace, "wait", "--for=condition=complete", f"job/{jobs.job_name(campaign)}", "--timeout=120s")
    job_logs = node.kubectl("-n", install.namespace, "logs", f"job/{jobs.job_name(campaign)}").stdout
    assert '"parsing 4 streams (' in job_logs and 'bytes) in 2 processes"' in job_logs, job_logs[-3000:]
    one = subprocess.run([sys.executable, "-c", ONE_PROCESS_TRANSFORM, campaign], env=user, capture_output=True,
                         text=True, timeout=120)
    assert one.returncode == 0, one.stderr
    assert {f"campaign-{arm}.md": text for arm, text in json.loads(one.stdout).items()} == \
        {t.name: t.read_text() for t in transcripts}


ONE_PROCESS_TRANSFORM = """
import json, sys
from runner.corpus import load_stored_plan
from runner.settings import load_settings
from runner.store import open_store
from runner.transform.run import transform_campaign
settings = load_settings()
store = open_store(settings.store, settings)
print(json.dumps(transform_campaign(store, load_stored_plan(store, sys.argv[1]), workers=1).transcripts))
"""


def test_doctor_measures_the_installs_confinement_with_a_canary(install, tmp_path):
    """`probe-runner doctor --cluster` on the real node (issue 16, item 3): the chart's settings
    and a ready gateway hold, and a canary pod finds every route closed but the provider
    gateway. (KWOK's cluster tier can only say it was not measured.)"""
    done = _cli(install.settings_env(tmp_path), "doctor", "--cluster", timeout=300)
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines())
    assert lines["ok   chart"].startswith(f"the chart is installed as {install.release}"), done.stdout + done.stderr
    assert lines["ok   route"] == "1 provider gateway pod(s) ready", done.stdout
    assert lines["ok   cluster confinement"].startswith(
        "a canary found every route closed but the provider gateway; the provider gateway's key check (a token count)"), done.stdout
    assert done.returncode == 0, done.stdout + done.stderr
