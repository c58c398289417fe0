"""The Kubernetes executor against the real API server of ``kube_cluster``: session pods are
created, scheduled over simulated nodes, watched, exec'd into and deleted for real; ``SimNode``
plays the node (see simnode.py), running the product's reader and harness entry points."""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from decimal import Decimal
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from kubernetes import client

import runner
from runner import demo, layout
from runner.budget import books
from runner.campaign import run_sessions
from runner.demo.provider import ScriptedProvider
from runner.executors.kubernetes import START_ATTEMPTS, KubernetesExecutor
from runner.k8s import names
from runner.k8s.api import Kube
from runner.ledger import Ledger
from runner.phases import ORDER, durations
from runner.plan import parse_plan
from runner.settings import load_settings
from runner.store import open_store
from runner.transform.run import run_transform

sys.path.insert(0, str(Path(__file__).parent))
from relay import Relay  # noqa: E402
from simnode import Replay, SimNode, as_in_pod  # noqa: E402

from tests.support.executor_conformance import Conformant, ExecutorConformance  # noqa: E402
from tests.support.waiting import until

REAL_STREAM = Path(__file__).parents[1] / "data" / "claude-code-2.1.197" / "read-write-answer.jsonl"


class TestConformance(ExecutorConformance):
    """The executor conformance suite (tests/support/executor_conformance.py), as the local and
    the test-only plain executor pass it in tests/integration/: pods on the simulated nodes,
    the real CLI in the harness container's place."""

    @pytest.fixture
    def conformant(self, kube_cluster, nodes, namespace, sim_root, tmp_path, claude_path):
        store = (tmp_path / "store").as_uri()
        with ScriptedProvider(json.loads(demo.SCENARIOS.read_text())) as provider, \
                SimNode(kube_cluster.api_client(), namespace, sim_root, [claude_path]):
            settings = _settings(_env(kube_cluster, namespace, store, RUNNER_PROVIDER__BASE_URL=provider.base_url,
                                      RUNNER_PROVIDER__API_KEY="demo-key"))
            yield Conformant(KubernetesExecutor(settings, Kube(settings.kube)), open_store(store), tmp_path / "work")


def _uid() -> str:
    return secrets.token_hex(3)


@pytest.fixture(scope="module")
def nodes(kube_cluster) -> list[str]:
    return kube_cluster.add_nodes(20, prefix=f"exec-{_uid()}")


@pytest.fixture
def namespace(kube_cluster):
    """A namespace with the provider credentials Secret the chart's values name."""
    name = kube_cluster.create_namespace(f"exec-{_uid()}")
    kube_cluster.apply([{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "provider", "namespace": name},
                         "stringData": {"api-key": "demo-key"}}, *install_objects(name)])
    yield name
    client.CoreV1Api(kube_cluster.api_client()).delete_namespace(name, propagation_policy="Background")


def install_objects(namespace: str) -> list[dict]:
    """What the chart installs that session pods need here: the egress proxy's Service and the
    session pods' own ServiceAccount (a pod naming a missing one is not admitted)."""
    return [proxy_service(namespace), {"apiVersion": "v1", "kind": "ServiceAccount", "automountServiceAccountToken": False,
                                       "metadata": {"name": names.session_service_account("probe-runner"), "namespace": namespace}}]


