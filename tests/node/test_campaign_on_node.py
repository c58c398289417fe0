"""End to end on the real node, as a user and an operator would do it: the chart installed with
the real helm (restricted Pod Security), a campaign submitted with ``probe-runner submit``
(bucket: moto on the host), the controller Job running real session pods from the built images
(the real Claude Code CLI, holding a token of its own attempt, through the provider gateway,
which calls the scripted provider over TLS under its host name with the key),
``status --watch`` to the end, verified transcripts pulled; meanwhile a real Prometheus on the
node, finding the chart's metrics Services' endpoints through the API server, scrapes
the controller and the gateway pods, and PromQL returns the campaign's sessions by state (issue
31, item 1)."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.dashboard import dashboard_queries
from support.prometheus import Prometheus, by, prometheus

from runner import demo
from runner.k8s import jobs
from runner.phases import ORDER

pytestmark = pytest.mark.timeout(1200)


def _cli(env: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runner", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


# The milestones a session pod's capture record carries (outcome_journaled is the ledger's).
POD_MILESTONES = set(ORDER) - {"outcome_journaled"}
SCRAPE = "250ms"  # the controller serves while its Job runs: scraped often, so its last counts are seen
PROMETHEUS_PORT = 19090  # in the node's network namespace, on the node's address


def scrape_config(targets: Path) -> dict:
    """Scrape what ``targets`` lists (file-based discovery: Debian's Prometheus is built without
    its Kubernetes discovery, so ``Discovery`` plays that part)."""
    return {"global": {"scrape_interval": SCRAPE, "scrape_timeout": SCRAPE},
            "scrape_configs": [{"job_name": "probe-runner",
                                "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}]}]}


class Discovery(threading.Thread):
    """What Prometheus's Kubernetes discovery does for an operator (role endpointslice, keeping
    the Services labelled probe-runner.io/metrics and their port ``metrics``): the install's
    metrics endpoints through the API server, written as a file_sd targets file, labelled by
    component and pod, every half second."""

    def __init__(self, install, path: Path) -> None:
        super().__init__(daemon=True)
        from kubernetes import client

        self.core, self.discovery = client.CoreV1Api(install.node.api_client()), client.DiscoveryV1Api(install.node.api_client())
        self.namespace, self.path = install.namespace, path
        self.error: BaseException | None = None
        self._halt = threading.Event()
        self.write()

    def targets(self) -> list[dict]:
        out = []
        for svc in self.core.list_namespaced_service(self.namespace, label_selector="probe-runner.io/metrics=true").items:
            component = svc.metadata.labels["app.kubernetes.io/component"]
            for es in self.discovery.list_namespaced_endpoint_slice(
                    self.namespace, label_selector=f"kubernetes.io/service-name={svc.metadata.name}").items:
                port = next((p.port for p in es.ports or [] if p.name == "metrics"), None)
                for ep in es.endpoints or [] if port else []:
                    pod = ep.target_ref.name if ep.target_ref else ""
                    out += [{"targets": [f"{a}:{port}"], "labels": {"component": component, "pod": pod}}
                            for a in ep.addresses]
        return out

    def write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.targets()))
        tmp.replace(self.path)

    def run(self) -> None:
        try:
            while not self._halt.wait(0.5):
                self.write()
        except BaseException as e:  # reported by stop(), never swallowed
            self.error = e

    def stop(self) -> None:
        self._halt.set()
        self.join(10)
        assert self.error is None, f"discovery failed: {self.error!r}"


def test_a_campaign_runs_in_real_pods_from_submit_to_pull(install, provider, bucket, tmp_path):
    node = install.node
    # On the node (kube-router admits what a pod's own node sends it, as the NetworkPolicy spec
    # allows): the gateway's pod is its one target before the campaign starts.
    discovery = Discovery(install, tmp_path / "targets.json")
    discovery.start()
    try:
        with prometheus(scrape_config(tmp_path / "targets.json"), tmp_path / "prometheus", host=node.node_ip,
                        port=PROMETHEUS_PORT, prefix=["nsenter", f"--net=/run/netns/{node.netns}"], targets=1) as prom:
            before = _gateway_calls(prom)
            campaign, ended = _campaign(install, provider, bucket, tmp_path)
            _scraped(prom, campaign, before, ended)
    finally:
        discovery.stop()


def _gateway_calls(prom: Prometheus) -> dict[tuple[str, ...], float]:
    """The gateway's calls by outcome, and its refusals by reason (keyed ("refusal", reason))."""
    calls = by(prom.query('sum by (outcome) (probe_runner_gateway_calls_total{component="gateway"})'), "outcome")
    refusals = by(prom.query('sum by (reason) (probe_runner_gateway_refusals_total{component="gateway"})'), "reason")
    canary = by(prom.query('sum by (reason) (probe_runner_gateway_canary_refusals_total{component="gateway"})'), "reason")
    return {**calls, **{("refusal", *k): v for k, v in refusals.items()}, **{("canary", *k): v for k, v in canary.items()}}


