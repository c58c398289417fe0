"""Smoke tests of the real control plane started by the ``kube_cluster`` fixture, through the
Python ``kubernetes`` client: the API, admission, scheduling and watches are real; nodes and
pods are simulated by KWOK, which serves logs from files and runs exec on this host."""

from __future__ import annotations

import secrets
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from kubernetes.stream import stream
from kubernetes.stream.ws_client import ERROR_CHANNEL

from tests.support.waiting import until

sys.path.insert(0, str(Path(__file__).parent))
from relay import Relay  # noqa: E402

# ``kube_cluster`` is a conftest.KubeCluster; it is not imported (conftest modules of several
# test directories share the module name "conftest"), its helpers are reached through it.


def _uid() -> str:
    return secrets.token_hex(3)


@pytest.fixture(scope="module")
def core(kube_cluster) -> client.CoreV1Api:
    return client.CoreV1Api(kube_cluster.api_client())


@pytest.fixture(scope="module")
def nodes(kube_cluster) -> list[str]:
    return kube_cluster.add_nodes(3, prefix=f"smoke-{_uid()}")


@pytest.fixture
def namespace(kube_cluster, core: client.CoreV1Api):
    name = kube_cluster.create_namespace(f"smoke-{_uid()}")
    yield name
    core.delete_namespace(name, propagation_policy="Background")


def _run_pod(core: client.CoreV1Api, namespace: str, name: str, containers=("main",),
             timeout: int = 60) -> client.V1Pod:
    """Create a plain pod (no nodeSelector, no affinity, no tolerations) and wait, with a
    real watch, until it is Running."""
    body = client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(containers=[
            client.V1Container(name=c, image="registry.invalid/probe:never-pulled") for c in containers
        ]),
    )
    created = core.create_namespaced_pod(namespace, body)
    w = watch.Watch()
    for event in w.stream(core.list_namespaced_pod, namespace,
                          field_selector=f"metadata.name={name}",
                          resource_version=created.metadata.resource_version,
                          timeout_seconds=timeout):
        pod = event["object"]
        if pod.status and pod.status.phase == "Running":
            w.stop()
            return pod
    raise AssertionError(f"pod {namespace}/{name} not Running after {timeout}s: "
                         f"{core.read_namespaced_pod(name, namespace).status}")


def test_api_server_version_and_namespace(kube_cluster, core: client.CoreV1Api):
    version = client.VersionApi(kube_cluster.api_client()).get_code()
    assert version.git_version.startswith("v1."), version
    assert version.git_version != "v0.0.0-master+$Format:%H$"

    name = f"smoke-ns-{_uid()}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        got = core.read_namespace(name)
        assert got.status.phase == "Active"
        names = {ns.metadata.name for ns in core.list_namespace().items}
        assert {name, "default", "kube-system"} <= names
    finally:
        core.delete_namespace(name)


def test_nodes_are_kwok_fake_nodes(core: client.CoreV1Api, nodes: list[str]):
    assert len(nodes) == 3
    for name in nodes:
        node = core.read_node(name)
        assert node.metadata.annotations["kwok.x-k8s.io/node"] == "fake"
        ready = [c for c in node.status.conditions if c.type == "Ready"]
        assert ready and ready[0].status == "True", node.status.conditions


def test_pod_is_scheduled_to_a_kwok_node_and_runs(core: client.CoreV1Api, nodes: list[str],
                                                 namespace: str):
    pod = _run_pod(core, namespace, "sched")
    assert pod.spec.node_name, pod
    node = core.read_node(pod.spec.node_name)
    assert node.metadata.annotations.get("kwok.x-k8s.io/node") == "fake"
    # The real scheduler bound it (a Scheduled event from default-scheduler).
    events = core.list_namespaced_event(namespace, field_selector="involvedObject.name=sched")
    assert any(e.reason == "Scheduled" and (e.source.component or e.reporting_component or "")
               .endswith("scheduler") for e in events.items), [e.reason for e in events.items]
    assert pod.status.container_statuses[0].ready is True