def proxy_service(namespace: str) -> dict:
    """The egress proxy Service the chart installs (its pods are not needed here: SimNode's
    harness reaches the scripted provider on loopback); the executor reads its ClusterIP."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "probe-runner-egress-proxy", "namespace": namespace},
            "spec": {"selector": names.selector("probe-runner", names.PROXY_COMPONENT),
                     "ports": [{"port": 3128, "targetPort": 3128, "protocol": "TCP"}]}}


@pytest.fixture
def sim_root():
    """Where SimNode keeps its pods; readable by the pods' uids (pytest's tmp_path is not)."""
    d = Path(tempfile.mkdtemp(prefix="simnode-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    subprocess.run(["rm", "-rf", str(d)], check=False)


@pytest.fixture
def shared(sim_root) -> Path:
    """A directory the harness override can read (bound read-only into the harness sandbox)."""
    d = sim_root / "shared"
    d.mkdir(mode=0o755)
    return d


@pytest.fixture
def real_stream(shared) -> Path:
    p = shared / "real.jsonl"
    p.write_bytes(REAL_STREAM.read_bytes())
    p.chmod(0o644)
    return p


@pytest.fixture(scope="module")
def claude_path() -> str:
    found = shutil.which("claude")
    if not found:
        pytest.fail("the Claude Code CLI is not on PATH (.ci/setup installs it)", pytrace=False)
    return os.path.realpath(found)


def _env(kube_cluster, namespace: str, store: str, **extra: str) -> dict[str, str]:
    return {
        "RUNNER_STORE": store,
        "RUNNER_KUBE__NAMESPACE": namespace,
        "RUNNER_KUBE__KUBECONFIG": str(kube_cluster.kubeconfig),
        "RUNNER_KUBE__API_BACKOFF_SECONDS": "0.2",
        "RUNNER_KUBE__START_TIMEOUT_SECONDS": "30",
        "RUNNER_KUBE__CREDENTIALS_SECRET": "provider",
        # The egress proxy's path (test_gateway_in_cluster.py runs the gateway's).
        "RUNNER_GATEWAY__ENABLED": "false",
        # KWOK runs no container, so no canary can measure anything here (tests/node/ does).
        "RUNNER_KUBE__CANARY_ENABLED": "false",
        **extra,
    }


def _settings(env: dict[str, str], **overrides):
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        return load_settings(**overrides)


def _plan(campaign: str, repetitions: int) -> tuple:
    data = json.loads(demo.PLAN.read_text())
    data["campaign"] = campaign
    data["repetitions"] = repetitions
    return parse_plan(data, "plan")


def _replay(path: Path, delay: float = 0.0) -> list[str]:
    """A harness override that writes a stream the real CLI produced (its flags are ignored)."""
    return ["sh", "-c", f'sleep {delay}; exec cat "$0"', str(path)]


def _pods(kube_cluster, namespace: str) -> list:
    return client.CoreV1Api(kube_cluster.api_client()).list_namespaced_pod(namespace).items


def _wait_no_pods(kube_cluster, namespace: str, timeout: float = 60) -> None:
    until(lambda: not _pods(kube_cluster, namespace), timeout, "the session pods gone", interval=0.3,
          seen=lambda: [p.metadata.name for p in _pods(kube_cluster, namespace)])


def test_campaign_through_pods_with_the_real_cli(kube_cluster, nodes, namespace, sim_root, tmp_path,
                                                claude_path):
    """The demo campaign (8 sessions) end to end: pods, the real CLI in the harness container's
    place, streams through the reader socket and exec, transcripts that pass intake."""
    store = (tmp_path / "store").as_uri()
    audit_from = kube_cluster.audit_offset()
    with ScriptedProvider(json.loads(demo.SCENARIOS.read_text())) as provider, \
            SimNode(kube_cluster.api_client(), namespace, sim_root, [claude_path]) as sim:
        env = {**os.environ, **_env(kube_cluster, namespace, store,
                                    RUNNER_PROVIDER__BASE_URL=provider.base_url,
                                    RUNNER_PROVIDER__API_KEY="demo-key",
                                    RUNNER_LOCAL__WORKDIR=str(tmp_path / "work"),
                                    RUNNER_LOG__LEVEL="info")}  # its tally of requests at the end (below)
        plan_file = tmp_path / "plan.json"
        data = json.loads(demo.PLAN.read_text())
        data["campaign"] = f"k8s-{_uid()}"
        plan_file.write_text(json.dumps(data))
        proc = subprocess.run([sys.executable, "-m", "runner", "run", str(plan_file), "--corpus", str(demo.CORPUS),
                               "--executor", "kubernetes", "--concurrency", "4"],
                              env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr + proc.stdout + "\n".join(sim.errors) + sim.logs()
        assert sim.max_running <= 4
        assert all(len(uids) == 1 for uids in sim.created.values()) and len(sim.created) == 8
        # Session pods may send no DNS query: the proxy is given by the Service's ClusterIP.
        ip = client.CoreV1Api(kube_cluster.api_client()).read_namespaced_service("probe-runner-egress-proxy", namespace).spec.cluster_ip
        proxies = {e["value"] for spec in sim.specs.values() for e in spec["containers"][1]["env"] if e["name"] == "HTTPS_PROXY"}
        assert proxies == {f"http://{ip}:3128"}
        assert len(provider.main_loop_requests()) >= 8
    assert "transcript campaign-present" in proc.stdout and "transcript campaign-absent" in proc.stdout
    assert "refused:" not in proc.stdout, proc.stdout
    st = open_store(store)
    ledger = Ledger(st, data["campaign"])
    assert not ledger.verify()
    assert {s.status for s in ledger.sessions().values()} == {"succeeded"}
    for key in ledger.sessions():
        capture = json.loads(st.get(f"campaigns/{data['campaign']}/sessions/{key}/capture.json"))
        assert capture["executor"] == "kubernetes" and capture["network_confined"] is True
        assert capture["stream"]["sha256"] == capture["reader"]["sha256"]
        assert capture["reader"]["peer_uid"] == 10001  # the harness uid, checked by the reader
        raw = st.get(capture["stream"]["key"])
        assert "sha256:" + hashlib.sha256(raw).hexdigest() == capture["stream"]["sha256"]
        assert_pod_phases(capture["phases"], key)
    _wait_no_pods(kube_cluster, namespace)
    # Every request of the runner names it, exec included, so an operator (and bench/scale.py)
    # can tell its load on the API server from everyone else's in the audit log. Here the
    # runner alone creates and execs into session pods; SimNode (another client of the same
    # user) alone reports their status.
    events, _ = kube_cluster.audit_events(audit_from)
    mine = [e for e in events if (e.get("objectRef") or {}).get("namespace") == namespace]
    by = {}
    for e in mine:
        ref = e["objectRef"]
        by.setdefault((e["verb"], ref.get("resource", "") + "/" + ref.get("subresource", "")), set()).add(e["userAgent"])
    runner_agent = {f"probe-runner/{runner.__version__}"}
    assert by[("create", "pods/")] == runner_agent, by
    assert runner_agent < by[("delete", "pods/")], by  # KWOK finishes the graceful deletions it asked for
    assert by[("get", "pods/exec")] == runner_agent, by
    assert runner_agent.isdisjoint(by[("patch", "pods/status")]), by
    execs = [e for e in mine if e["objectRef"].get("subresource") == "exec"]
    # Two execs end to end where the stream and the files fit in a chunk: the delivery and the
    # finish (before, five: the delivery, a check before it, the record, the stream, the packing).
    kinds: dict[str, list[str]] = {}
    for e in execs:
        kinds.setdefault(e["objectRef"]["name"], []).append(_exec_kind(e))
    assert len(kinds) == 8 and {frozenset(k) for k in kinds.values()} == {frozenset({"deliver", "finish"})}, kinds
    # Two each; past them, only one for each the controller retried (its own tally), as after KWOK
    # failed one past its upgrade (audited as a success: 101). Under load they came by the 4.
    tally = re.search(r"exec transfers \d+ \((\d+) retried\)", proc.stderr)
    assert tally, proc.stderr[-2000:]
    assert 8 * 2 <= len(execs) <= 8 * 2 + int(tally[1]), (kinds, tally[0])


def _exec_kind(event: dict) -> str:
    """Which of the reader's commands an exec of the audit log ran (runner/entrypoints/pod.py):
    its script's $0 (fetch, finish), or deliver, the one without."""
    query = parse_qs(urlsplit(event["requestURI"]).query)
    return {"finish", "fetch"}.intersection(query["command"]).pop() if {"finish", "fetch"} & set(query["command"]) \
        else "deliver" if any("delivered" in c for c in query["command"]) else "other"


