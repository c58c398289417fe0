"""An operator's second day on the real node (issue 29's done-means): the operator's manual
(docs/operating.md, "Operating it on a cluster") played command for command, through bash, the
real helm, kubectl and CLI, in the order an operator meets them, with each story ending where the
manual says it ends:

1. a wrong key in the install (the manual's own placeholder ``sk-...``): ``helm test`` and
   ``doctor --cluster`` name it, a campaign submitted anyway stops before its first session
   (exit 2, nothing journaled, nothing sent to the provider but key checks); the key fixed as
   the manual says (the Secret, the gateway's restart, ``helm test`` right after the rollout),
   the campaign submitted again runs to its transcripts, pulled;
2. a budget stop (exit 3), a resubmit with other flags while its Job exists (refused, exit 2),
   and the budget raised by deleting the Job and submitting again: nothing repeats;
3. the provider refusing the key mid-campaign (403: a key without the permission): the run
   halts (exit 2) naming the sessions that failed on it, and after the key is fixed one resume
   Job runs them again and starts the rest;
4. the uninstall.

Only what this machine cannot give is changed in a command, each change listed in ``SUBS`` or
beside the call: the chart gets this node's values (its images, the scripted provider's address
and CA, moto's endpoint) as one more ``-f``. The test ends by checking that every command of the
section was played, so a command added to the manual without its story here fails it."""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runner import demo
from runner.k8s import names
from runner.ledger import Ledger
from runner.settings import Settings
from runner.store import open_store
from tests.support.waiting import until

pytestmark = pytest.mark.timeout(2400)
REPO = Path(__file__).resolve().parents[2]
OPERATING = REPO / "docs" / "operating.md"  # the operator's manual (the manual's section until issue 30, item 5)
NS = "probe-runner"  # the manual's namespace and release
RIGHT_KEY = "demo-key"  # what the scripted provider accepts (conftest.serve_provider)
SECOND_KEY = "sk-second-key"  # the key it accepts once the first lost its permission (story 3)


def section_commands() -> list[str]:
    """The shell commands of the operator's manual, in order, without their comments:
    continuation lines joined, each once."""
    text = OPERATING.read_text()
    section = text.split("# Operating it on a cluster\n", 1)[1].split("\n## ", 1)[0]
    commands: list[str] = []
    for indent, body in re.findall(r"^( *)```sh\n(.*?)^\1```", section, flags=re.M | re.S):
        joined = "\n".join(line.removeprefix(indent) for line in body.splitlines()).replace("\\\n", " ")
        for line in joined.splitlines():
            command = " ".join(re.sub(r"(^|\s)#\s.*$", "", line).split())
            if command and command not in commands:
                commands.append(command)
    return commands


