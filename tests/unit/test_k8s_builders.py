"""The Kubernetes builders and readers that touch no network: names, the session pod, the
pod-state rules and the exec status parser, each against complete expected values."""

from __future__ import annotations

import json
import re

import pytest

from runner import demo
from runner.k8s import manifests, names, podstate
from runner.k8s.api import exit_code
from runner.plan import parse_plan
from runner.settings import Settings

DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@pytest.fixture
def plan():
    return parse_plan(json.loads(demo.PLAN.read_text()), "plan")


# ---- names ----------------------------------------------------------------------------------

def test_object_names_are_dns1123_deterministic_and_distinct():
    a = names.object_name("status-2026", "HW-PRB-0007", "present-001", 1)
    assert a == names.object_name("status-2026", "HW-PRB-0007", "present-001", 1)
    assert a.startswith("status-2026-hw-prb-0007-present-001-1-") and DNS1123.match(a)
    # Sanitising maps these to the same readable text; the hash of the exact parts tells them apart.
    assert names.object_name("a_b", 1) != names.object_name("a.b", 1)
    long = names.object_name("c" * 80, "HW-PRB-0007", "present-001", 2)
    assert len(long) == 63 and DNS1123.match(long)
    assert long != names.object_name("c" * 81, "HW-PRB-0007", "present-001", 2)  # cut text, other hash
    assert DNS1123.match(names.object_name("___"))  # nothing readable left: the hash alone