# The milestones a session pod has here (issue 31, item 2), in their order: KWOK reports no
# PodReadyToStartContainers, so no sandbox_ready; no budget is set, so no budget_held.
POD_PHASES = ["queued", "slot_held", "pod_created", "scheduled", "image_pulled", "containers_started", "workspace_delivered",
              "harness_started", "first_reply", "harness_exited", "stream_collected", "artifacts_collected"]


def assert_pod_phases(phases: dict, session: str) -> None:
    """Every milestone of a session pod, in order: the campaign's, then the pod watch's and the
    controller's, the harness's entry point's and the reader's (the node's clock, here this
    host's) between them. The entry point may start the CLI before the controller's delivery
    exec has returned to it: its start is after the reader ran and before its first reply."""
    assert [m for m in ORDER if m in phases] == POD_PHASES and set(phases) == {*POD_PHASES, "policy_wait_seconds"}, \
        (session, phases)
    controller = [phases[m] for m in POD_PHASES if m != "harness_started"]
    assert controller == sorted(controller), (session, phases)
    assert phases["containers_started"] <= phases["harness_started"] <= phases["first_reply"], (session, phases)
    assert phases["policy_wait_seconds"] == 0  # no API server address in the harness's environment here: no wait
    durations_ = durations(phases)
    assert list(durations_) == POD_PHASES[1:] and durations_["harness_exited"] > 0, (session, durations_)


def test_two_hundred_sessions_over_twenty_nodes(kube_cluster, nodes, namespace, sim_root, shared, real_stream, tmp_path):
    """200 sessions, concurrency 20: never more harnesses at once, every pod created once,
    spread over the nodes, nothing left behind, the ledger verifies."""
    store_uri = (tmp_path / "store").as_uri()
    settings = _settings(_env(kube_cluster, namespace, store_uri, RUNNER_PROVIDER__API_KEY="k",
                              RUNNER_KUBE__CREATE_CONCURRENCY="10"))
    plan = _plan(f"scale-{_uid()}", 50)  # 2 probes x 2 arms x 50
    store = open_store(store_uri, settings)
    executor = KubernetesExecutor(settings, Kube(settings.kube))
    with SimNode(kube_cluster.api_client(), namespace, sim_root, _replay(real_stream, 0.2), harness_binds=(str(shared),)) as sim:
        t0 = time.monotonic()
        try:
            report = run_sessions(plan, demo.CORPUS, store, executor, tmp_path / "work", 20, [])
        finally:
            executor.close()
        took = time.monotonic() - t0
        assert not sim.errors, sim.errors
        assert 1 < sim.max_running <= 20
        assert len(sim.created) == 200 and all(len(u) == 1 for u in sim.created.values())
    print(f"200 sessions in {took:.1f} s, at most {sim.max_running} harnesses at once")
    states = Ledger(store, plan.campaign).sessions()
    assert len(report.ran) == 200
    assert {s.status for s in states.values()} == {"succeeded"}, \
        [(k, s.status, s.detail, sim.logs(names.object_name(plan.campaign, *k.split("/"), s.attempt)))
         for k, s in states.items() if s.status != "succeeded"]
    assert not Ledger(store, plan.campaign).verify()
    _wait_no_pods(kube_cluster, namespace, timeout=120)