class Operator:
    """A workstation that types the manual's commands: bash in ``cwd`` with the tools on PATH."""

    def __init__(self, node: Any, tmp: Path, bucket_endpoint: str, helm: str, bucket_env: dict[str, str]) -> None:
        self.commands = section_commands()
        self.played: set[str] = set()
        self.cwd = tmp / "ws"
        self.cwd.mkdir()
        (self.cwd / "helm").symlink_to(REPO / "helm")  # `helm install ... helm/probe-runner`
        (tmp / "corpus").symlink_to(demo.CORPUS)  # `--corpus ../corpus`
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        for name, target in (("kubectl", node.bins["kubectl"]), ("helm", helm)):
            (bin_dir / name).symlink_to(target)
        (bin_dir / "probe-runner").write_text(  # this checkout's runner, whatever the editable install names
            f"#!/bin/sh\nPYTHONPATH={shlex.quote(str(REPO))} exec {shlex.quote(sys.executable)} -m runner \"$@\"\n")
        (bin_dir / "probe-runner").chmod(0o755)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
        self.env.update({**bucket_env, "PATH": f"{bin_dir}:{os.environ['PATH']}", "KUBECONFIG": str(node.kubeconfig),
                         "RUNNER_KUBE__KUBECONFIG": str(node.kubeconfig), "RUNNER_S3__ENDPOINT_URL": bucket_endpoint,
                         "RUNNER_LOCAL__WORKDIR": str(tmp / "user"), "HELM_CACHE_HOME": str(tmp / "helm-cache"),
                         "HELM_CONFIG_HOME": str(tmp / "helm-config"), "HELM_DATA_HOME": str(tmp / "helm-data")})

    def find(self, prefix: str) -> str:
        """The command that is ``prefix``, else the one command that begins with it."""
        found = [c for c in self.commands if c == prefix] or [c for c in self.commands if c.startswith(prefix)]
        assert len(found) == 1, f"docs/operating.md has {len(found)} commands starting {prefix!r}: {found}"
        return found[0]

    def run(self, prefix: str, subs: dict[str, str] | None = None, extra: str = "", timeout: float = 300,
            expect: int | None = 0) -> subprocess.CompletedProcess[str]:
        """The manual's command beginning with ``prefix``, with ``subs`` (manual text -> this
        machine's) and ``extra`` words appended, run through bash; ``expect``: its exit status."""
        line = self.find(prefix)
        self.played.add(line)
        for old, new in (subs or {}).items():
            assert old in line, (old, line)
            line = line.replace(old, new)
        done = subprocess.run(["bash", "-c", f"{line} {extra}"], cwd=self.cwd, env=self.env, capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        print(f"$ {line} {extra}\n[exit {done.returncode}]\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        if expect is not None:
            assert done.returncode == expect, f"{line}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done

    def export(self, prefix: str) -> None:
        """An ``export A=B C=D`` line of the manual, into the workstation's environment."""
        command = self.find(prefix)
        self.played.add(command)
        for word in shlex.split(command)[1:]:
            name, _, value = word.partition("=")
            self.env[name] = value

    def plan(self, campaign: str, **fields: Any) -> None:
        """plan.json in the working directory: the demo's plan as ``campaign``."""
        data = json.loads(demo.PLAN.read_text())
        data.update(campaign=campaign, **fields)
        (self.cwd / "plan.json").write_text(json.dumps(data))


def _job(submitted: subprocess.CompletedProcess[str]) -> str:
    match = re.search(r"^controller job: [^/]+/(\S+) ", submitted.stdout, flags=re.M)
    assert match, submitted.stdout
    return match.group(1)


def _ledger(op: Operator, campaign: str) -> Ledger:
    """The campaign's ledger as the workstation reads it (the bucket's credentials: the test's
    environment, monkeypatch)."""
    settings = Settings(store=op.env["RUNNER_STORE"], s3={"endpoint_url": op.env["RUNNER_S3__ENDPOINT_URL"],
                                                          "region": op.env["RUNNER_S3__REGION"]})
    return Ledger(open_store(settings.store, settings), campaign)


def _watch(op: Operator, campaign: str, expect: int) -> str:
    done = op.run("probe-runner status CAMPAIGN --watch", {"CAMPAIGN": campaign}, "--interval 2", timeout=900,
                  expect=None)
    logs = subprocess.run(["bash", "-c", f"kubectl -n {NS} logs -l app.kubernetes.io/component=controller "
                                         "--tail=40 --prefix"], env=op.env, capture_output=True, text=True).stdout
    assert done.returncode == expect, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}\n{logs}"
    return done.stdout + done.stderr


def _fix_key(op: Operator, key: str) -> None:
    """The manual's remedy for a refused key, and `helm test` at once after the rollout (it
    once failed while the old gateway pod was terminating: runner/gateway/cluster.py)."""
    op.run("kubectl -n probe-runner create secret generic provider --from-literal=api-key=sk-... --dry-run",
           {"sk-...": key})
    op.run("kubectl -n probe-runner rollout restart")
    op.run("kubectl -n probe-runner rollout status", timeout=200)
    tested = op.run("helm test", timeout=200, expect=None)
    if tested.returncode != 0:
        seen = subprocess.run(["bash", "-c", f"kubectl -n {NS} get pods -o wide; kubectl -n {NS} get endpointslices -o yaml; "
                               f"kubectl -n {NS} get secret provider -o jsonpath='{{.data.api-key}}' | base64 -d; echo; "
                               f"for p in $(kubectl -n {NS} get pods -o name -l app.kubernetes.io/component=gateway); do "
                               f"echo == $p; kubectl -n {NS} logs $p --tail=30; done"],
                              env=op.env, capture_output=True, text=True).stdout
        raise AssertionError(f"helm test after the key's fix: exit {tested.returncode}\n{tested.stdout}\n{seen}")


def test_an_operators_second_day_follows_the_readme_to_where_it_says_each_story_ends(
        real_node, provider, bucket, node_values_for, helm_binary, bucket_env, tmp_path, monkeypatch):
    import boto3

    node, (endpoint, _) = real_node, bucket
    for k, v in bucket_env.items():
        monkeypatch.setenv(k, v)
    boto3.client("s3", endpoint_url=endpoint, region_name="eu-west-1").create_bucket(  # the manual's bucket
        Bucket="my-bucket", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    op = Operator(node, tmp_path, endpoint, helm_binary, bucket_env)
    seen = len(provider.server.requests)
    values = tmp_path / "node-values.json"  # this node's images, provider and bucket endpoint, as one more -f
    mine = node_values_for()
    for key in ("credentialsSecret",):
        mine["provider"].pop(key)
    mine["bucket"] = {"endpoint": mine["bucket"]["endpoint"]}  # the manual's --set gives store, region, Secret
    values.write_text(json.dumps(mine))
    uid = secrets.token_hex(3)
    try:
        # ---- install, with the manual's placeholder as the key: a wrong one ----------------------
        op.run("kubectl create namespace")
        op.run("kubectl label namespace")
        op.run("kubectl -n probe-runner create secret generic provider --from-literal=api-key=sk-...")
        op.run("kubectl -n probe-runner create secret generic bucket")
        op.run("helm install", extra=f"-f {values} --timeout 150s", timeout=200)
        tested = op.run("helm test", timeout=200, expect=1)
        assert "the provider refused the key" in tested.stdout + tested.stderr
        op.export("export RUNNER_KUBE__NAMESPACE")
        op.export("export RUNNER_STORE")
        doctor = op.run("probe-runner doctor --cluster", timeout=300, expect=1)
        assert re.search(r"^FAIL cluster confinement: .*the provider refused the key", doctor.stdout, flags=re.M), doctor.stdout

        # ---- story 1: submitted anyway, it stops before its first session; the key fixed --------
        key_campaign = f"op-key-{uid}"
        op.plan(key_campaign, repetitions=1)  # 2 probes x 2 arms
        job = _job(op.run("probe-runner submit plan.json --corpus ../corpus", timeout=120))
        stopped = _watch(op, key_campaign, 2)
        assert "the last run stopped" in stopped and "the key check before the first session: the provider refused " \
            "the key" in stopped, stopped
        assert f"`kubectl -n {NS} rollout restart deployment/{NS}-gateway`" in stopped, stopped  # the manual's remedy
        assert f"kubectl delete job {job}" in stopped, stopped
        assert _ledger(op, key_campaign).sessions() == {}  # nothing journaled
        asked = [(r["path"].split("?")[0], r["credential"]) for r in provider.server.requests[seen:]]
        assert set(asked) == {("/v1/messages/count_tokens", "other")}, asked  # only the key checks, nothing spent
        _fix_key(op, RIGHT_KEY)
        op.run("probe-runner doctor --cluster", timeout=300)
        op.run("kubectl -n probe-runner delete job <job name printed by submit>", {"<job name printed by submit>": job})
        job = _job(op.run("probe-runner submit plan.json --corpus ../corpus --budget-usd", timeout=120))
        done = _watch(op, key_campaign, 0)
        assert "4/4 final, 0 running" in done and "transcripts ready" in done, done
        logs = op.run("probe-runner logs CAMPAIGN", {"CAMPAIGN": key_campaign})
        assert '"type":"result"' in logs.stdout.replace(" ", ""), logs.stdout[-500:]
        op.run("probe-runner pull CAMPAIGN", {"CAMPAIGN": key_campaign})
        assert len(list((op.cwd / "transcripts").glob("*.md"))) == 2
        op.run("kubectl -n probe-runner logs job/<job name printed by submit>", {"<job name printed by submit>": job})

        # ---- story 2: the budget stops it; a resubmit with other flags; the budget raised --------
        budget_campaign = f"op-budget-{uid}"
        op.plan(budget_campaign, probes=json.loads(demo.PLAN.read_text())["probes"][:1], arms=["present"])
        # $3 holds one session's reservation ($1 + the chart's callUsd, $2) and not a second's
        job = _job(op.run("probe-runner submit plan.json --corpus ../corpus --budget-usd", {"--budget-usd 20": "--budget-usd 3"},
                          timeout=120))
        stopped = _watch(op, budget_campaign, 3)
        assert "budget: 1 session(s) not started" in stopped and "raise the budget (--budget-usd)" in stopped, stopped
        again = op.run("probe-runner submit plan.json --corpus ../corpus --budget-usd", timeout=120, expect=2)
        assert f"the controller Job {NS}/{job} exists with other settings" in again.stderr, again.stderr
        op.run("kubectl -n probe-runner delete job <job name printed by submit>", {"<job name printed by submit>": job})
        op.run("probe-runner submit plan.json --corpus ../corpus --budget-usd", timeout=120)
        done = _watch(op, budget_campaign, 0)
        assert "2/2 final, 0 running" in done and "transcripts ready" in done, done
        intents = [(e["session"], e["attempt"]) for e in _ledger(op, budget_campaign).entries if e["type"] == "intent"]
        assert sorted(intents) == [("HW-PRB-0007/present-001", 1), ("HW-PRB-0007/present-002", 1)]  # nothing repeated

        # ---- story 3: the key loses its permission mid-campaign; the failed sessions resumed -----
        resume_campaign = f"op-resume-{uid}"
        op.plan(resume_campaign, probes=json.loads(demo.PLAN.read_text())["probes"][:1], arms=["present"], repetitions=3)
        op.run("probe-runner submit plan.json --corpus ../corpus", timeout=120)
        selector = names.selector_string(names.selector(NS, names.SESSION_COMPONENT, resume_campaign))
        until(lambda: [p for p in json.loads(node.kubectl("-n", NS, "get", "pods", "-l", selector, "-o", "json").stdout)["items"]
                       if names.CANARY not in (p["metadata"].get("annotations") or {})],  # the canary has their labels
              300, "a session pod", interval=0.2)
        provider.server.api_key, provider.server.refusal_status = SECOND_KEY, 403  # its first call is seconds away
        stopped = _watch(op, resume_campaign, 2)
        match = re.search(rf"`probe-runner ledger resume {resume_campaign} ((?:\S+/\S+ )+)--job`", stopped)
        assert match and "the provider refused the key with HTTP 403" in stopped, stopped
        failed = match.group(1).split()
        states = _ledger(op, resume_campaign).sessions()
        assert failed and {k for k, s in states.items() if s.status == "failed"} == set(failed), (failed, states)
        _fix_key(op, SECOND_KEY)
        op.run("probe-runner ledger resume", {"CAMPAIGN": resume_campaign, "HW-PRB-0007/present-001": " ".join(failed)})
        done = _watch(op, resume_campaign, 0)
        assert "3/3 final, 0 running" in done and "transcripts ready" in done, done
        states = _ledger(op, resume_campaign).sessions()
        assert {k: (s.status, s.attempt) for k, s in states.items()} == {
            f"HW-PRB-0007/present-00{n}": ("succeeded", 2 if f"HW-PRB-0007/present-00{n}" in failed else 1)
            for n in (1, 2, 3)}

        # ---- uninstall ----------------------------------------------------------------------------
        op.run("kubectl -n probe-runner delete jobs")
        op.run("helm uninstall", timeout=200)
        op.run("kubectl -n probe-runner delete networkpolicy")
        assert not node.kubectl("-n", NS, "get", "deploy,networkpolicy", "-o", "name").stdout.strip()
        assert sorted(set(op.commands) - op.played) == [], "manual commands no story played"
    finally:
        provider.server.api_key, provider.server.refusal_status = RIGHT_KEY, 401
        node.kubectl("delete", "namespace", NS, "--wait=false", check=False)