def test_label_values_are_valid_and_selectors_use_the_same_constants():
    assert names.label_value("HW-PRB-0007") == "HW-PRB-0007"
    assert names.label_value("a b/c") == "a-b-c"
    long = names.label_value("x" * 70)
    assert len(long) <= 63 and re.match(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$", long)
    assert names.selector("inst", names.SESSION_COMPONENT, "demo") == {
        "app.kubernetes.io/name": "probe-runner", "app.kubernetes.io/instance": "inst",
        "app.kubernetes.io/component": "session", "probe-runner.io/campaign": "demo"}
    labels = names.session_labels("inst", "demo", "HW-PRB-0007", "present-001", 2)
    assert names.selector("inst", names.SESSION_COMPONENT, "demo").items() <= labels.items()
    assert names.selector_string({"b": "2", "a": "1"}) == "a=1,b=2"


# ---- the session pod -------------------------------------------------------------------------

def test_session_pod_complete(plan):
    settings = Settings(store="file:///tmp/s", kube={"credentials_secret": "provider", "runtime_class": "gvisor",
                                                      "node_selector": {"pool": "probes"},
                                                      "tolerations": [{"key": "probes", "operator": "Exists"}],
                                                      "owner_job": "controller-demo-0c1d", "owner_uid": "6f1c-uid",
                                                      "priority_class": "probe-sessions"})
    task = plan.probes[0].task
    pod = manifests.session_pod(settings, plan, "HW-PRB-0007", "present-001", 1, task, manifests.Route("https://api.anthropic.com", proxy="http://10.96.0.12:3128"))
    name = names.object_name("probe-runner", "demo", "HW-PRB-0007", "present-001", 1)
    security = lambda uid: {  # noqa: E731
        "runAsUser": uid, "runAsGroup": uid, "runAsNonRoot": True, "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False, "privileged": False, "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"}}
    assert pod == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "probe-runner",
            # deleting the campaign's controller Job deletes the pod (not its controller reference)
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "controller-demo-0c1d", "uid": "6f1c-uid"}],
            "labels": {
                "app.kubernetes.io/name": "probe-runner", "app.kubernetes.io/instance": "probe-runner",
                "app.kubernetes.io/component": "session", "app.kubernetes.io/part-of": "probe-runner",
                "app.kubernetes.io/managed-by": "probe-runner", "probe-runner.io/campaign": "demo",
                "probe-runner.io/probe": "HW-PRB-0007", "probe-runner.io/session": "present-001",
                "probe-runner.io/attempt": "1",
            },
            "annotations": {"probe-runner.io/campaign": "demo", "probe-runner.io/probe": "HW-PRB-0007",
                            "probe-runner.io/session": "present-001", "probe-runner.io/attempt": "1",
                            # a session cannot move: node consolidation must not evict it
                            "cluster-autoscaler.kubernetes.io/safe-to-evict": "false", "karpenter.sh/do-not-disrupt": "true",
                            # gVisor's mount hints: the socket volume one mount of the pod's
                            "dev.gvisor.spec.mount.socket.share": "pod", "dev.gvisor.spec.mount.socket.type": "tmpfs",
                            "dev.gvisor.spec.mount.socket.options": "rw"},
        },
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": 600 + 1800 + 900,  # start, the session's limit, collection
            "serviceAccountName": "probe-runner-session",  # its own, with nothing bound
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "shareProcessNamespace": False,
            "hostNetwork": False,
            "hostPID": False,
            "hostIPC": False,
            "terminationGracePeriodSeconds": 5,
            "securityContext": {"runAsNonRoot": True, "fsGroup": 10001, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [
                {
                    "name": "reader",
                    "image": "ghcr.io/probe-runner/runner:0.1.0",
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python3", "-m", "runner.entrypoints.pod", "reader"],
                    "env": [{"name": "PROBE_CAPTURE_DIR", "value": "/run/probe/capture"},
                            {"name": "PROBE_SOCKET_DIR", "value": "/run/probe/socket"},
                            {"name": "PROBE_WORKSPACE", "value": "/workspace"},
                            {"name": "PROBE_HARNESS_UID", "value": "10001"},
                            {"name": "PROBE_DEADLINE_SECONDS", "value": "3300"}],
                    "resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                                  "limits": {"cpu": "500m", "memory": "256Mi"}},
                    "securityContext": security(10002),
                    "volumeMounts": [{"name": "capture", "mountPath": "/run/probe/capture"},
                                     {"name": "socket", "mountPath": "/run/probe/socket"},
                                     {"name": "workspace", "mountPath": "/workspace"}],
                },
                {
                    "name": "harness",
                    "image": "ghcr.io/probe-runner/harness:0.1.0",
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python3", "-m", "runner.entrypoints.pod", "harness", "--"],
                    "args": ["claude", "-p", "--output-format", "stream-json", "--verbose",
                             "--setting-sources", "project,local", "--permission-mode", "dontAsk",
                             "--model", "claude-sonnet-4-5",
                             "--tools", "Read,Grep,Glob,Edit,Write,MultiEdit,NotebookEdit,Bash,Skill",
                             "--allowedTools", "Read", "Grep", "Glob", "Edit", "Write", "MultiEdit", "NotebookEdit", "Bash", "Skill",
                             "--disallowedTools", "WebSearch", "WebFetch"],
                    "workingDir": "/workspace",
                    "env": [
                        {"name": "PATH", "value": "/usr/local/bin:/usr/bin:/bin"},
                        {"name": "HOME", "value": "/run/probe/config"},
                        {"name": "CLAUDE_CONFIG_DIR", "value": "/run/probe/config"},
                        {"name": "TMPDIR", "value": "/tmp"},
                        {"name": "LANG", "value": "C.UTF-8"},
                        {"name": "ANTHROPIC_BASE_URL", "value": "https://api.anthropic.com"},
                        {"name": "HTTPS_PROXY", "value": "http://10.96.0.12:3128"},
                        {"name": "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "value": "1"},
                        {"name": "DISABLE_AUTOUPDATER", "value": "1"},
                        {"name": "PROBE_TASK", "value": task},
                        {"name": "PROBE_SOCKET_DIR", "value": "/run/probe/socket"},
                        {"name": "PROBE_TIMEOUT_SECONDS", "value": "1800"},
                        {"name": "PROBE_CREDENTIALS_FILE", "value": "/run/probe/secret/credentials.json"},
                        {"name": "PROBE_CREDENTIALS_TARGET", "value": "/run/probe/config/.credentials.json"},
                        {"name": "ANTHROPIC_API_KEY", "valueFrom": {"secretKeyRef": {
                            "name": "provider", "key": "api-key", "optional": True}}},
                    ],
                    "resources": {"requests": {"cpu": "500m", "memory": "1Gi"},
                                  "limits": {"cpu": "2", "memory": "4Gi", "ephemeral-storage": "2Gi"}},
                    "securityContext": security(10001),
                    "volumeMounts": [{"name": "workspace", "mountPath": "/workspace"},
                                     {"name": "config", "mountPath": "/run/probe/config"},
                                     {"name": "tmp", "mountPath": "/tmp"},
                                     {"name": "socket", "mountPath": "/run/probe/socket"},
                                     {"name": "credentials", "mountPath": "/run/probe/secret", "readOnly": True}],
                },
            ],
            "volumes": [
                {"name": "workspace", "emptyDir": {"sizeLimit": "2Gi"}},
                {"name": "config", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
                {"name": "tmp", "emptyDir": {"sizeLimit": "2Gi"}},
                {"name": "socket", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
                {"name": "capture", "emptyDir": {"sizeLimit": "2Gi"}},
                {"name": "credentials", "secret": {"secretName": "provider", "optional": True, "defaultMode": 0o400,
                                                   "items": [{"key": "credentials.json", "path": "credentials.json"}]}},
            ],
            "runtimeClassName": "gvisor",
            "nodeSelector": {"pool": "probes"},
            "tolerations": [{"key": "probes", "operator": "Exists"}],
            "priorityClassName": "probe-sessions",
            "topologySpreadConstraints": [{
                "maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "probe-runner",
                                                  "app.kubernetes.io/instance": "probe-runner",
                                                  "app.kubernetes.io/component": "session",
                                                  "probe-runner.io/campaign": "demo"}},
            }],
        },
    }