def test_the_light_node_runs_a_whole_wave_at_once_and_every_stream_passes_intake(kube_cluster, nodes, namespace, sim_root,
                                                                                 tmp_path):
    """bench/scale.py's node: no process per pod (Replay). 48 sessions at once over 20 nodes:
    every harness starts before the first ends, each once; the controller's transfers (real
    execs into the pods' directories) verify every stream against the reader's record as the
    light node wrote it, and every transcript passes intake. The pods' exec objects exist
    before the pods are scheduled, so no delivery meets KWOK's "no exec found"."""
    store_uri = (tmp_path / "store").as_uri()
    settings = _settings(_env(kube_cluster, namespace, store_uri, RUNNER_PROVIDER__API_KEY="k",
                              RUNNER_KUBE__CREATE_CONCURRENCY="16"))
    plan = _plan(f"light-{_uid()}", 12)  # 2 probes x 2 arms x 12
    stream = sim_root / "replay.jsonl"
    stream.write_bytes(as_in_pod(REAL_STREAM.read_bytes()))
    store = open_store(store_uri, settings)
    executor = KubernetesExecutor(settings, Kube(settings.kube))
    audit_from = kube_cluster.audit_offset()
    with SimNode(kube_cluster.api_client(), namespace, sim_root, Replay(stream, 20.0)) as sim:
        try:
            report = run_sessions(plan, demo.CORPUS, store, executor, tmp_path / "work", 48, [])
        finally:
            executor.close()
        assert not sim.errors, sim.errors
        assert sim.max_running == 48
        assert len(sim.harness_runs) == 48 and all(len(r) == 1 and r[0][1] is not None for r in sim.harness_runs.values())
    states = Ledger(store, plan.campaign).sessions()
    assert len(report.ran) == 48 and {s.status for s in states.values()} == {"succeeded"}, \
        {k: (s.status, s.detail) for k, s in states.items() if s.status != "succeeded"}
    assert {s.attempt for s in states.values()} == {1}
    execs = [e for e in kube_cluster.audit_events(audit_from)[0]
             if (e.get("objectRef") or {}).get("namespace") == namespace and e["objectRef"].get("subresource") == "exec"]
    assert not [e for e in execs if e["responseStatus"]["code"] >= 400], \
        Counter(e["responseStatus"]["code"] for e in execs)  # no exec needed a retry
    # 20 s sessions: the delivery and the finish (no follow: the stream is followed every 60 s),
    # and again each exec KWOK failed after the API server upgraded it (audited 101; the
    # controller retried it: CI saw 4 of the deliveries so)
    kinds, retried = Counter(_exec_kind(e) for e in execs), executor.kube.tally.retried.get("exec transfers", 0)
    assert set(kinds) == {"deliver", "finish"} and min(kinds.values()) >= 48 and kinds.total() == 96 + retried, \
        (kinds, retried)
    for key in states:
        capture = json.loads(store.get(f"campaigns/{plan.campaign}/sessions/{key}/capture.json"))
        assert capture["stream"]["sha256"] == capture["reader"]["sha256"] == "sha256:" + hashlib.sha256(stream.read_bytes()).hexdigest()
        assert capture["reader"]["peer_uid"] == settings.kube.harness_uid
    intake = run_transform(store, plan)
    assert len(intake.arms) == 2 and all(a.refusal is None and a.events == 24 for a in intake.arms), intake  # an arm: 2 probes x 12
    _wait_no_pods(kube_cluster, namespace, timeout=120)


def test_controller_killed_and_restarted_creates_no_session_twice(kube_cluster, nodes, namespace, sim_root, shared,
                                                                  real_stream, tmp_path):
    store_uri = (tmp_path / "store").as_uri()
    env = {**os.environ, **_env(kube_cluster, namespace, store_uri, RUNNER_PROVIDER__API_KEY="k",
                                RUNNER_LOCAL__WORKDIR=str(tmp_path / "work"))}
    plan = _plan(f"restart-{_uid()}", 8)  # 32 sessions
    plan_file = tmp_path / "plan.json"
    plan_file.write_bytes(plan.canonical_json())
    argv = [sys.executable, "-m", "runner", "run", str(plan_file), "--corpus", str(demo.CORPUS),
            "--executor", "kubernetes", "--concurrency", "6"]
    with SimNode(kube_cluster.api_client(), namespace, sim_root, _replay(real_stream, 1.0), harness_binds=(str(shared),)) as sim:
        first = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        store = open_store(store_uri)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            done = [s for s in Ledger(store, plan.campaign).sessions().values() if s.outcome]
            if len(done) >= 8:
                break
            time.sleep(0.2)
        first.send_signal(signal.SIGKILL)
        first.wait()
        in_flight = [s for s in Ledger(store, plan.campaign).sessions().values() if s.status in ("intended", "started")]
        assert in_flight, "the kill came too late to leave sessions in flight"
        second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
        assert second.returncode in (0, 12), second.stderr
        assert not sim.errors, sim.errors
        assert len(sim.created) == 32 and all(len(u) == 1 for u in sim.created.values()), \
            {k: v for k, v in sim.created.items() if len(v) > 1}
    ledger = Ledger(store, plan.campaign)
    assert not ledger.verify()
    intents = [e for e in ledger.entries if e["type"] == "intent"]
    assert len(intents) == 32 and {e["attempt"] for e in intents} == {1}
    assert {s.status for s in ledger.sessions().values()} == {"succeeded"}
    _wait_no_pods(kube_cluster, namespace)