def _scraped(prom: Prometheus, campaign: str, before: dict[tuple[str, ...], float], ended: float) -> None:
    """What the node's Prometheus scraped of the campaign, by PromQL."""
    ran = f'{{component="controller",campaign="{campaign}"}}'
    window = f"[{int(time.time() - ended) + 600}s]"
    # The campaign's sessions by state: four in all at every scrape, at most two running at once
    # (the install's concurrency), all four done at the end.
    most = by(prom.query(f"max_over_time((sum by (state) (probe_runner_sessions{ran}))[{window[1:-1]}:{SCRAPE}])"), "state")
    assert 1 <= most[("running",)] <= 2 and most[("done",)] == 4, (most, prom.targets())
    last = by(prom.query(f"sum by (state) (last_over_time(probe_runner_sessions{ran}{window}))"), "state")
    assert last == {("waiting",): 0, ("running",): 0, ("done",): 4}, last
    outcomes = by(prom.query(f"last_over_time(probe_runner_session_outcomes_total{ran}{window}) > 0"), "arm", "status")
    assert outcomes == {("present", "succeeded"): 2, ("absent", "succeeded"): 2}, outcomes
    verbs = by(prom.query(f'sum by (verb) (last_over_time(probe_runner_api_requests_total{{component="controller"}}{window}))'),
               "verb")
    assert verbs[("create",)] >= 4 and verbs[("exec",)] >= 4, verbs  # a pod and a delivery per session at least
    # The gateway's pod served the sessions' calls: forwarded, none refused.
    seen = {k: v - before.get(k, 0) for k, v in _gateway_calls(prom).items()}
    calls = {k: v for k, v in seen.items() if k[0] not in ("refusal", "canary")}
    refusals = {k[1:]: v for k, v in seen.items() if k[0] == "refusal" and v > 0}
    canary = {k[1:]: v for k, v in seen.items() if k[0] == "canary" and v > 0}
    # Refused: only what the confinement checks' canaries ask to see refused (a server tool and
    # an MCP server through the gateway: its request policy), two per check, counted apart from
    # the sessions' calls, which were all forwarded (each capture's meter says refused 0, above).
    assert calls[("forwarded",)] >= 4 and calls[("failed",)] == 0 and calls[("refused",)] == 0, (calls, refusals)
    assert refusals == {} and set(canary) == {("policy",)}, (refusals, canary)
    assert canary[("policy",)] % 2 == 0 and canary[("policy",)] >= 2, canary
    # Every query of the chart's Grafana dashboard parses and returns series at the controller's
    # last scrape (its Job ends with the run: its series are stale from the next scrape on).
    (last,) = prom.query(f"max_over_time(timestamp(sum(probe_runner_sessions{ran}))[{window[1:-1]}:{SCRAPE}])")
    at = float(last["value"][1])
    empty = [(title, expr) for title, expr in dashboard_queries(campaign=campaign) if not prom.query(expr, at)]
    assert empty == [], (at, ended, empty)


