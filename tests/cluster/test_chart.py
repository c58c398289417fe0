"""The Helm chart on the real control plane of ``kube_cluster``: its objects are applied to a
namespace that enforces the ``restricted`` Pod Security Standard, a campaign is submitted with
the real CLI (plan and corpus to an S3 bucket served by moto on loopback, the controller Job
created), then run by the controller under the identity of the chart's ServiceAccount (a token
from the TokenRequest API), with SimNode playing the node for session pods. The Role is shown
sufficient (the campaign completes) and least (the controller used every verb it grants and no
other; a verb it does not grant is denied), and the user's status, logs and pull work on the
result, pull refusing a transcript changed in the bucket.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import boto3
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.stream.stream import _websocket_request

import runner.k8s.api as k8s_api
from runner import cli, demo
from runner.k8s import jobs, names
from runner.ledger import Ledger
from runner.plan import parse_plan
from runner.settings import Settings
from runner.share import Share
from runner.store import open_store
from tests.support.helm import CHART, by_kind, helm, render, settings_of, values_of
from tests.support.waiting import until

sys.path.insert(0, str(Path(__file__).parent))
from simnode import SimNode  # noqa: E402
from terminal import on_a_terminal  # noqa: E402  (tests/ is on the path: tests/conftest.py)

REPO = Path(__file__).resolve().parents[2]
REAL_STREAM = REPO / "tests" / "data" / "claude-code-2.1.197" / "read-write-answer.jsonl"
BUCKET_ENV = {"AWS_ACCESS_KEY_ID": "probe-runner-test", "AWS_SECRET_ACCESS_KEY": "probe-runner-test"}


class SessionNode(SimNode):
    """SimNode for session pods only: the chart's gateway pods and the controller Job's pod are
    left to KWOK, which schedules them and reports them running."""

    def _on(self, event):
        if (event[1]["metadata"].get("labels") or {}).get(names.COMPONENT) == names.SESSION_COMPONENT:
            super()._on(event)


class RecordingClient(client.ApiClient):
    """An ApiClient that notes (resource, verb) of every request it sends. Exec goes around
    call_api (the stream helper swaps it for a websocket call): see ``recording_stream``."""

    def __init__(self, configuration, seen: set):
        super().__init__(configuration)
        self.seen = seen

    def call_api(self, method, url, *args, **kwargs):
        self.seen.add(_resource_verb(method, url))
        return super().call_api(method, url, *args, **kwargs)


def recording_stream(seen: set):
    """The product's exec transport (runner.k8s.api), noting the exec requests it opens: a
    websocket upgrade is a GET that the API server authorises as both get and create of pods/exec."""
    def websocket_call(configuration, method, url, **kwargs):
        seen.update({_resource_verb(method, url), ("pods/exec", "create")})
        return k8s_api._bounded_websocket_call(configuration, method, url, **kwargs)
    return functools.partial(_websocket_request, websocket_call, None)


def _resource_verb(method: str, url: str) -> tuple[str, str]:
    """(resource[/subresource], RBAC verb) of a namespaced request."""
    parts = urlsplit(url)
    rest = parts.path.split("/namespaces/", 1)[1].split("/")[1:]  # [resource, name?, subresource?]
    resource = "/".join(rest[0:1] + rest[2:3])
    if len(rest) == 1:
        watch = parse_qs(parts.query).get("watch", ["false"])[0].lower() == "true"
        return resource, {"POST": "create", "GET": "watch" if watch else "list"}[method]
    return resource, {"GET": "get", "DELETE": "delete", "PATCH": "patch", "PUT": "update"}[method]


@pytest.fixture(scope="module")
def bucket(moto_endpoint):
    """The bucket "probes" on the shared moto server: (endpoint, boto3 client)."""
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1",
                      aws_access_key_id=BUCKET_ENV["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=BUCKET_ENV["AWS_SECRET_ACCESS_KEY"])
    s3.create_bucket(Bucket="probes")
    return moto_endpoint, s3


@pytest.fixture(scope="module")
def install(kube_cluster, bucket):
    """The rendered chart applied to a fresh namespace; returns (namespace, release, objects)."""
    uid = secrets.token_hex(3)
    namespace, release = f"chart-{uid}", f"pr-{uid}"
    endpoint, _ = bucket
    objs = render(release=release, namespace=namespace, sets=(
        "provider.credentialsSecret=provider", "bucket.store=s3://probes", f"bucket.endpoint={endpoint}",
        "bucket.region=us-east-1", "bucket.credentialsSecret=bucket", "gateway.replicas=1",
        # KWOK runs no container, so no canary can measure anything here (tests/node/ does).
        "session.canary.enabled=false",
        # session pods on this install's own nodes, whatever other tests add (doctor names them)
        f"session.nodeSelector.pool=chart-{uid}"), extra=("--skip-tests",))  # helm install does not install its test pod either
    kube_cluster.add_nodes(3, prefix=f"chart-{uid}", labels={"pool": f"chart-{uid}"})
    kube_cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": {
        "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}})
    # pods are admitted once the namespace's default ServiceAccount exists
    until(lambda: kube_cluster.kubectl("-n", namespace, "get", "serviceaccount", "default", check=False).returncode == 0,
          30, f"namespace {namespace}'s default ServiceAccount", interval=0.2)
    kube_cluster.apply([
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "provider", "namespace": namespace},
         "stringData": {"api-key": "demo-key"}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "bucket", "namespace": namespace},
         "stringData": BUCKET_ENV},
    ])
    kube_cluster.apply(objs)
    kube_cluster.kubectl("-n", namespace, "rollout", "status", f"deployment/{release}-gateway", "--timeout=60s",
                         timeout=70)
    yield namespace, release, objs
    client.CoreV1Api(kube_cluster.api_client()).delete_namespace(namespace, propagation_policy="Background")


@pytest.fixture(scope="module")
def controller_identity(kube_cluster, install):
    """A client configuration that authenticates as the chart's controller ServiceAccount, with
    a token from the TokenRequest API (what the Job's pod gets mounted)."""
    namespace, release, _ = install
    token = kube_cluster.kubectl("-n", namespace, "create", "token", jobs.controller_service_account(release),
                                 "--duration=1h").stdout.strip()
    admin = kube_cluster.api_client().configuration
    cfg = client.Configuration()
    cfg.host, cfg.ssl_ca_cert, cfg.verify_ssl = admin.host, admin.ssl_ca_cert, admin.verify_ssl
    cfg.api_key = {"authorization": f"Bearer {token}"}
    return cfg


@pytest.fixture
def sim_root():
    d = Path(tempfile.mkdtemp(prefix="simnode-", dir="/tmp"))
    d.chmod(0o755)
    (d / "shared").mkdir(mode=0o755)
    yield d
    subprocess.run(["rm", "-rf", str(d)], check=False)


def _user_env(kube_cluster, install, bucket, tmp_path) -> dict[str, str]:
    """A user's workstation, set up as the chart's NOTES say."""
    namespace, release, _ = install
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
    return {**env, **BUCKET_ENV, "RUNNER_STORE": "s3://probes", "RUNNER_S3__ENDPOINT_URL": bucket[0],
            "RUNNER_S3__REGION": "us-east-1", "RUNNER_KUBE__NAMESPACE": namespace, "RUNNER_KUBE__INSTANCE": release,
            "RUNNER_KUBE__KUBECONFIG": str(kube_cluster.kubeconfig),
            "RUNNER_LOCAL__WORKDIR": str(tmp_path / "user")}


def _cli(env: dict, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runner", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def test_a_campaign_runs_through_the_installed_chart_with_least_rbac(kube_cluster, install, bucket, controller_identity,
                                                                    sim_root, tmp_path, monkeypatch):
    namespace, release, objs = install
    endpoint, s3 = bucket
    user = _user_env(kube_cluster, install, bucket, tmp_path)
    campaign = f"chart-{secrets.token_hex(3)}"
    plan = json.loads(demo.PLAN.read_text())
    plan.update(campaign=campaign, repetitions=1)  # 2 probes x 2 arms
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan))

    # ---- the user submits: plan and corpus to the bucket, the controller Job to the cluster
    first = _cli({**user, "RUNNER_KUBE__READER_IMAGE": "workstation/runner:dev"}, "submit", str(plan_file),
                 "--corpus", str(demo.CORPUS))
    assert first.returncode == 0, first.stderr
    assert "created" in first.stdout
    again = _cli(user, "submit", str(plan_file), "--corpus", str(demo.CORPUS))
    assert again.returncode == 0 and "exists already" in again.stdout, again.stderr + again.stdout
    assert first.stdout.split("corpus: ")[1].splitlines()[0] == again.stdout.split("corpus: ")[1].splitlines()[0]
    # Issue 29: "submitting again with other budget flags while the campaign's Job exists exits 0
    # ("exists already") and ignores the new flags". Now it says so and what to do.
    other = _cli(user, "submit", str(plan_file), "--corpus", str(demo.CORPUS), "--budget-usd", "5",
                 "--session-budget-usd", "1")
    assert other.returncode == 2 and "exists with other settings" in other.stderr, other.stderr + other.stdout
    assert "--budget-usd 5" in other.stderr and f"delete job {jobs.job_name(campaign)}" in other.stderr
    job = client.BatchV1Api(kube_cluster.api_client()).read_namespaced_job(jobs.job_name(campaign), namespace)
    assert job.spec.template.spec.service_account_name == f"{release}-controller"
    # Built from the install's settings: the chart's image and bucket Secret, not the workstation's.
    container = job.spec.template.spec.containers[0]
    assert container.image == values_of(None)["images"]["runner"]
    assert [e.secret_ref.name for e in container.env_from if e.secret_ref] == ["bucket"]
    # The Job controller makes the pods of both Jobs (below) under restricted Pod Security.
    transform = _cli(user, "transform", campaign, "--job")
    assert transform.returncode == 0 and "created" in transform.stdout, transform.stderr
    twice = _cli(user, "transform", campaign, "--job")
    assert twice.returncode == 2 and "exists already" in twice.stderr and "Traceback" not in twice.stderr
    # The API server's ServiceAccount admission projected a token into the controller's pod only.
    core = client.CoreV1Api(kube_cluster.api_client())
    for action, token in (("controller", True), ("transform", False)):
        selector = f"job-name={jobs.job_name(campaign, action)}"
        pods = until(lambda: core.list_namespaced_pod(namespace, label_selector=selector).items, 30,  # noqa: B023
                     f"a pod of the {action} Job", interval=0.3)
        assert any(v.name.startswith("kube-api-access-") for v in pods[0].spec.volumes) is token, action
    # The install's bucket is where the plan goes and what the Job reads, whatever the workstation says.
    elsewhere = _cli(user, "submit", str(plan_file), "--corpus", str(demo.CORPUS), "--store", (tmp_path / "s").as_uri())
    assert elsewhere.returncode == 2 and "Traceback" not in elsewhere.stderr
    assert f"the install {namespace}/{release} reads campaigns from s3://probes" in elsewhere.stderr
    nowhere = _cli({**user, "RUNNER_KUBE__NAMESPACE": "no-such-namespace"}, "submit", str(plan_file),
                   "--corpus", str(demo.CORPUS))
    assert nowhere.returncode == 2 and "Traceback" not in nowhere.stderr
    assert 'ConfigMap' in nowhere.stderr and 'in namespace no-such-namespace: configmaps' in nowhere.stderr, nowhere.stderr

    # ---- the controller Job's work, as its pod would do it: the chart's settings ConfigMap as
    # the whole RUNNER_* environment, the bucket Secret, the ServiceAccount's token.
    for k in [k for k in os.environ if k.startswith("RUNNER_")]:
        monkeypatch.delenv(k)
    for k, v in {**by_kind(objs, "ConfigMap")[jobs.settings_config_map(release)]["data"], **BUCKET_ENV,
                 "RUNNER_LOCAL__WORKDIR": str(tmp_path / "controller")}.items():
        monkeypatch.setenv(k, v)
    seen: set[tuple[str, str]] = set()
    monkeypatch.setattr(k8s_api, "load_api_client", lambda settings: RecordingClient(controller_identity, seen))
    monkeypatch.setattr(k8s_api, "_exec_stream", recording_stream(seen))
    real = sim_root / "shared" / "real.jsonl"
    real.write_bytes(REAL_STREAM.read_bytes())
    real.chmod(0o644)
    with SessionNode(kube_cluster.api_client(), namespace, sim_root, ["sh", "-c", 'exec cat "$0"', str(real)],
                     harness_binds=(str(sim_root / "shared"),)) as sim:
        code = cli.main(["controller", "--campaign", campaign])
        assert not sim.errors, sim.errors
    assert code in (0, 12), code  # 12: the replayed stream's sessions may be refused by intake; all ran
    assert len(sim.created) == 4 and all(len(u) == 1 for u in sim.created.values())
    gateway_ip = client.CoreV1Api(kube_cluster.api_client()).read_namespaced_service(
        f"{release}-gateway", namespace).spec.cluster_ip
    for spec in sim.specs.values():  # sessions reach the gateway by its ClusterIP (they have no DNS), with a token
        env = {e["name"]: e.get("value") for e in spec["containers"][1]["env"]}
        assert env["ANTHROPIC_BASE_URL"] == f"http://{gateway_ip}:8080" and "HTTPS_PROXY" not in env
        assert env["ANTHROPIC_API_KEY"].startswith("prt1.") and not [e for e in spec["containers"][1]["env"] if "valueFrom" in e]

    # Sufficient (the campaign ran) and least: every rule of the Role was used, nothing else was.
    role = by_kind(objs, "Role")[f"{release}-controller"]
    granted = {(res, verb) for rule in role["rules"] for res in rule["resources"] for verb in rule["verbs"]}
    assert seen == granted, sorted(seen)
    store = open_store("s3://probes", Settings(store="s3://probes",
                                                         s3={"endpoint_url": endpoint, "region": "us-east-1"}))
    ledger = Ledger(store, campaign)
    assert not ledger.verify() and {s.status for s in ledger.sessions().values()} == {"succeeded"}

    # ---- the user reads the result
    status = _cli(user, "status", campaign, "--json")
    assert status.returncode == 0, status.stderr
    st = json.loads(status.stdout)
    assert st["sessions"] == {"succeeded": 4} and st["final"] == st["total"] == 4
    per_stream = sum(float(json.loads(line)["total_cost_usd"]) for line in REAL_STREAM.read_text().splitlines()
                     if '"type":"result"' in line.replace(" ", ""))
    assert abs(float(st["cost_usd"]) - 4 * per_stream) < 1e-9
    watched = _cli(user, "status", campaign, "--watch", "--interval", "0.1")
    assert watched.returncode == 0 and watched.stdout.startswith("[########################] 4/4 final, 0 running")
    assert "\r" not in watched.stdout  # not a terminal: plain lines
    # submit --watch: the submission (the Job exists already), then the same watch.
    resubmitted = _cli(user, "submit", str(plan_file), "--corpus", str(demo.CORPUS), "--watch", "--interval", "0.1")
    assert resubmitted.returncode == 0 and "exists already: submitted before" in resubmitted.stdout, resubmitted.stderr
    assert resubmitted.stdout.splitlines()[-1].startswith("[########################] 4/4 final, 0 running")
    # On a terminal: the live board (runner/live.py), drawn in place.
    code, drawn = on_a_terminal([sys.executable, "-m", "runner", "status", campaign, "--watch"],
                                {**user, "COLUMNS": "100"}, timeout=60)
    flat = " ".join(drawn.split())
    assert code == 0 and f"campaign {campaign}: 4/4 done" in flat and "every session has ended" in flat, flat

    probe = plan["probes"][0]["id"]
    logs = subprocess.run([sys.executable, "-m", "runner", "logs", campaign, probe, "present-001"], env=user,
                          capture_output=True, timeout=60)
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout == REAL_STREAM.read_bytes()
    missing = _cli(user, "logs", campaign, probe, "present-009")
    assert missing.returncode == 2 and "no such session" in missing.stderr

    dest = tmp_path / "pulled"
    pulled = _cli(user, "pull", campaign, "--dest", str(dest))
    assert pulled.returncode == 0, pulled.stderr
    sums = s3.get_object(Bucket="probes", Key=f"campaigns/{campaign}/transcripts/SHA256SUMS")["Body"].read()
    (tmp_path / "SHA256SUMS").write_bytes(sums)  # the transform's record, checked by the standard tool
    check = subprocess.run(["sha256sum", "-c", str(tmp_path / "SHA256SUMS")], cwd=dest, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.count(": OK") == len(list(dest.iterdir())) >= 2 and (dest / "refusals.json").is_file()
    # A file changed in the bucket after the transform: pull refuses it and writes nothing.
    key = f"campaigns/{campaign}/transcripts/refusals.json"
    s3.put_object(Bucket="probes", Key=key, Body=b'{"refusals": []}\n')
    tampered = _cli(user, "pull", campaign, "--dest", str(tmp_path / "again"))
    assert tampered.returncode == 1 and "differs from SHA256SUMS" in tampered.stderr, tampered.stderr
    assert not (tmp_path / "again").exists()
    assert hashlib.sha256((dest / "refusals.json").read_bytes()).hexdigest() in sums.decode()


def test_a_failed_session_of_a_submitted_campaign_is_resumed_by_a_job_in_the_cluster(kube_cluster, install, bucket, tmp_path,
                                                                                       monkeypatch):
    """Issue 29: "`ledger resume` always runs the local executor ... Give the cluster path its own
    resume (as a Job)". A submitted campaign (plan and corpus in the install's bucket) whose
    session failed: `ledger resume C S --job` creates the campaign's resume Job, a controller
    that runs a new attempt of S (its command names it), with the install's settings and the
    controller's identity; a second one is refused while the first exists, neither runs beside
    the campaign's other controller Job, and a session that did not fail is not resumed."""
    namespace, release, _ = install
    endpoint, _ = bucket
    user = _user_env(kube_cluster, install, bucket, tmp_path)
    campaign = f"resume-{secrets.token_hex(3)}"
    plan = json.loads(demo.PLAN.read_text())
    plan.update(campaign=campaign, repetitions=1)
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    submitted = _cli(user, "submit", str(tmp_path / "plan.json"), "--corpus", str(demo.CORPUS))
    assert submitted.returncode == 0, submitted.stderr
    batch = client.BatchV1Api(kube_cluster.api_client())
    batch.delete_namespaced_job(jobs.job_name(campaign), namespace, propagation_policy="Background")  # it will not run here

    def not_ended(name: str) -> None:
        """A Job of that name that has not ended (suspended: KWOK completes a real one at once)."""
        batch.create_namespaced_job(namespace, {"metadata": {"name": name}, "spec": {"suspend": True, "template": {
            "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}}})

    for k, v in BUCKET_ENV.items():
        monkeypatch.setenv(k, v)
    store = open_store("s3://probes", Settings(store="s3://probes", s3={"endpoint_url": endpoint, "region": "us-east-1"}))
    probe = plan["probes"][0]["id"]
    failed, fine, other = f"{probe}/present-001", f"{probe}/absent-001", f"{plan['probes'][1]['id']}/present-001"
    ledger = Ledger(store, campaign)
    for session, status in ((failed, "failed"), (fine, "succeeded"), (other, "failed")):  # as a controller journals them
        ledger.intent(session, 1, {"probe": probe})
        ledger.start(session, 1)
        ledger.outcome(session, 1, status, {"reason": "the harness exited 1"} if status == "failed" else {})
    # One controller runs a campaign at a time: both would start what has not run.
    not_ended(jobs.job_name(campaign))
    while_running = _cli(user, "ledger", "resume", campaign, failed, "--job")
    assert while_running.returncode == 2, while_running.stderr
    assert f"the campaign's controller Job {namespace}/{jobs.job_name(campaign)} is running" in while_running.stderr
    batch.delete_namespaced_job(jobs.job_name(campaign), namespace, propagation_policy="Background")
    resumed = _cli(user, "ledger", "resume", campaign, failed, other, failed, "--job")  # one Job for them all
    assert resumed.returncode == 0, resumed.stderr
    name = jobs.job_name(campaign, "resume")
    assert f"resume job: {namespace}/{name} (created): a new attempt of {failed}, {other}, then" in resumed.stdout
    job = batch.read_namespaced_job(name, namespace)
    assert job.spec.template.spec.containers[0].command == ["probe-runner", "controller", "--campaign", campaign,
                                                            "--resume", failed, "--resume", other]
    assert job.spec.template.spec.service_account_name == f"{release}-controller"
    again = _cli(user, "ledger", "resume", campaign, failed, "--job")
    assert again.returncode == 2 and f"the resume Job {namespace}/{name} of {campaign} exists already" in again.stderr
    batch.delete_namespaced_job(name, namespace, propagation_policy="Background")
    not_ended(name)
    resubmitted = _cli(user, "submit", str(tmp_path / "plan.json"), "--corpus", str(demo.CORPUS))
    assert resubmitted.returncode == 2 and f"the campaign's resume Job {namespace}/{name} is running" in resubmitted.stderr
    not_failed = _cli(user, "ledger", "resume", campaign, fine, "--job")
    assert not_failed.returncode == 2 and "is succeeded; only an interrupted or failed session" in not_failed.stderr
    neither = _cli(user, "ledger", "resume", campaign, failed)
    assert neither.returncode == 2 and "--corpus DIR" in neither.stderr and "--job" in neither.stderr


def test_doctor_checks_the_install_and_says_what_is_missing(kube_cluster, install, bucket, tmp_path):
    """`probe-runner doctor --cluster` (issue 16, item 3): against the installed chart, its
    settings and a ready provider gateway hold (the canary is off here: KWOK runs no container, and
    doctor says it was not measured) and the session nodes' images are a warning; against a
    namespace with no install, the chart and the route checks fail, each with what to do, the
    images are not checked, the confinement check is not measured, and the exit is 1."""

    # Issue 29: "doctor --cluster runs the workstation's local checks (bubblewrap, the local CLI,
    # the workstation's key against api.anthropic.com), so it fails on a correct install whose
    # workstation has no key". Here the workstation has no key, no harness and no bubblewrap.
    env = {k: v for k, v in _user_env(kube_cluster, install, bucket, tmp_path).items()
           if not k.startswith("RUNNER_PROVIDER__")}
    env.update(RUNNER_STORE=(tmp_path / "store").as_uri(), RUNNER_HARNESS__COMMAND="no-such-harness",
               RUNNER_LOCAL__BWRAP="no-such-bwrap")
    ok = _cli(env, "doctor", "--cluster")
    empty = kube_cluster.create_namespace(f"no-install-{secrets.token_hex(3)}")
    missing = _cli({**env, "RUNNER_KUBE__NAMESPACE": empty}, "doctor", "--cluster")
    namespace, release, _ = install
    assert ok.returncode == 0, ok.stdout + ok.stderr
    lines = dict(line[5:].split(": ", 1) for line in ok.stdout.splitlines())
    assert list(lines) == ["chart", "store", "route", "runtime", "images", "cluster confinement"], ok.stdout
    assert lines["runtime"] == (  # the chart's default: no RuntimeClass
        "session pods run under each node's default runtime (kube.runtime_class unset: runc where containerd's default "
        "is); session.runtimeClassName: gvisor runs them in gVisor's sandbox")
    assert lines["store"] == "s3://probes is reachable and writable"  # the install's bucket, from here
    # KWOK's nodes report no image: a warning, naming them, which fails nothing (test_node_images.py has the rest)
    nodes = ", ".join(f"chart-{release.removeprefix('pr-')}-{i}" for i in range(3))
    assert f"WARN images: {lines['images']}" in ok.stdout.splitlines()
    assert lines["images"] == (
        f"of 3 session nodes, 3 lack the harness image ghcr.io/probe-runner/harness:0.1.0 ({nodes}) and 3 lack the "
        f"runner image ghcr.io/probe-runner/runner:0.1.0 ({nodes}): the first session pods there wait for the pull "
        "(images.prePull.enabled pulls them ahead); a node reports at most 50 images, its largest (the kubelet's "
        "nodeStatusMaxImages), so one it does not report may still be there")
    assert lines["chart"] == f"the chart is installed as {release} in {namespace} (ConfigMap {release}-settings)"
    assert lines["route"] == "1 provider gateway pod(s) ready"
    assert lines["cluster confinement"].startswith("not measured: the install sets kube.canary_enabled false")
    assert missing.returncode == 1, missing.stdout
    failed = [line for line in missing.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 5 and failed[0].startswith(f"FAIL chart: reading ConfigMap {release}-settings in namespace {empty}")
    assert failed[1] == (f"FAIL route: no provider gateway pod of {release} is ready in {empty} (0 found): "
                         f"kubectl -n {empty} describe deployment {release}-gateway")
    assert failed[2] == "FAIL runtime: not checked: the chart's settings were not found (above)"
    assert failed[3] == "FAIL images: not checked: the chart's settings were not found (above)"
    assert failed[4] == "FAIL cluster confinement: not measured: the chart's settings were not found (above)"
    assert "Traceback" not in missing.stderr


def test_the_controller_identity_is_denied_what_the_role_does_not_grant(kube_cluster, install, controller_identity):
    namespace, release, _ = install
    other = kube_cluster.create_namespace(f"other-{secrets.token_hex(3)}")
    core = client.CoreV1Api(client.ApiClient(controller_identity))
    attempts = {
        "create a Secret": lambda: core.create_namespaced_secret(namespace, {"metadata": {"name": "x"}, "data": {}}),
        "read the provider Secret": lambda: core.read_namespaced_secret("provider", namespace),
        "list pods in another namespace": lambda: core.list_namespaced_pod(other),
        "get one pod (the watch cache serves reads)": lambda: core.read_namespaced_pod("anything", namespace),
        "read a pod's log": lambda: core.read_namespaced_pod_log("anything", namespace),
        "read another Service": lambda: core.read_namespaced_service("kubernetes", "default"),
        "delete the gateway Service": lambda: core.delete_namespaced_service(f"{release}-gateway", namespace),
        "write a Lease (the gateway's meters)": lambda: client.CoordinationV1Api(core.api_client).create_namespaced_lease(
            namespace, {"metadata": {"name": "x"}, "spec": {}}),
        "change a NetworkPolicy": lambda: client.NetworkingV1Api(core.api_client).delete_collection_namespaced_network_policy(namespace),
        "create a Job": lambda: client.BatchV1Api(core.api_client).create_namespaced_job(namespace, {"metadata": {"name": "x"}}),
    }
    for what, attempt in attempts.items():
        with pytest.raises(ApiException) as exc:
            attempt()
        assert exc.value.status == 403, f"{what}: {exc.value.status} {exc.value.reason}"
    # ...while what it needs is allowed (the same client, the same token).
    assert core.read_namespaced_service(f"{release}-gateway", namespace).spec.cluster_ip
    assert core.read_namespaced_secret(f"{release}-gateway", namespace).data["token-secret"]
    client.CoreV1Api(kube_cluster.api_client()).delete_namespace(other, propagation_policy="Background")


def test_deleting_the_controller_job_deletes_its_session_pods(kube_cluster, install, controller_identity):
    """A campaign's pods must not outlive its Job: before, session pods carried no
    ownerReferences, so deleting the Job (by hand, or its TTL) left them running with the
    credentials mounted. The controller learns its Job from its pod's labels (the downward
    API of jobs.OWNER_ENV) and owns each pod by it; the real garbage collector does the rest.
    A pod made as before (no ownerReferences) is the control: it stays."""
    from runner.k8s import manifests

    namespace, release, objs = install
    admin = client.CoreV1Api(kube_cluster.api_client())
    campaign = f"owned-{secrets.token_hex(3)}"
    settings = settings_of(objs, release)
    job = client.BatchV1Api(kube_cluster.api_client()).create_namespaced_job(namespace, jobs.controller_job(settings, campaign))
    job_pods = until(lambda: admin.list_namespaced_pod(namespace, label_selector=f"batch.kubernetes.io/job-name={job.metadata.name}").items,
                     60, "a pod the Job controller makes", interval=0.2)
    labels = job_pods[0].metadata.labels
    # what RUNNER_KUBE__OWNER_JOB and RUNNER_KUBE__OWNER_UID read through the downward API
    owner = {"owner_job": labels["batch.kubernetes.io/job-name"], "owner_uid": labels["batch.kubernetes.io/controller-uid"]}
    assert owner == {"owner_job": job.metadata.name, "owner_uid": job.metadata.uid}
    owned = settings.model_copy(update={"kube": settings.kube.model_copy(update=owner)})
    plan = demo_plan(campaign)
    as_controller = client.CoreV1Api(client.ApiClient(controller_identity))
    route = manifests.Route("http://10.96.0.10:8080", token="prt1.x.y")
    session = manifests.session_pod(owned, plan, plan.probes[0].id, "present-001", 1, "task", route)
    canary = manifests.canary_pod(owned, campaign, 1, "e30=", manifests.Route("http://10.96.0.10:8080"))
    before = manifests.session_pod(settings, plan, plan.probes[0].id, "present-002", 1, "task", route)
    assert "ownerReferences" not in before["metadata"]
    for pod in (session, canary, before):
        as_controller.create_namespaced_pod(namespace, pod)  # the Role allows owning pods by the Job
    client.BatchV1Api(kube_cluster.api_client()).delete_namespaced_job(job.metadata.name, namespace,
                                                                       propagation_policy="Background")
    gone = {session["metadata"]["name"], canary["metadata"]["name"]}
    until(lambda: not gone & {p.metadata.name for p in admin.list_namespaced_pod(namespace).items}, 90,
          f"{sorted(gone)} gone after the Job was deleted", interval=0.5)
    left = admin.read_namespaced_pod(before["metadata"]["name"], namespace)  # the control: nothing owns it
    assert left.metadata.deletion_timestamp is None
    admin.delete_namespaced_pod(before["metadata"]["name"], namespace, grace_period_seconds=0)


def demo_plan(campaign: str):
    from runner.plan import parse_plan

    data = json.loads(demo.PLAN.read_text())
    data.update(campaign=campaign, repetitions=1)
    return parse_plan(data, "plan")


def test_helm_uninstall_keeps_the_session_policy(kube_cluster):
    """A session pod may still run when the chart is uninstalled; before, `helm uninstall` took
    its NetworkPolicy with it and left the pod with open network. The real helm against the real
    API server: everything else goes, the session policy stays, and a reinstall adopts it."""
    uid = secrets.token_hex(3)
    namespace, release = kube_cluster.create_namespace(f"uninstall-{uid}"), f"u-{uid}"
    kubeconfig = ("--kubeconfig", str(kube_cluster.kubeconfig), "-n", namespace)
    install = ("install", release, str(CHART), *kubeconfig, "--set", "bucket.store=s3://probes",
               "--set", "session.canary.enabled=false")
    helm(*install)
    net = client.NetworkingV1Api(kube_cluster.api_client())
    policy = names.object_name(release, "session", "policy")
    assert policy in {p.metadata.name for p in net.list_namespaced_network_policy(namespace).items}
    # Issue 28: the gateway's egress reaches the API server at the endpoints the chart looked up
    # at install (the kubernetes EndpointSlice), as the controller's settings name them too.
    sl = client.DiscoveryV1Api(kube_cluster.api_client()).read_namespaced_endpoint_slice("kubernetes", "default")
    endpoints = [{"cidr": f"{a}/32", "port": p.port} for e in sl.endpoints for a in e.addresses for p in sl.ports]
    assert endpoints
    gateway = net.read_namespaced_network_policy(names.object_name(release, "gateway", "policy"), namespace)
    api_rules = [{"cidr": r.to[0].ip_block.cidr, "port": r.ports[0].port} for r in gateway.spec.egress[2:]]
    assert api_rules == endpoints and gateway.spec.policy_types == ["Ingress", "Egress"]
    cm = client.CoreV1Api(kube_cluster.api_client()).read_namespaced_config_map(f"{release}-settings", namespace)
    assert json.loads(cm.data["RUNNER_KUBE__API_SERVER"]) == endpoints
    helm("uninstall", release, *kubeconfig, "--wait", "--timeout", "60s")
    left = {p.metadata.name for p in net.list_namespaced_network_policy(namespace).items}
    assert left == {policy}  # the gateway's and the Jobs' policies went with the release
    sas = {s.metadata.name for s in client.CoreV1Api(kube_cluster.api_client()).list_namespaced_service_account(namespace).items}
    assert f"{release}-controller" not in sas and f"{release}-session" not in sas
    helm(*install)  # adopted, not refused as an object Helm does not own
    helm("uninstall", release, *kubeconfig)
    client.CoreV1Api(kube_cluster.api_client()).delete_namespace(namespace, propagation_policy="Background")


def test_the_controller_identity_may_create_only_session_pods(kube_cluster, install, controller_identity):
    """RBAC's pods/create let the controller's identity run a pod of any shape; the namespace's
    restricted Pod Security Standard still admits a pod under another ServiceAccount, with a
    token, another image, or another Secret in its environment. The chart's
    ValidatingAdmissionPolicy, bound to that identity, refuses each of them; the session
    template's pods still pass (the campaign test above runs every session through it)."""
    from runner.k8s import manifests

    namespace, release, objs = install
    settings = settings_of(objs, release)
    plan = demo_plan(f"vap-{secrets.token_hex(3)}")
    good = manifests.session_pod(settings, plan, plan.probes[0].id, "present-001", 1, "task",
                                 manifests.Route("http://10.96.0.10:8080", token="prt1.x.y"))
    as_controller = client.CoreV1Api(client.ApiClient(controller_identity))

    def harness(p: dict) -> dict:
        return p["spec"]["containers"][1]

    variants = {
        "another ServiceAccount": lambda p: p["spec"].update(serviceAccountName="default"),
        "a token": lambda p: p["spec"].update(automountServiceAccountToken=True),
        "another image": lambda p: harness(p).update(image="docker.io/library/busybox:1.36"),
        "the bucket Secret in its environment": lambda p: harness(p)["env"].append(
            {"name": "STOLEN", "valueFrom": {"secretKeyRef": {"name": "bucket", "key": "AWS_SECRET_ACCESS_KEY"}}}),
        "the bucket Secret as a volume": lambda p: p["spec"]["volumes"].append(
            {"name": "stolen", "secret": {"secretName": "bucket"}}),
        # through the gateway no session reads the provider key, not even as the exception's path would
        "the provider Secret in its environment": lambda p: harness(p)["env"].append(
            {"name": "ANTHROPIC_API_KEY", "valueFrom": {"secretKeyRef": {"name": "provider", "key": "api-key"}}}),
        "the provider Secret as a volume": lambda p: p["spec"]["volumes"].append(
            {"name": "credentials", "secret": {"secretName": "provider"}}),
        "another component's labels": lambda p: p["metadata"]["labels"].update({"app.kubernetes.io/component": "other"}),
        # what no Pod Security Standard checks (issue 28)
        "a node named": lambda p: p["spec"].update(nodeName="some-node"),
        "a shared process namespace": lambda p: p["spec"].update(shareProcessNamespace=True),
        "hostUsers": lambda p: p["spec"].update(hostUsers=False),
        "another runtime class": lambda p: p["spec"].update(runtimeClassName="runc-unsandboxed"),
        "another node selector": lambda p: p["spec"].update(nodeSelector={"pool": "control-plane"}),
        "a toleration of its own": lambda p: p["spec"].update(tolerations=[{"key": "node-role.kubernetes.io/control-plane",
                                                                            "operator": "Exists", "effect": "NoSchedule"}]),
    }
    # What the restricted standard refuses too, where a namespace does not enforce it (a chart
    # install does not label its own): tried with the namespace's label lifted for the while.
    unlabeled = {
        "seccomp unconfined": lambda p: harness(p)["securityContext"].update(seccompProfile={"type": "Unconfined"}),
        "AppArmor unconfined": lambda p: harness(p)["securityContext"].update(appArmorProfile={"type": "Unconfined"}),
        "a host port": lambda p: harness(p).update(ports=[{"containerPort": 8080, "hostPort": 8080}]),
        "a sysctl": lambda p: p["spec"]["securityContext"].update(sysctls=[{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}]),
    }
    # a runtime class that exists (the API server refuses an unknown one before any policy)
    kube_cluster.apply({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "runc-unsandboxed"},
                        "handler": "runc"})
    _refused(variants, good, namespace, as_controller, kube_cluster)
    core = client.CoreV1Api(kube_cluster.api_client())
    core.patch_namespace(namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "privileged"}}})
    try:
        _refused(unlabeled, good, namespace, as_controller, kube_cluster)
    finally:
        core.patch_namespace(namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
    good["metadata"]["name"] = f"vap-good-{secrets.token_hex(2)}"
    as_controller.create_namespaced_pod(namespace, good)  # the template's own shape passes
    client.CoreV1Api(kube_cluster.api_client()).delete_namespaced_pod(good["metadata"]["name"], namespace,
                                                                     grace_period_seconds=0)


def _refused(variants: dict, good: dict, namespace: str, as_controller, kube_cluster) -> None:
    """Each variant of the good pod, created as the controller, is refused by the chart's policy."""
    import copy

    for i, (what, change) in enumerate(variants.items()):
        pod = copy.deepcopy(good)
        pod["metadata"]["name"] = f"vap-{i}-{secrets.token_hex(2)}"
        change(pod)
        deadline = time.monotonic() + 30  # a new policy is enforced once the API server has loaded it
        while True:
            try:
                as_controller.create_namespaced_pod(namespace, pod)
            except ApiException as e:
                assert e.status in (403, 422) and "ValidatingAdmissionPolicy" in e.body, f"{what}: {e.status} {e.body}"
                break
            client.CoreV1Api(kube_cluster.api_client()).delete_namespaced_pod(pod["metadata"]["name"], namespace,
                                                                             grace_period_seconds=0)
            assert time.monotonic() < deadline, f"{what}: admitted"
            pod["metadata"]["name"] += "x"
            time.sleep(1)


def _kubeconfig(identity: client.Configuration, namespace: str, path: Path) -> Path:
    """A kubeconfig that authenticates as ``identity`` (the controller ServiceAccount's token):
    what a controller process outside the test's own reads, as its pod reads its mounted token."""
    token = identity.api_key["authorization"].removeprefix("Bearer ")
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": identity.host, "certificate-authority": identity.ssl_ca_cert}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": namespace}}]}))
    return path