def test_a_budget_holds_through_a_controller_killed_and_restarted(kube_cluster, nodes, namespace, sim_root, shared,
                                                                  real_stream, tmp_path):
    """Issue 15: "a restarted or resumed campaign keeps the same books". Eight sessions of
    $0.003 each (the replayed stream's cost), each reserving $0.504 ($0.004 session limit +
    $0.50 a call: one Sonnet 4.5 call may ask for 32,000 output tokens, $0.48, and a run whose
    call_usd cannot hold that is refused), under a $0.517 budget: five fit ($0.003 x 4 + $0.504
    <= $0.517), a sixth does not ($0.003 x 5 + $0.504 > $0.517). The
    controller is SIGKILLed once a session has settled while another is in flight; the
    restarted one adopts their pods, whose reservations the ledger kept, and starts no session
    the books cannot hold: five succeed, three are not started (exit 3; one of them may have
    been journaled as intended by the first run), no pod is created twice, and the realized
    cost stays within the budget."""
    store_uri = (tmp_path / "store").as_uri()
    env = {**os.environ, **_env(kube_cluster, namespace, store_uri, RUNNER_PROVIDER__API_KEY="k",
                                RUNNER_LOCAL__WORKDIR=str(tmp_path / "work"), RUNNER_BUDGET__CALL_USD="0.50")}
    plan = _plan(f"books-{_uid()}", 2)  # 8 sessions
    plan_file = tmp_path / "plan.json"
    plan_file.write_bytes(plan.canonical_json())
    argv = [sys.executable, "-m", "runner", "run", str(plan_file), "--corpus", str(demo.CORPUS), "--executor", "kubernetes",
            "--concurrency", "4", "--budget-usd", "0.517", "--session-budget-usd", "0.004"]
    with SimNode(kube_cluster.api_client(), namespace, sim_root, _replay(real_stream, 1.0), harness_binds=(str(shared),)) as sim:
        first = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        store = open_store(store_uri)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # killed with settled sessions and one in flight
            states = Ledger(store, plan.campaign).sessions().values()
            if any(s.outcome for s in states) and any(s.status == "started" for s in states):
                break
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)
        first.wait()
        killed = Ledger(store, plan.campaign)
        assert [s for s in killed.sessions().values() if s.status == "started"], "the kill came too late"
        assert books(killed).reserved > 0
        second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
        assert not sim.errors, sim.errors
        assert all(len(u) == 1 for u in sim.created.values()), {k: v for k, v in sim.created.items() if len(v) > 1}
    assert second.returncode == 3, second.stderr
    assert "budget: 3 session(s) not started" in second.stderr, second.stderr
    ledger = Ledger(store, plan.campaign)
    assert not ledger.verify()
    states = ledger.sessions()
    # Five ran; of the three the budget stopped, one the first run journaled (killed before its
    # start) stays intended, never started, like those it never journaled.
    assert [s.status for s in states.values()].count("succeeded") == 5
    assert all(s.status == "intended" and not s.started for s in states.values() if s.status != "succeeded")
    assert sum(1 for e in ledger.entries if e["type"] == "start") == 5
    final = books(ledger)
    assert final.reserved == 0 and final.spent == Decimal("0.015") <= Decimal("0.517")
    assert {e["reserved_usd"] for e in ledger.entries if e["type"] == "start"} == {"0.504"}
    _wait_no_pods(kube_cluster, namespace)


def test_pod_deleted_mid_stream_is_interrupted_and_keeps_what_arrived(kube_cluster, nodes, namespace, sim_root, shared,
                                                                     tmp_path):
    """The pod goes (as on an eviction: its volumes with it) seconds after the harness wrote its
    first lines. Before, the stream was fetched only after the harness's end, so nothing of it
    was left; now it is followed while the session runs (every kube.stream_poll_seconds) and
    what arrived is kept, never presented as the stream."""
    store_uri = (tmp_path / "store").as_uri()
    settings = _settings(_env(kube_cluster, namespace, store_uri, RUNNER_PROVIDER__API_KEY="k",
                              RUNNER_KUBE__STREAM_POLL_SECONDS="0.3"))
    plan = _plan(f"deleted-{_uid()}", 1)
    first_lines = shared / "head.jsonl"
    first_lines.write_bytes(b"".join(REAL_STREAM.read_bytes().splitlines(keepends=True)[:3]))
    harness = ["sh", "-c", 'cat "$0"; exec sleep 600', str(first_lines)]
    store = open_store(store_uri, settings)
    executor = KubernetesExecutor(settings, Kube(settings.kube))
    core = client.CoreV1Api(kube_cluster.api_client())
    with SimNode(kube_cluster.api_client(), namespace, sim_root, harness, harness_binds=(str(shared),)) as sim:
        def delete_one() -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                live = [p for p in sim.pods.values() if p.harness_started]
                if live:
                    time.sleep(3.0)  # the session runs on: its first lines are out, several polls passed
                    core.delete_namespaced_pod(live[0].name, namespace, grace_period_seconds=0)
                    return
                time.sleep(0.1)

        killer = threading.Thread(target=delete_one)
        killer.start()
        plan = plan.model_copy(update={"probes": plan.probes[:1], "arms": plan.arms[:1]})
        try:
            run_sessions(plan, demo.CORPUS, store, executor, tmp_path / "work", 1, [])
        finally:
            executor.close()
        killer.join()
    (state,) = Ledger(store, plan.campaign).sessions().values()
    assert state.status == "interrupted"
    assert "deleted" in state.detail["reason"]
    kept = state.detail.get("partial_stream")
    assert kept is not None, state.detail  # what the reader had when the pod went: never presented as the stream
    assert store.get(kept["key"]) == first_lines.read_bytes()
    assert not store.exists(f"campaigns/{plan.campaign}/sessions/{state.key}/stream.jsonl")


