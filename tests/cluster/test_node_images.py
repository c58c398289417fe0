"""Images that are there (issue 31, item 5), on the real control plane: simulated nodes report
the images their runtime holds (``status.images``, patched through the status subresource as a
kubelet writes it), and `probe-runner doctor --cluster` names the session nodes (those the
install's nodeSelector and tolerations admit) that lack the harness or the runner image, matched
by digest where the install pins one; the chart's pre-pull DaemonSet lands on exactly those
nodes, in a namespace that enforces the restricted Pod Security Standard."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
import yaml
from kubernetes import client

from tests.support.helm import by_kind, render
from tests.support.waiting import until

H = "sha256:" + "5e" * 32
HARNESS = f"ghcr.io/probe-runner/harness@{H}"
RUNNER = "ghcr.io/probe-runner/runner:0.1.0"
BUCKET_ENV = {"AWS_ACCESS_KEY_ID": "probe-runner-test", "AWS_SECRET_ACCESS_KEY": "probe-runner-test"}
# What containerd reports for the images (by tag and by digest, fully qualified).
HARNESS_BY_DIGEST = {"names": [f"ghcr.io/probe-runner/harness@{H}", "ghcr.io/probe-runner/harness:0.1.0"], "sizeBytes": 912_000_000}
HARNESS_OTHER = {"names": ["ghcr.io/probe-runner/harness@sha256:" + "77" * 32, "ghcr.io/probe-runner/harness:0.1.0"],
                 "sizeBytes": 911_000_000}  # the same tag, another image: not the one pinned
RUNNER_BY_TAG = {"names": ["ghcr.io/probe-runner/runner@sha256:" + "88" * 32, RUNNER], "sizeBytes": 190_000_000}


@pytest.fixture(scope="module")
def install(kube_cluster, moto_endpoint):
    """The chart's settings, session ServiceAccount and pre-pull DaemonSet (with its policy) in a
    restricted namespace, session pods confined to a pool of its own (a label and a taint)."""
    uid = secrets.token_hex(3)
    namespace, release, pool = f"img-{uid}", f"pr-{uid}", f"img-{uid}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1", **{
        k.lower(): v for k, v in BUCKET_ENV.items()}).create_bucket(Bucket=f"img-{uid}")
    objs = render(release=release, namespace=namespace, extra=("--skip-tests",), sets=(
        f"bucket.store=s3://img-{uid}", f"bucket.endpoint={moto_endpoint}", "bucket.region=us-east-1",
        f"session.nodeSelector.pool={pool}", f"session.tolerations[0].key={pool}",
        "session.tolerations[0].operator=Exists", "session.tolerations[0].effect=NoSchedule",
        f"images.harnessDigest={H}", "images.prePull.enabled=true", "session.canary.enabled=false"))
    kube_cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": {
        "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}})
    until(lambda: kube_cluster.kubectl("-n", namespace, "get", "serviceaccount", "default", check=False).returncode == 0,
          30, f"namespace {namespace}'s default ServiceAccount", interval=0.2)
    kube_cluster.apply([by_kind(objs, "ConfigMap")[f"{release}-settings"], by_kind(objs, "ServiceAccount")[f"{release}-session"],
                        *by_kind(objs, "DaemonSet").values(), *by_kind(objs, "NetworkPolicy").values()])
    nodes = {
        "pool": kube_cluster.add_nodes(3, prefix=f"img-{uid}", labels={"pool": pool}),
        # tainted for the pool: session pods tolerate it
        "tainted": kube_cluster.add_nodes(1, prefix=f"img-{uid}-t", labels={"pool": pool},
                                          taints=[{"key": pool, "value": "true", "effect": "NoSchedule"}]),
        # in the pool's label, but tainted for something else: no session pod lands here
        "other-taint": kube_cluster.add_nodes(1, prefix=f"img-{uid}-x", labels={"pool": pool},
                                              taints=[{"key": "gpu", "effect": "NoSchedule"}]),
        "unlabelled": kube_cluster.add_nodes(1, prefix=f"img-{uid}-o"),
    }
    yield namespace, release, nodes
    core = client.CoreV1Api(kube_cluster.api_client())
    core.delete_namespace(namespace, propagation_policy="Background")
    for names in nodes.values():
        for n in names:
            core.delete_node(n)


def report_images(kube_cluster, node: str, images: list[dict]) -> None:
    """What a kubelet does: the node's status.images, through the status subresource."""
    client.CoreV1Api(kube_cluster.api_client()).patch_node_status(node, {"status": {"images": images}})