PROXY = manifests.Route("https://api.anthropic.com", proxy="http://10.96.0.12:3128")
GATEWAY = manifests.Route("http://10.96.0.20:8080", token="prt1.claims.mac")


def test_session_pod_through_the_gateway_holds_its_token_and_no_credential(plan):
    """Through the gateway the harness gets the gateway by address as its base URL and the
    attempt's token as its key: no proxy, no credentials Secret (not as a variable, not as a
    volume), no provider CA (the gateway's TLS is its own); the reader is unchanged."""
    settings = Settings(store="file:///tmp/s", kube={"credentials_secret": "provider", "provider_ca_configmap": "ca"})
    task = plan.probes[0].task
    via_proxy = manifests.session_pod(settings, plan, "HW-PRB-0007", "present-001", 1, task, PROXY)
    pod = manifests.session_pod(settings, plan, "HW-PRB-0007", "present-001", 1, task, GATEWAY)
    reader, harness = pod["spec"]["containers"]
    assert reader == via_proxy["spec"]["containers"][0]
    assert harness["env"] == [
        {"name": "PATH", "value": "/usr/local/bin:/usr/bin:/bin"},
        {"name": "HOME", "value": "/run/probe/config"},
        {"name": "CLAUDE_CONFIG_DIR", "value": "/run/probe/config"},
        {"name": "TMPDIR", "value": "/tmp"},
        {"name": "LANG", "value": "C.UTF-8"},
        {"name": "ANTHROPIC_BASE_URL", "value": "http://10.96.0.20:8080"},
        {"name": "ANTHROPIC_API_KEY", "value": "prt1.claims.mac"},
        {"name": "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "value": "1"},
        {"name": "DISABLE_AUTOUPDATER", "value": "1"},
        {"name": "PROBE_TASK", "value": task},
        {"name": "PROBE_SOCKET_DIR", "value": "/run/probe/socket"},
        {"name": "PROBE_TIMEOUT_SECONDS", "value": "1800"},
    ]
    assert [m["name"] for m in harness["volumeMounts"]] == ["workspace", "config", "tmp", "socket"]
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["workspace", "config", "tmp", "socket", "capture"]
    assert {k: v for k, v in pod.items() if k != "spec"} == {k: v for k, v in via_proxy.items() if k != "spec"}


def test_canary_pod_reaches_the_route_of_session_pods(plan):
    """Through the gateway the canary is told the gateway's address (its HEAD / must answer)
    and its check's own token (to ask the gateway for what it must refuse), through the proxy
    its HTTPS_PROXY."""
    settings = Settings(store="file:///tmp/s")
    env = lambda route: manifests.canary_pod(settings, "demo", 1, "e30=", route)["spec"]["containers"][0]["env"]  # noqa: E731
    assert env(manifests.Route("http://10.96.0.20:8080"))[:2] == [
        {"name": "PATH", "value": "/usr/local/bin:/usr/bin:/bin"}, {"name": "PROBE_GATEWAY", "value": "10.96.0.20:8080"}]
    assert env(manifests.Route("http://10.96.0.20:8080", token="prt1.c.m"))[:3] == [
        {"name": "PATH", "value": "/usr/local/bin:/usr/bin:/bin"}, {"name": "PROBE_GATEWAY", "value": "10.96.0.20:8080"},
        {"name": "PROBE_TOKEN", "value": "prt1.c.m"}]
    assert env(PROXY)[:2] == [
        {"name": "PATH", "value": "/usr/local/bin:/usr/bin:/bin"}, {"name": "HTTPS_PROXY", "value": "http://10.96.0.12:3128"}]
    # The provider's CA only through the proxy, where the canary itself verifies the provider's TLS: the
    # admission policy admits no ConfigMap volume in a pod of an install with the gateway (found on the real node).
    with_ca = Settings(store="file:///tmp/s", kube={"provider_ca_configmap": "rel-provider-ca"})
    via_gateway = manifests.canary_pod(with_ca, "demo", 1, "e30=", manifests.Route("http://10.96.0.20:8080"))["spec"]
    via_proxy = manifests.canary_pod(with_ca, "demo", 1, "e30=", PROXY)["spec"]
    assert via_gateway["volumes"] == [] and via_gateway["containers"][0]["args"] == ["e30="]
    assert [v["name"] for v in via_proxy["volumes"]] == ["provider-ca"]
    assert via_proxy["containers"][0]["args"] == ["e30=", "/run/probe/provider-ca/ca.crt"]


def test_session_pod_without_optional_parts(plan):
    """No credentials Secret, no runtime class, no spread: nothing of theirs appears, and the
    task never reaches the CLI's argv (only the entry point's environment)."""
    settings = Settings(store="file:///tmp/s", kube={"spread_max_skew": None})
    pod = manifests.session_pod(settings, plan, "HW-PRB-0008", "absent-002", 3, "the task", PROXY)
    spec = pod["spec"]
    assert {"runtimeClassName", "nodeSelector", "tolerations", "topologySpreadConstraints", "imagePullSecrets"}.isdisjoint(spec)
    assert [v["name"] for v in spec["volumes"]] == ["workspace", "config", "tmp", "socket", "capture"]
    harness = spec["containers"][1]
    assert "the task" not in harness["args"]
    assert not any(e["name"] == "ANTHROPIC_API_KEY" for e in harness["env"])
    assert pod["metadata"]["name"] == names.object_name("probe-runner", "demo", "HW-PRB-0008", "absent-002", 3)
    assert "ownerReferences" not in pod["metadata"]  # a workstation run: no Job owns it, its deadline bounds it
    # The reader's capture volume is mounted by the reader alone.
    assert "capture" not in {m["name"] for m in harness["volumeMounts"]}


def test_two_installs_in_one_namespace_never_share_a_pod_name(plan):
    """Before the instance was part of the name, install B's controller found install A's pod
    of the same campaign and session (409 AlreadyExists) and took it for its own."""
    a = manifests.session_pod(Settings(store="file:///s", kube={"instance": "a"}), plan, "HW-PRB-0008", "absent-002", 1, "t", PROXY)
    b = manifests.session_pod(Settings(store="file:///s", kube={"instance": "b"}), plan, "HW-PRB-0008", "absent-002", 1, "t", PROXY)
    assert a["metadata"]["name"] != b["metadata"]["name"]
    assert (a["spec"]["serviceAccountName"], b["spec"]["serviceAccountName"]) == ("a-session", "b-session")


# ---- pod state -------------------------------------------------------------------------------

def _pod(phase="Running", statuses=(), conditions=(), deleting=False, reason=None):
    meta = {"name": "p", "uid": "u"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-03T00:00:00Z"
    status = {"phase": phase, "containerStatuses": list(statuses), "conditions": list(conditions)}
    if reason:
        status["reason"] = reason
    return {"metadata": meta, "status": status}


def _cs(name, **state):
    return {"name": name, "state": state}


def test_image_id_is_the_digest_the_runtime_reports_for_that_container():
    # containerd's CRI reports the repo digest when the image has one, else the config digest.
    pod = _pod(statuses=[{**_cs("reader", running={}), "imageID": "sha256:aaa"},
                         {**_cs("harness", running={}), "imageID": "ghcr.io/probe-runner/harness@sha256:bbb"}])
    assert podstate.image_id(pod, "harness") == "ghcr.io/probe-runner/harness@sha256:bbb"
    assert podstate.image_id(pod, "reader") == "sha256:aaa"
    # Not started yet (or a runtime that leaves it empty): unknown, not an empty string.
    assert podstate.image_id(_pod(statuses=[{**_cs("harness", waiting={}), "imageID": ""}]), "harness") is None
    assert podstate.image_id(_pod(), "harness") is None


def test_pod_state_rules():
    running = _pod(statuses=[_cs("reader", running={}), _cs("harness", running={})])
    assert podstate.running(running, "reader") and podstate.lost(running) is None
    done = _pod(statuses=[_cs("reader", running={}), _cs("harness", terminated={"exitCode": 0})])
    assert podstate.terminated(done, "harness") == {"exitCode": 0} and podstate.terminated(done, "reader") is None
    pulling = _pod(phase="Pending", statuses=[_cs("harness", waiting={"reason": "ImagePullBackOff", "message": "no such image"})])
    assert podstate.never_started(pulling) == "harness: ImagePullBackOff: no such image"
    assert podstate.never_started(_pod(phase="Pending", statuses=[_cs("harness", waiting={"reason": "ContainerCreating"})])) is None
    pending = _pod(phase="Pending", conditions=[{"type": "PodScheduled", "status": "False", "message": "0/20 nodes are available"}])
    assert podstate.unschedulable(pending) == "unschedulable: 0/20 nodes are available"
    assert podstate.lost(None) == "the pod was deleted"
    assert podstate.lost(_pod(deleting=True)) == "the pod is being deleted"
    assert podstate.lost(_pod(phase="Failed", reason="Evicted")) == "the pod failed: Evicted"
    assert podstate.lost(_pod(conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}])) \
        == "the pod is disrupted: DeletionByTaintManager"
    assert podstate.lost(_pod(statuses=[_cs("reader", terminated={"exitCode": 137, "reason": "OOMKilled"})])) \
        == "the capture reader ended (OOMKilled)"