def test_sixty_mib_stream_with_a_dropped_transfer_arrives_whole(kube_cluster, nodes, namespace, sim_root, shared,
                                                               tmp_path):
    """Past the kubelet's default log rotation (10 MiB x 5), through exec transfers of 4 MiB
    (each its own connection), the first of which the network cuts mid-transfer: every byte
    arrives once, verified."""
    lines = REAL_STREAM.read_bytes().splitlines(keepends=True)
    big = shared / "big.jsonl"
    with open(big, "wb") as f:
        while f.tell() < 60 * 1024 * 1024:
            f.writelines(lines)
    want = "sha256:" + hashlib.sha256(big.read_bytes()).hexdigest()
    server = kube_cluster.server.removeprefix("https://")
    host, port = server.rsplit(":", 1)
    proxy = Relay((host, int(port)), cut_after=3 * 1024 * 1024)  # inside the first 4 MiB transfer
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(Path(kube_cluster.kubeconfig).read_text().replace(server, f"127.0.0.1:{proxy.port}"))
    store_uri = (tmp_path / "store").as_uri()
    settings = _settings({**_env(kube_cluster, namespace, store_uri, RUNNER_PROVIDER__API_KEY="k"),
                          "RUNNER_KUBE__KUBECONFIG": str(kubeconfig)})
    plan = _plan(f"big-{_uid()}", 1)
    plan = plan.model_copy(update={"probes": plan.probes[:1], "arms": plan.arms[:1]})
    store = open_store(store_uri, settings)
    executor = KubernetesExecutor(settings, Kube(settings.kube))
    with SimNode(kube_cluster.api_client(), namespace, sim_root, _replay(big), harness_binds=(str(shared),)) as sim:
        try:
            run_sessions(plan, demo.CORPUS, store, executor, tmp_path / "work", 1, [])
        finally:
            executor.close()
        assert not sim.errors, sim.errors
    assert proxy.cuts == 1
    (state,) = Ledger(store, plan.campaign).sessions().values()
    assert state.status == "succeeded", state.detail
    assert state.detail["stream"]["bytes"] == big.stat().st_size and state.detail["stream"]["sha256"] == want
    assert "sha256:" + hashlib.sha256(store.get(state.detail["stream"]["key"])).hexdigest() == want


def test_a_workspace_past_the_collection_limit_is_not_collected_and_the_event_says_why(kube_cluster, nodes, namespace,
                                                                                       sim_root, tmp_path, claude_path):
    """Issue 14, item 3: "a size limit per session that is a setting and a clear outcome when
    it is exceeded". The real CLI runs a demo session whose workspace packs to more than a
    4 KiB kube.collect_max_bytes: nothing of it is fetched, the session still succeeds with its
    stream, its capture record says why, and its event has no produced key, with the reason in
    the transcript's prose."""
    store_uri = (tmp_path / "store").as_uri()
    plan = _plan(f"limit-{_uid()}", 1)
    plan = plan.model_copy(update={"probes": plan.probes[:1], "arms": plan.arms[:1]})
    with ScriptedProvider(json.loads(demo.SCENARIOS.read_text())) as provider, \
            SimNode(kube_cluster.api_client(), namespace, sim_root, [claude_path]) as sim:
        settings = _settings(_env(kube_cluster, namespace, store_uri, RUNNER_PROVIDER__BASE_URL=provider.base_url,
                                  RUNNER_PROVIDER__API_KEY="demo-key", RUNNER_KUBE__COLLECT_MAX_BYTES="4096"))
        store = open_store(store_uri, settings)
        executor = KubernetesExecutor(settings, Kube(settings.kube))
        try:
            run_sessions(plan, demo.CORPUS, store, executor, tmp_path / "work", 1, [])
        finally:
            executor.close()
        assert not sim.errors, sim.errors
    (key, state), = Ledger(store, plan.campaign).sessions().items()
    assert state.status == "succeeded", state.detail
    keys = layout.SessionKeys(plan.campaign, *key.split("/"), state.attempt)
    capture = json.loads(store.get(keys.capture))
    assert capture["artifacts"] is None
    assert capture["artifacts_not_collected"] == ("the workspace packs to more than kube.collect_max_bytes (4096 bytes); "
                                                  "its files were not collected")
    assert not [k for k in store.list(keys.prefix) if "/artifacts/" in k]
    report = run_transform(store, plan)
    (arm,) = report.arms
    assert arm.refusal is None and arm.events == 1 and arm.key is not None, report
    transcript = store.get(arm.key).decode()
    assert "produced:" not in transcript
    assert "kube.collect_max_bytes (4096 bytes); its files were not collected, so the event has no produced key" \
        in " ".join(transcript.split()), transcript
    _wait_no_pods(kube_cluster, namespace)