def test_logs_served_from_cri_file_via_cluster_logs_and_logs(
        kube_cluster, core: client.CoreV1Api, nodes: list[str], namespace: str,
        tmp_path: Path):
    # ClusterLogs: every pod of the namespace serves the same file.
    shared = kube_cluster.write_cri_log(tmp_path / "shared.log", ["from the cluster rule"])
    kube_cluster.serve_cluster_logs(f"smoke-{namespace}", shared, match_namespaces=[namespace])
    _run_pod(core, namespace, "by-rule")
    _run_pod(core, namespace, "by-pod", containers=("main", "side"))

    deadline = time.monotonic() + 30
    while True:
        try:
            text = core.read_namespaced_pod_log("by-rule", namespace, container="main")
            break
        except ApiException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)
    assert text == "from the cluster rule\n"

    # Logs (per pod, per container) wins over the cluster rule.
    main_log = kube_cluster.write_cri_log(tmp_path / "main.log", ["line one", ("stderr", "line two (stderr)")])
    kube_cluster.serve_logs("by-pod", namespace, main_log, containers=["main"])
    assert core.read_namespaced_pod_log("by-pod", namespace, container="main") == \
        "line one\nline two (stderr)\n"
    assert core.read_namespaced_pod_log("by-pod", namespace, container="main", tail_lines=1) == \
        "line two (stderr)\n"
    stamped = core.read_namespaced_pod_log("by-pod", namespace, container="main", timestamps=True)
    assert stamped.splitlines()[0].endswith("Z line one"), stamped
    # A container the Logs object does not list has no log (the per-pod object matched).
    with pytest.raises(ApiException):
        core.read_namespaced_pod_log("by-pod", namespace, container="side")


def test_logs_follow_streams_appended_lines(kube_cluster, core: client.CoreV1Api,
                                            nodes: list[str], namespace: str, tmp_path: Path):
    log_file = kube_cluster.write_cri_log(tmp_path / "follow.log", ["first"])
    _run_pod(core, namespace, "follow")
    kube_cluster.serve_logs("follow", namespace, log_file)

    resp = core.read_namespaced_pod_log("follow", namespace, follow=True,
                                        _preload_content=False, _request_timeout=30)
    got: list[str] = []
    done = threading.Event()

    def reader() -> None:
        buf = b""
        try:
            for chunk in resp.stream(amt=64, decode_content=False):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    got.append(line.decode())
                    if line == b"third":
                        done.set()
                        return
        except Exception:  # noqa: BLE001 - the connection is closed below
            pass
        finally:
            done.set()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    until(lambda: "first" in got, 15, "the first line", seen=lambda: got)
    assert got[:1] == ["first"], got
    # The stream stays open: lines appended later arrive on it.
    kube_cluster.write_cri_log(log_file, ["second", "third"], append=True)
    assert done.wait(20), got
    resp.release_conn()
    resp.close()
    assert got == ["first", "second", "third"]


def test_exec_runs_on_host_in_work_dir_with_env(kube_cluster, core: client.CoreV1Api,
                                                nodes: list[str], namespace: str, tmp_path: Path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "marker.txt").write_text("on the host\n")
    _run_pod(core, namespace, "exec")
    kube_cluster.serve_exec("exec", namespace, work, env={"PROBE_SMOKE": "value-42"})

    out = stream(core.connect_get_namespaced_pod_exec, "exec", namespace,
                 command=["sh", "-c", 'pwd; echo "$PROBE_SMOKE"; cat marker.txt; echo made > created.txt'],
                 stdout=True, stderr=True, stdin=False, tty=False)
    assert out.splitlines() == [str(work), "value-42", "on the host"], out
    # It really ran here.
    assert (work / "created.txt").read_text() == "made\n"

    # stderr and the failure come back over the stream too. KWOK does not report a
    # non-zero exit as kubelet does (status NonZeroExitCode with the code as a cause, which
    # ``WSClient.returncode`` parses); it reports a Failure whose message ends with
    # "exit status N".
    resp = stream(core.connect_get_namespaced_pod_exec, "exec", namespace,
                  command=["sh", "-c", "echo oops >&2; exit 3"],
                  stdout=True, stderr=True, stdin=False, tty=False, _preload_content=False)
    resp.run_forever(timeout=20)
    assert resp.read_stderr() == "oops\n"
    status = yaml.safe_load(resp.read_channel(ERROR_CHANNEL))
    resp.close()
    assert status["status"] == "Failure", status
    assert status["message"].endswith("exit status 3"), status

    ok = stream(core.connect_get_namespaced_pod_exec, "exec", namespace, command=["true"],
                stdout=True, stderr=True, stdin=False, tty=False, _preload_content=False)
    ok.run_forever(timeout=20)
    assert ok.returncode == 0
    ok.close()