def _campaign(install, provider, bucket, tmp_path) -> tuple[str, float]:
    """The campaign from submit to pull: its name, and when its controller's last scrape could be."""
    node, user = install.node, install.settings_env(tmp_path)
    campaign = f"node-{secrets.token_hex(3)}"
    plan = json.loads(demo.PLAN.read_text())
    plan.update(campaign=campaign, repetitions=1)  # 2 probes x 2 arms
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan))

    # A budget: its books are metrics too (the dashboard's budget panels have series).
    submitted = _cli(user, "submit", str(plan_file), "--corpus", str(demo.CORPUS), "--budget-usd", "20",
                     "--session-budget-usd", "1")
    assert submitted.returncode == 0, submitted.stderr
    watched = _cli(user, "status", campaign, "--watch", "--interval", "2", timeout=900)
    ended = time.time()  # the watch ends after the controller's transform, as its Job ends
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
        assert c["pod"]["runtime_class"] is None  # the node's default runtime: runc
        # A real kubelet's milestones (issue 31, item 2): every one a pod passes, the sandbox's
        # condition and the containers' states as the kubelet reports them, in their order.
        assert {m for m in c["phases"] if m in ORDER} == POD_MILESTONES, c["phases"]
        # The entry point (the node's clock) may start the CLI before the delivery's exec has
        # returned to the controller, which stamps workspace_delivered then (docs/operating.md): a
        # poll of 20 ms made it start 3 ms before that stamp once. Its own place: after the
        # containers started, before the first reply.
        stamps = [c["phases"][m] for m in ORDER if m in POD_MILESTONES - {"harness_started"}]
        assert stamps == sorted(stamps), c["phases"]
        p = c["phases"]
        assert p["containers_started"] <= p["harness_started"] <= p["first_reply"], p
        assert 0 <= c["phases"]["policy_wait_seconds"] < 30, c["phases"]
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
    return campaign, ended


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
    # Issue 31, items 4 and 5: the runtime (runc, the node's default) and the images the real
    # kubelet reports in the node's status.images
    assert lines["ok   runtime"].startswith("session pods run under each node's default runtime"), done.stdout
    assert lines["ok   images"] == ("all 1 session nodes report the harness image ghcr.io/probe-runner/harness:0.1.0 "
                                    "and the runner image ghcr.io/probe-runner/runner:0.1.0"), done.stdout
    assert done.returncode == 0, done.stdout + done.stderr
    # The pre-pull DaemonSet's pod (images.prePull.enabled): on the node, both images' containers
    # running their `sleep infinity` under the restricted standard
    (pod,) = json.loads(install.node.kubectl("-n", install.namespace, "get", "pods", "-l",
                                             "app.kubernetes.io/component=prepull", "-o", "json").stdout)["items"]
    states = {c["name"]: (c["image"], "running" in c["state"]) for c in pod["status"]["containerStatuses"]}
    assert sorted(states.values()) == [("ghcr.io/probe-runner/harness:0.1.0", True),
                                       ("ghcr.io/probe-runner/runner:0.1.0", True)], states


def test_a_campaign_split_across_two_controllers_runs_in_real_pods(install, tmp_path):
    """Issue 32, item 5 on a real kubelet: with controller.controllers at 2, the campaign's Job is
    an Indexed Job whose two pods, real containers of the runner image, each take their share
    from JOB_COMPLETION_INDEX as the Job controller sets it; one share ends and says the
    transform is the last's, the last runs it, and every session ran once."""
    from kubernetes import client

    node, user = install.node, install.settings_env(tmp_path)
    core = client.CoreV1Api(node.api_client())
    settings_map = jobs.settings_config_map(install.release)
    before = core.read_namespaced_config_map(settings_map, install.namespace).data["RUNNER_KUBE__CONTROLLERS"]
    core.patch_namespaced_config_map(settings_map, install.namespace, {"data": {"RUNNER_KUBE__CONTROLLERS": "2"}})
    try:
        campaign = f"split-{secrets.token_hex(3)}"
        plan = json.loads(demo.PLAN.read_text())
        plan.update(campaign=campaign, repetitions=1)  # 2 probes x 2 arms: 2 sessions a share
        (tmp_path / "plan.json").write_text(json.dumps(plan))
        submitted = _cli(user, "submit", str(tmp_path / "plan.json"), "--corpus", str(demo.CORPUS))
        assert submitted.returncode == 0, submitted.stderr
        job = jobs.job_name(campaign)
        watched = _cli(user, "status", campaign, "--watch", "--interval", "2", timeout=900)
        assert watched.returncode == 0, watched.stderr + node.kubectl("-n", install.namespace, "get", "pods").stdout
        bars = [line for line in watched.stdout.splitlines() if line.startswith("[")]
        assert bars[-1].startswith("[########################] 4/4 final, 0 running"), watched.stdout
        assert bars[-1].endswith(", transcripts ready"), watched.stdout
        node.kubectl("-n", install.namespace, "wait", "--for=condition=complete", f"job/{job}", "--timeout=120s")
        pods = json.loads(node.kubectl("-n", install.namespace, "get", "pods", "-l", f"job-name={job}", "-o",
                                       "json").stdout)["items"]
        assert sorted(p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] for p in pods) == ["0", "1"]
        assert {p["status"]["phase"] for p in pods} == {"Succeeded"}
        said = [node.kubectl("-n", install.namespace, "logs", p["metadata"]["name"]).stdout for p in pods]
        # Each ran its own 2 sessions; the first to end left the transform to the other, or both ended at once.
        assert all(text.count("succeeded") >= 2 for text in said), said
        ended_first = [text for text in said if "ended; the transform runs when the last share ends" in text]
        assert len(ended_first) <= 1, said
        status = json.loads(_cli(user, "status", campaign, "--json").stdout)
        assert status["sessions"] == {"succeeded": 4} and status["transcripts"]["ready"], status
    finally:
        core.patch_namespaced_config_map(settings_map, install.namespace, {"data": {"RUNNER_KUBE__CONTROLLERS": before}})