def test_unschedulable_session_never_starts_is_cleaned_up_and_stays_runnable(kube_cluster, nodes, namespace, sim_root,
                                                                           shared, real_stream, tmp_path):
    """A pod no node accepts spent nothing: it is deleted and tried again (START_ATTEMPTS
    times), the session stays intended, no pod is left, and `run` says so with exit 1."""
    store_uri = (tmp_path / "store").as_uri()
    env = {**os.environ, **_env(kube_cluster, namespace, store_uri, RUNNER_PROVIDER__API_KEY="k",
                                RUNNER_LOCAL__WORKDIR=str(tmp_path / "work"),
                                RUNNER_KUBE__START_TIMEOUT_SECONDS="2",
                                RUNNER_KUBE__NODE_SELECTOR='{"pool": "no-such-pool"}')}
    data = json.loads(demo.PLAN.read_text())
    data.update(campaign=f"unsched-{_uid()}", arms=["present"], repetitions=1, probes=data["probes"][:1])
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(data))
    with SimNode(kube_cluster.api_client(), namespace, sim_root, _replay(real_stream), harness_binds=(str(shared),)) as sim:
        proc = subprocess.run([sys.executable, "-m", "runner", "run", str(plan_file), "--corpus", str(demo.CORPUS),
                               "--executor", "kubernetes"], env=env, capture_output=True, text=True, timeout=120)
        assert not sim.pods, "an unschedulable pod must never reach a node"
    assert proc.returncode == 1, proc.stderr
    assert "not started: 1 session(s), e.g. HW-PRB-0007/present-001" in proc.stderr
    assert "unschedulable" in proc.stderr, proc.stderr
    (pod_uids,) = sim.created.values()
    assert len(pod_uids) == START_ATTEMPTS  # created, found unschedulable, deleted: each time a new pod
    (state,) = Ledger(open_store(store_uri), data["campaign"]).sessions().values()
    assert state.status == "intended" and not state.started
    _wait_no_pods(kube_cluster, namespace)
    # `status` says why it waits, in the scheduler's words (before: only "pending" counts).
    status = subprocess.run([sys.executable, "-m", "runner", "status", data["campaign"]], env=env, capture_output=True,
                            text=True, timeout=60)
    assert status.returncode == 0, status.stderr
    assert "1 waiting: did not start: not running after 2 s: unschedulable: 0/" in status.stdout, status.stdout
    assert "didn't match Pod's node affinity/selector" in status.stdout, status.stdout


def test_a_pod_waiting_to_start_holds_no_slot_of_the_running_sessions(kube_cluster, nodes, namespace, sim_root, shared,
                                                                       real_stream, tmp_path):
    """Issue 14: "pending pods never hold the slots of running ones". Concurrency 1, two
    sessions; the first one's pod fits no node until the cluster grows (a node pool scaled up
    later, as an autoscaler does). Before, the waiting pod held the only slot: the second
    session started only after the first gave up (3 x the start timeout). Now the waiting pod
    steps aside after kube.waiting_grace_seconds, the second session runs meanwhile, and when
    the new node takes the first pod it waits, running, for the slot before its harness may
    start (its start is journaled after the other's outcome), and one pod for each session
    (none recreated)."""
    store_uri = (tmp_path / "store").as_uri()
    settings = _settings(_env(kube_cluster, namespace, store_uri, RUNNER_PROVIDER__API_KEY="k",
                              RUNNER_KUBE__START_TIMEOUT_SECONDS="60", RUNNER_KUBE__WAITING_PODS="1",
                              RUNNER_KUBE__WAITING_GRACE_SECONDS="1"))
    plan = _plan(f"aside-{_uid()}", 2)
    plan = plan.model_copy(update={"probes": plan.probes[:1], "arms": plan.arms[:1]})
    store = open_store(store_uri, settings)
    executor = KubernetesExecutor(settings, Kube(settings.kube))
    pool = f"late-{_uid()}"
    stuck: dict[str, str] = {}
    real_create = executor.kube.create_pod

    def create_pod(manifest: dict) -> bool:
        """The first session to get a slot is the one whose pods need the node pool that does not exist yet."""
        session = manifest["metadata"]["annotations"][names.SESSION]
        stuck.setdefault("session", session)
        if session == stuck["session"]:
            manifest = {**manifest, "spec": {**manifest["spec"], "nodeSelector": {"pool": pool}}}
        return real_create(manifest)

    executor.kube.create_pod = create_pod  # type: ignore[method-assign]
    seen: dict[str, object] = {}
    with SimNode(kube_cluster.api_client(), namespace, sim_root, _replay(real_stream, 6.0), harness_binds=(str(shared),)) as sim:
        def grow_the_cluster_while_the_other_runs() -> None:
            deadline = time.monotonic() + 45  # before the fix the other never starts: grow anyway, so the run ends
            while time.monotonic() < deadline and not any(p.harness_started for p in list(sim.pods.values())):
                time.sleep(0.1)
            seen["other_started_after"] = 45 - (deadline - time.monotonic())
            time.sleep(1.0)  # the Waiting writer's flush (at most once a second)
            seen["waiting"] = json.loads(store.get(layout.waiting_key(plan.campaign)))
            kube_cluster.add_nodes(1, prefix=pool, labels={"pool": pool})

        grower = threading.Thread(target=grow_the_cluster_while_the_other_runs)
        grower.start()
        try:
            report = run_sessions(plan, demo.CORPUS, store, executor, tmp_path / "work", 1, [])
        finally:
            executor.close()
        grower.join()
        assert not sim.errors, sim.errors
        # Both pods ran at once (SimNode counts harness containers, which wait for their
        # workspace): the first one's pod came up while the other session ran, and waited.
        assert sim.max_running == 2
        assert all(len(uids) == 1 for uids in sim.created.values()), sim.created
    assert seen["other_started_after"] < 20, seen  # before: 45 (the first session held the slot)
    assert "unschedulable" in seen["waiting"]["sessions"][f"{plan.probes[0].id}/{stuck['session']}"]["reason"], seen
    assert len(report.ran) == 2
    ledger = Ledger(store, plan.campaign)
    states = ledger.sessions()
    assert {s.status for s in states.values()} == {"succeeded"}, {k: (s.status, s.detail) for k, s in states.items()}
    waited = f"{plan.probes[0].id}/{stuck['session']}"
    (other,) = set(states) - {waited}
    at = {(e["type"], e["session"]): e["at"] for e in ledger.entries if e["type"] in ("start", "outcome")}
    # The waiting session's harness started only once the other had ended: its slot came back.
    assert at[("start", other)] < at[("outcome", other)] <= at[("start", waited)], at
    assert not ledger.verify()
    _wait_no_pods(kube_cluster, namespace)