def test_cluster_exec_rule(kube_cluster, core: client.CoreV1Api, nodes: list[str],
                           namespace: str, tmp_path: Path):
    kube_cluster.serve_cluster_exec(f"smoke-{namespace}", tmp_path, match_namespaces=[namespace])
    _run_pod(core, namespace, "cexec")
    deadline = time.monotonic() + 30
    while True:
        try:
            out = stream(core.connect_get_namespaced_pod_exec, "cexec", namespace,
                         command=["pwd"], stdout=True, stderr=True, stdin=False, tty=False)
            if out.strip() == str(tmp_path):
                break
        except ApiException:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"ClusterExec not served: {out!r}")
        time.sleep(0.3)


def test_api_server_rejects_invalid_objects(core: client.CoreV1Api, namespace: str):
    with pytest.raises(ApiException) as bad_name:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="Not_A_Valid_Name")))
    assert bad_name.value.status == 422
    assert "Invalid" in bad_name.value.body

    with pytest.raises(ApiException) as no_containers:
        core.create_namespaced_pod(namespace, client.V1Pod(
            metadata=client.V1ObjectMeta(name="empty"), spec=client.V1PodSpec(containers=[])))
    assert no_containers.value.status == 422

    with pytest.raises(ApiException) as missing:
        core.read_namespaced_pod("does-not-exist", namespace)
    assert missing.value.status == 404


def test_an_exec_whose_server_stops_mid_frame_ends_at_the_frame_limit(kube_cluster, core: client.CoreV1Api,
                                                                       nodes: list[str], namespace: str, tmp_path: Path):
    """Before, a frame cut off part-way blocked the read for ever (the exec's socket had no
    timeout and its deadline was checked only between frames): one such exec froze its session
    and, under the process-wide connect lock, every other. Now it fails at the frame limit and
    is retried as any broken transfer."""
    from runner.k8s.api import ExecError, Kube
    from runner.settings import KubeSettings

    _run_pod(core, namespace, "stall")
    kube_cluster.serve_exec("stall", namespace, tmp_path, env={})
    host, port = kube_cluster.server.removeprefix("https://").rsplit(":", 1)
    relay = Relay((host, int(port)), stall_after=70_001)  # past the upgrade, inside the output's frames
    admin = kube_cluster.api_client().configuration
    cfg = client.Configuration()
    cfg.host, cfg.ssl_ca_cert, cfg.verify_ssl = f"https://127.0.0.1:{relay.port}", admin.ssl_ca_cert, admin.verify_ssl
    cfg.cert_file, cfg.key_file, cfg.api_key = admin.cert_file, admin.key_file, admin.api_key
    kube = Kube(KubeSettings(namespace=namespace, exec_frame_timeout_seconds=2), api_client=client.ApiClient(cfg))
    started = time.monotonic()
    with pytest.raises(ExecError, match="a frame took more than 2 s"):
        kube.exec("stall", "main", ["head", "-c", "4000000", "/dev/zero"], timeout=120)
    assert relay.stalled.is_set() and time.monotonic() - started < 30