def doctor(kube_cluster, namespace: str, release: str, kubeconfig: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
    env.update(BUCKET_ENV, RUNNER_KUBE__NAMESPACE=namespace, RUNNER_KUBE__INSTANCE=release,
               RUNNER_KUBE__KUBECONFIG=str(kubeconfig or kube_cluster.kubeconfig), RUNNER_STORE="file:///nonexistent")
    done = subprocess.run([sys.executable, "-m", "runner", "doctor", "--cluster"], env=env, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)
    assert "Traceback" not in done.stderr, done.stderr
    return {line[5:].split(": ", 1)[0]: line for line in done.stdout.splitlines()}


def test_doctor_names_the_session_nodes_that_lack_an_image(kube_cluster, install):
    namespace, release, nodes = install
    n0, n1, n2 = nodes["pool"]
    (tainted,) = nodes["tainted"]
    report_images(kube_cluster, n0, [HARNESS_BY_DIGEST, RUNNER_BY_TAG])
    report_images(kube_cluster, n1, [HARNESS_OTHER, RUNNER_BY_TAG])  # the harness's tag, not its digest
    report_images(kube_cluster, tainted, [RUNNER_BY_TAG])
    for n in (*nodes["other-taint"], *nodes["unlabelled"]):  # they lack both, and no session pod lands there
        report_images(kube_cluster, n, [])
    lines = doctor(kube_cluster, namespace, release)
    assert lines["chart"].startswith("ok   chart: ")
    assert lines["images"] == (
        f"WARN images: of 4 session nodes, 3 lack the harness image {HARNESS} ({n1}, {n2}, {tainted}) and 1 lacks the "
        f"runner image {RUNNER} ({n2}): the first session pods there wait for the pull (images.prePull.enabled pulls "
        "them ahead); a node reports at most 50 images, its largest (the kubelet's nodeStatusMaxImages), so one it "
        "does not report may still be there")
    # what the status subresource keeps is what the doctor read (KWOK's heartbeats leave it alone)
    node = client.CoreV1Api(kube_cluster.api_client()).read_node(n1)
    assert [i.names for i in node.status.images] == [HARNESS_OTHER["names"], RUNNER_BY_TAG["names"]]

    for n in (n1, n2, tainted):
        report_images(kube_cluster, n, [HARNESS_BY_DIGEST, RUNNER_BY_TAG])
    assert doctor(kube_cluster, namespace, release)["images"] == (
        f"ok   images: all 4 session nodes report the harness image {HARNESS} and the runner image {RUNNER}")


def test_doctor_says_so_when_its_identity_may_not_list_nodes(kube_cluster, install, tmp_path):
    """A namespace's operator may read the install but not Nodes (cluster-scoped): a WARN that
    says what is missing, and the other checks go on."""
    namespace, release, _ = install
    kube_cluster.apply([
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "operator", "namespace": namespace}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "operator", "namespace": namespace},
         "rules": [{"apiGroups": [""], "resources": ["configmaps", "pods"], "verbs": ["get", "list"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "operator", "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "operator"},
         "subjects": [{"kind": "ServiceAccount", "name": "operator", "namespace": namespace}]},
    ])
    token = kube_cluster.kubectl("-n", namespace, "create", "token", "operator", "--duration=1h").stdout.strip()
    config = yaml.safe_load(Path(kube_cluster.kubeconfig).read_text())
    config["users"] = [{"name": u["name"], "user": {"token": token}} for u in config["users"]]
    kubeconfig = tmp_path / "operator.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    lines = doctor(kube_cluster, namespace, release, kubeconfig)
    assert lines["chart"].startswith("ok   chart: ")
    assert lines["images"] == (
        f'WARN images: not checked: this identity may not list Nodes (nodes is forbidden: User "system:serviceaccount:'
        f'{namespace}:operator" cannot list resource "nodes" in API group "" at the cluster scope); a ClusterRole with '
        "list on nodes lets doctor say which session nodes lack the images")


def test_the_prepull_daemonset_runs_on_exactly_the_session_nodes(kube_cluster, install):
    """Placed by the session pods' nodeSelector and tolerations: a pod on each node they admit
    (tainted for the pool too), none on a node tainted otherwise or outside the pool; admitted
    by the restricted Pod Security Standard."""
    namespace, release, nodes = install
    core = client.CoreV1Api(kube_cluster.api_client())
    want = sorted([*nodes["pool"], *nodes["tainted"]])

    def placed() -> list[str]:
        pods = core.list_namespaced_pod(namespace, label_selector="app.kubernetes.io/component=prepull").items
        return sorted(p.spec.node_name for p in pods if p.spec.node_name)

    until(lambda: placed() == want, 60, f"pre-pull pods on {want}", interval=0.5)
    ds = client.AppsV1Api(kube_cluster.api_client()).read_namespaced_daemon_set(f"{release}-prepull", namespace)
    assert (ds.status.desired_number_scheduled, ds.status.number_misscheduled) == (4, 0)
    events = kube_cluster.kubectl("-n", namespace, "get", "events", "-o", "name", "--field-selector",
                                  "reason=FailedCreate").stdout
    assert events == ""  # no pod refused by the Pod Security admission


def test_doctor_says_which_runtime_session_pods_run_under(kube_cluster, install):
    """Issue 31, item 4: "doctor --cluster reports the session runtime". The install names a
    RuntimeClass (session.runtimeClassName, in its settings ConfigMap): one that does not exist
    fails (the API server would refuse every session pod); once it exists, its handler is said,
    and gVisor's, with what it asks of the harness image."""
    namespace, release, _ = install
    core = client.CoreV1Api(kube_cluster.api_client())
    name = f"gvisor-{secrets.token_hex(3)}"
    core.patch_namespaced_config_map(f"{release}-settings", namespace, {"data": {"RUNNER_KUBE__RUNTIME_CLASS": name}})
    try:
        assert doctor(kube_cluster, namespace, release)["runtime"] == (
            f"FAIL runtime: RuntimeClass {name} does not exist: the API server refuses every session pod naming it (create "
            "it, or set session.runtimeClassName to one that exists: kubectl get runtimeclass)")
        kube_cluster.apply({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name},
                            "handler": "runsc"})
        assert doctor(kube_cluster, namespace, release)["runtime"] == (
            f"ok   runtime: session pods run under RuntimeClass {name} (handler runsc): gVisor's sandbox; the harness image "
            "must be its gVisor variant (images.harness ghcr.io/probe-runner/harness:<version>-gvisor: gVisor loads only "
            "readable executables)")
    finally:
        core.patch_namespaced_config_map(f"{release}-settings", namespace, {"data": {"RUNNER_KUBE__RUNTIME_CLASS": None}})
        kube_cluster.kubectl("delete", "runtimeclass", name, "--ignore-not-found")