def test_exec_exit_codes():
    assert exit_code(b'{"metadata":{},"status":"Success"}') == 0
    assert exit_code(json.dumps({"status": "Failure", "reason": "NonZeroExitCode",
                                 "details": {"causes": [{"reason": "ExitCode", "message": "3"}]}})) == 3
    assert exit_code('{"status":"Failure","message":"command terminated: exit status 7"}') == 7
    # No status, or one that says nothing of an exit: the transfer broke off, nothing is trusted.
    assert exit_code(b"") is None
    assert exit_code(b"not json") is None
    assert exit_code('{"status":"Failure","message":"container not found"}') is None


def test_provider_ca_bundle_is_mounted_read_only_into_the_harness_alone(plan):
    """The chart's provider.caBundle (a TLS-inspecting gateway's CA) reaches the CLI as
    NODE_EXTRA_CA_CERTS from a read-only ConfigMap volume; without it nothing changes."""
    task = plan.probes[0].task
    plain = manifests.session_pod(Settings(store="file:///tmp/s"), plan, "HW-PRB-0007", "present-001", 1, task, PROXY)
    pod = manifests.session_pod(Settings(store="file:///tmp/s", kube={"provider_ca_configmap": "rel-provider-ca"}),
                                plan, "HW-PRB-0007", "present-001", 1, task, PROXY)
    reader, harness = pod["spec"]["containers"]
    assert reader == plain["spec"]["containers"][0]
    assert pod["spec"]["volumes"] == plain["spec"]["volumes"] + [{"name": "provider-ca", "configMap": {
        "name": "rel-provider-ca", "defaultMode": 0o444, "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]
    assert harness["volumeMounts"] == plain["spec"]["containers"][1]["volumeMounts"] + [
        {"name": "provider-ca", "mountPath": "/run/probe/provider-ca", "readOnly": True}]
    assert harness["env"] == plain["spec"]["containers"][1]["env"] + [
        {"name": "NODE_EXTRA_CA_CERTS", "value": "/run/probe/provider-ca/ca.crt"}]


def test_the_capture_volume_has_a_budget_of_its_own(plan):
    """Before, the capture volume shared the harness's ephemeral-storage quantity with the
    workspace and /tmp; now its size is kube.capture_size_limit alone."""
    settings = Settings(store="file:///s", kube={"capture_size_limit": "5Gi", "resources": {"ephemeral_storage_limit": "1Gi"}})
    pod = manifests.session_pod(settings, plan, "HW-PRB-0008", "absent-002", 1, "t", PROXY)
    sizes = {v["name"]: v["emptyDir"].get("sizeLimit") for v in pod["spec"]["volumes"] if "emptyDir" in v}
    assert sizes["capture"] == "5Gi" and sizes["workspace"] == sizes["tmp"] == "1Gi"


def test_the_operators_harness_env_comes_after_the_harness_own_and_moves_its_credentials(plan):
    """harness.env is laid over the harness's own variables (as it always was), and a
    configuration directory moved there moves where the entry point puts a credentials file
    (PROBE_CREDENTIALS_TARGET, as the harness seam says the CLI reads it)."""
    settings = Settings(store="file:///tmp/s", kube={"credentials_secret": "provider"},
                        harness={"env": {"CLAUDE_CONFIG_DIR": "/run/probe/config/alt", "CLAUDE_CODE_MAX_RETRIES": "3"}})
    pod = manifests.session_pod(settings, plan, "HW-PRB-0007", "present-001", 1, "task", PROXY)
    env = pod["spec"]["containers"][1]["env"]
    names = [e["name"] for e in env]
    assert names[names.index("DISABLE_AUTOUPDATER") + 1:names.index("PROBE_TASK")] == ["CLAUDE_CODE_MAX_RETRIES"]
    assert {e["name"]: e.get("value") for e in env}["CLAUDE_CONFIG_DIR"] == "/run/probe/config/alt"
    assert {"name": "PROBE_CREDENTIALS_TARGET", "value": "/run/probe/config/alt/.credentials.json"} in env