def test_a_campaign_split_across_an_indexed_job_survives_a_killed_controller(kube_cluster, install, bucket,
                                                                             controller_identity, sim_root, tmp_path,
                                                                             monkeypatch):
    """Issue 32, item 5: "split a campaign across controllers as an Indexed Job, each index owning
    a fixed share of the sessions, the ledger's guarantees kept (no session twice, every session
    once, one verifiable export), and a controller's loss only delaying its share"; done means
    "tested on the cluster tier with a controller killed mid-run".

    The operator sets controller.controllers to 2; a submitted campaign of 8 sessions is then an
    Indexed Job of 2 pods, to which the Job controller gives indexes 0 and 1. Each index's work
    runs as its pod would (the install's settings, the Job's identity and index, the controller
    ServiceAccount's token), each a process. Controller 1 is SIGKILLed while a session of its
    share runs; controller 0 finishes its share meanwhile and leaves the transform to the last;
    controller 1, started again as the Job controller would, adopts its pod and finishes."""
    namespace, release, _ = install
    endpoint, _ = bucket
    api = kube_cluster.api_client()
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    user = _user_env(kube_cluster, install, bucket, tmp_path)
    settings_map = jobs.settings_config_map(release)
    before = core.read_namespaced_config_map(settings_map, namespace).data
    core.patch_namespaced_config_map(settings_map, namespace, {"data": {"RUNNER_KUBE__CONTROLLERS": "2"}})
    try:
        campaign = f"split-{secrets.token_hex(3)}"
        plan = json.loads(demo.PLAN.read_text())
        plan.update(campaign=campaign, repetitions=2)  # 2 probes x 2 arms x 2: 8 sessions, 4 a share
        (tmp_path / "plan.json").write_text(json.dumps(plan))
        submitted = _cli(user, "submit", str(tmp_path / "plan.json"), "--corpus", str(demo.CORPUS))
        assert submitted.returncode == 0, submitted.stderr

        # ---- the Indexed Job, as the API server and its Job controller take it
        job = batch.read_namespaced_job(jobs.job_name(campaign), namespace)
        assert (job.spec.completion_mode, job.spec.completions, job.spec.parallelism, job.spec.backoff_limit_per_index) == (
            "Indexed", 2, 2, jobs.BACKOFF_LIMIT)
        command = job.spec.template.spec.containers[0].command
        assert command == ["probe-runner", "controller", "--campaign", campaign, "--shares", "2"]

        def index_pods() -> list[client.V1Pod] | None:
            found = core.list_namespaced_pod(namespace, label_selector=f"job-name={job.metadata.name}").items
            return found if len(found) >= 2 else None

        pods = until(index_pods, 30, "both indexes' pods", interval=0.3)
        indexes = {p.metadata.annotations["batch.kubernetes.io/job-completion-index"] for p in pods}
        assert indexes == {"0", "1"}
        assert all("JOB_COMPLETION_INDEX" in {e.name for e in p.spec.containers[0].env} for p in pods)

        # ---- each index's work as its pod would do it
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
        env.update(core.read_namespaced_config_map(settings_map, namespace).data, **BUCKET_ENV,
                   RUNNER_KUBE__KUBECONFIG=str(_kubeconfig(controller_identity, namespace, tmp_path / "kubeconfig")),
                   # The Job's uid names the split run (its shares' end markers). Not its name: session pods
                   # would then be the Job's, and KWOK completes a Job's pods at once, taking them from SimNode.
                   RUNNER_KUBE__OWNER_UID=job.metadata.uid)

        logs: list[Path] = []

        def controller(index: int) -> subprocess.Popen[str]:
            logs.append(tmp_path / f"controller-{index}.{len(logs)}.log")
            return subprocess.Popen([sys.executable, "-m", "runner", *command[1:]], text=True, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=open(logs[-1], "w"),
                                    env={**env, "JOB_COMPLETION_INDEX": str(index), "RUNNER_LOG__LEVEL": "info",
                                         "RUNNER_LOCAL__WORKDIR": str(tmp_path / f"controller-{index}"),
                                         # pods have an address each; two processes on this host do not
                                         "RUNNER_METRICS__PORT": "0"})

        for k, v in BUCKET_ENV.items():
            monkeypatch.setenv(k, v)
        store = open_store("s3://probes", Settings(store="s3://probes", s3={"endpoint_url": endpoint, "region": "us-east-1"}))
        shares = [[s.key for s in Share(i, 2).sessions(parse_plan(plan, "plan"))] for i in range(2)]
        real = sim_root / "shared" / "real.jsonl"
        real.write_bytes(REAL_STREAM.read_bytes())
        real.chmod(0o644)
        slow = ["sh", "-c", 'sleep 3; exec cat "$0"', str(real)]  # each harness runs 3 s: long enough to be killed in
        with SessionNode(api, namespace, sim_root, slow, harness_binds=(str(sim_root / "shared"),)) as sim:
            first, second = controller(0), controller(1)

            def running_in_share_1() -> str | None:
                states = Ledger(store, campaign).sessions()
                return next((k for k in shares[1] if k in states and states[k].status == "started"), None)

            killed_in = until(running_in_share_1, 120, "a session of share 1 started", interval=0.2)
            # Its pods carry its share's label: its watch selects them alone.
            labelled = core.list_namespaced_pod(namespace, label_selector=f"{names.SHARE}=1-of-2").items
            assert labelled and {f"{p.metadata.annotations[names.PROBE]}/{p.metadata.annotations[names.SESSION]}"
                                 for p in labelled} <= set(shares[1])
            second.kill()
            second.wait(30)

            def ended(proc: subprocess.Popen[str], log: Path) -> tuple[str, str]:
                """Its stdout and log, once it has ended; what the pods and the node show where it does not."""
                try:
                    return proc.communicate(timeout=180)[0], log.read_text()
                except subprocess.TimeoutExpired:
                    proc.kill()
                    shown = kube_cluster.kubectl("-n", namespace, "get", "pods", "-o", "wide", check=False).stdout
                    raise AssertionError(f"{log.name} did not end:\n{log.read_text()[-3000:]}\npods:\n{shown}\n"
                                         f"node errors: {sim.errors}") from None

            out, err = ended(first, logs[0])
            # Controller 0 finished its share while controller 1 was down: the loss delayed share 1 alone.
            assert first.returncode == 0, err
            assert "share 0-of-2 ended; the transform runs when the last share ends (waiting for 1-of-2)" in out, out + err
            states = Ledger(store, campaign).sessions()
            assert {states[k].status for k in shares[0]} == {"succeeded"}
            assert states[killed_in].status == "started"  # no outcome while its controller is gone
            assert not store.exists(f"campaigns/{campaign}/transformed.json")
            # Started again, as the Job controller starts a failed index's pod again.
            again = controller(1)
            out, err = ended(again, logs[-1])
            assert not sim.errors, sim.errors
        assert again.returncode in (0, 12), err  # 12: intake may refuse the replayed stream's sessions; all ran
        ledger = Ledger(store, campaign)
        states = ledger.sessions()
        assert sorted(states) == sorted(shares[0] + shares[1]) and {s.status for s in states.values()} == {"succeeded"}
        intents = [(e["session"], e["attempt"]) for e in ledger.entries if e["type"] == "intent"]
        assert len(intents) == len(set(intents)) == 8 and {a for _, a in intents} == {1}  # every session once
        assert len(sim.created) == 8 and all(len(uids) == 1 for uids in sim.created.values())  # no pod made twice
        assert all(len(runs) == 1 for runs in sim.harness_runs.values()) and len(sim.harness_runs) == 8
        # One journal for the whole campaign: its chain verifies, and one export holds every entry.
        assert ledger.verify() == []
        verified = _cli(user, "ledger", "verify", campaign)
        assert verified.returncode == 0, verified.stderr
        exported = _cli(user, "ledger", "export", campaign)
        assert exported.returncode == 0 and len(exported.stdout.splitlines()) == len(ledger.entries), exported.stderr
        # The last share ran the transform over every session: status finds the transcripts ready.
        status = json.loads(_cli(user, "status", campaign, "--json").stdout)
        assert status["sessions"] == {"succeeded": 8} and status["transcripts"]["ready"], status
    finally:
        core.patch_namespaced_config_map(settings_map, namespace,
                                         {"data": {"RUNNER_KUBE__CONTROLLERS": before["RUNNER_KUBE__CONTROLLERS"]}})