def test_a_session_the_namespace_quota_refuses_waits_and_says_so(kube_cluster, nodes, namespace, sim_root, shared,
                                                                 real_stream, tmp_path):
    """A ResourceQuota that admits no more pods is a wait, not a failure: before, the 403 from
    pod creation ended the session as an error. It is retried until the start timeout, then
    the session stays intended (nothing was spent), and `status` names the quota."""
    client.CoreV1Api(kube_cluster.api_client()).create_namespaced_resource_quota(namespace, {
        "metadata": {"name": "no-more-pods"}, "spec": {"hard": {"pods": "0"}}})
    store_uri = (tmp_path / "store").as_uri()
    env = {**os.environ, **_env(kube_cluster, namespace, store_uri, RUNNER_PROVIDER__API_KEY="k",
                                RUNNER_LOCAL__WORKDIR=str(tmp_path / "work"), RUNNER_KUBE__START_TIMEOUT_SECONDS="6")}
    data = json.loads(demo.PLAN.read_text())
    data.update(campaign=f"quota-{_uid()}", arms=["present"], repetitions=1, probes=data["probes"][:1])
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(data))
    with SimNode(kube_cluster.api_client(), namespace, sim_root, _replay(real_stream), harness_binds=(str(shared),)):
        proc = subprocess.run([sys.executable, "-m", "runner", "run", str(plan_file), "--corpus", str(demo.CORPUS),
                               "--executor", "kubernetes"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "not started: 1 session(s)" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    (state,) = Ledger(open_store(store_uri), data["campaign"]).sessions().values()
    assert state.status == "intended" and not state.started
    status = subprocess.run([sys.executable, "-m", "runner", "status", data["campaign"], "--json"], env=env,
                            capture_output=True, text=True, timeout=60)
    (why,) = json.loads(status.stdout)["waiting"].values()
    assert why["reason"].startswith("did not start: the namespace's quota refused the pod") and "exceeded quota" in why["reason"]


def test_builders_policies_are_accepted_and_a_foreign_allow_policy_refuses_the_run(kube_cluster, namespace, tmp_path):
    """The API server accepts our NetworkPolicies as built; a second policy that selects
    session pods and allows anything (allow rules add up) stops `run` before any intent."""
    from runner.k8s.policy import proxy_network_policy, session_network_policy

    store_uri = (tmp_path / "store").as_uri()
    env = _env(kube_cluster, namespace, store_uri, RUNNER_PROVIDER__API_KEY="k", RUNNER_LOCAL__WORKDIR=str(tmp_path / "work"))
    settings = _settings(env)
    ours = [session_network_policy(settings), proxy_network_policy(settings)]
    net = client.NetworkingV1Api(kube_cluster.api_client())
    for p in ours:
        net.create_namespaced_network_policy(namespace, p)
    data = json.loads(demo.PLAN.read_text())
    data.update(campaign=f"foreign-{_uid()}", arms=["present"], repetitions=1, probes=data["probes"][:1])
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(data))
    argv = [sys.executable, "-m", "runner", "run", str(plan_file), "--corpus", str(demo.CORPUS), "--executor", "kubernetes"]

    net.create_namespaced_network_policy(namespace, {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": "allow-egress"},
        "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": [{}]}})
    proc = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "NetworkPolicy allow-egress also selects session pods" in proc.stderr and "Traceback" not in proc.stderr
    assert not Ledger(open_store(store_uri), data["campaign"]).entries
    assert not _pods(kube_cluster, namespace)


def test_harness_container_that_would_be_dumpable_is_refused_before_the_cli_runs(kube_cluster, nodes, namespace, sim_root,
                                                                               shared, real_stream, tmp_path):
    """An image whose ELF loader is readable would leave the CLI dumpable (its /proc/PID/mem
    and fds open to the session): the entry point refuses, the session is journaled refused
    with the reason, and not a byte of the replayed stream was produced."""
    store_uri = (tmp_path / "store").as_uri()
    settings = _settings(_env(kube_cluster, namespace, store_uri, RUNNER_PROVIDER__API_KEY="k"))
    plan = _plan(f"dumpable-{_uid()}", 1)
    plan = plan.model_copy(update={"probes": plan.probes[:1], "arms": plan.arms[:1]})
    store = open_store(store_uri, settings)
    executor = KubernetesExecutor(settings, Kube(settings.kube))
    with SimNode(kube_cluster.api_client(), namespace, sim_root, _replay(real_stream), harness_binds=(str(shared),),
                 loader_exec_only=False) as sim:
        try:
            run_sessions(plan, demo.CORPUS, store, executor, tmp_path / "work", 1, [])
        finally:
            executor.close()
        assert not sim.errors, sim.errors
    (state,) = Ledger(store, plan.campaign).sessions().values()
    assert state.status == "refused" and "ELF loader is readable" in state.detail["reason"], state.detail
    assert not store.exists(f"campaigns/{plan.campaign}/sessions/{state.key}/stream.jsonl")
    _wait_no_pods(kube_cluster, namespace)
