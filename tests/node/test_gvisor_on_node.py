"""Sessions in gVisor's sandbox (issue 31, item 4: "Add it to the node tier as a RuntimeClass of
the node's containerd, and run the campaign, the confinement canary and the channel attacks
under it"). The node's containerd has a second runtime, runsc (gVisor's shim and runsc, built by
build-gvisor.sh), named by the RuntimeClass ``gvisor``; the install sets
session.runtimeClassName to it and images.harness to the harness image's gVisor variant. Here:
``doctor --cluster`` says the runtime and its canary, itself in gVisor, finds every route but the
gateway closed; a campaign runs from submit to pull with every session pod in gVisor, its
confinement measured by canaries in gVisor. The channel attacks run in
test_channel_on_node.py, under both runtimes."""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys

import pytest

from runner import demo
from runner.k8s import jobs

pytestmark = pytest.mark.timeout(1200)
GVISOR_HARNESS = "ghcr.io/probe-runner/harness:0.1.0-gvisor"


def _cli(env: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runner", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def test_doctor_says_the_runtime_and_its_canary_in_gvisor_finds_the_routes_closed(gvisor_install, tmp_path):
    user = gvisor_install.settings_env(tmp_path)
    done = _cli({k: v for k, v in user.items() if not k.startswith("RUNNER_PROVIDER__")}, "doctor", "--cluster",
                timeout=300)
    lines = {m.group(2): (m.group(1), m.group(3)) for m in re.finditer(r"^(ok  |WARN|FAIL) ([^:]+): (.*)$", done.stdout,
                                                                        flags=re.M)}
    assert lines["runtime"] == ("ok  ", "session pods run under RuntimeClass gvisor (handler runsc): gVisor's sandbox; the "
                                "harness image must be its gVisor variant (images.harness "
                                "ghcr.io/probe-runner/harness:<version>-gvisor: gVisor loads only readable executables)"), done.stdout
    verdict, says = lines["cluster confinement"]
    assert verdict == "ok  " and says.startswith("a canary found every route closed but the provider gateway"), done.stdout


def test_a_campaign_runs_in_gvisor_from_submit_to_pull(gvisor_install, bucket, tmp_path):
    node, user = gvisor_install.node, gvisor_install.settings_env(tmp_path)
    campaign = f"gvisor-{secrets.token_hex(3)}"
    plan = json.loads(demo.PLAN.read_text())
    plan.update(campaign=campaign, repetitions=1)  # 2 probes x 2 arms
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    shims = set((node.work / "logs").glob("runsc-shim-*.log"))
    submitted = _cli(user, "submit", str(tmp_path / "plan.json"), "--corpus", str(demo.CORPUS))
    assert submitted.returncode == 0, submitted.stderr
    watched = _cli(user, "status", campaign, "--watch", "--interval", "2", timeout=900)
    job_logs = node.kubectl("-n", gvisor_install.namespace, "logs", f"job/{jobs.job_name(campaign)}", check=False).stdout
    assert watched.returncode == 0, watched.stdout[-2000:] + watched.stderr + job_logs[-3000:]
    status = json.loads(_cli(user, "status", campaign, "--json").stdout)
    if status["sessions"] != {"succeeded": 4}:
        ledger = _cli(user, "ledger", "export", campaign).stdout
        shims = "\n".join(p.read_text()[-1500:] for p in sorted((node.work / "logs").glob("runsc-shim-*.log"))[-3:])
        raise AssertionError(f"{status['sessions']}\n{ledger[-4000:]}\n{job_logs[-4000:]}\n{shims}")

    _, s3 = bucket
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="probes", Prefix=f"campaigns/{campaign}/")["Contents"]]
    captures = [json.loads(s3.get_object(Bucket="probes", Key=k)["Body"].read()) for k in keys if k.endswith("capture.json")]
    assert len(captures) == 4, keys
    for c in captures:
        assert c["pod"]["runtime_class"] == "gvisor" and c["harness"]["image"] == GVISOR_HARNESS, (c["pod"], c["harness"])
        assert c["confinement_checks"] and all(ch["passed"] for ch in c["confinement_checks"]), c["confinement_checks"]
        assert c["exit_code"] == 0 and not c["timed_out"], c
    # Each session pod, and each canary, was a sandbox of gVisor's shim (one shim per pod).
    started = set((node.work / "logs").glob("runsc-shim-*.log")) - shims
    assert len(started) >= len(captures) + 1, sorted(p.name for p in started)

    dest = tmp_path / "pulled"
    pulled = _cli(user, "pull", campaign, "--dest", str(dest))
    assert pulled.returncode == 0, pulled.stderr
    assert len(list(dest.glob("*.md"))) == 2, list(dest.iterdir())
