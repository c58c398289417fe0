"""The chart's images (issue 31, item 5), with the real ``helm``: images by digest in every pod
the install and its controller make, the schema's refusal of a malformed digest, and the
optional pre-pull DaemonSet, placed as session pods are, hardened, with no network."""

from __future__ import annotations

import json

import pytest
import yaml

from runner.k8s import jobs, manifests, names
from runner.plan import parse_plan
from tests.support.helm import CHART, KUBE_SCHEMA_VERSION, REPO, by_kind, helm, label_selector_matches, render, settings_of

H = "sha256:" + "a1" * 32
R = "sha256:" + "b2" * 32
P = "sha256:" + "c3" * 32
HARNESS = f"ghcr.io/probe-runner/harness@{H}"
RUNNER = f"ghcr.io/probe-runner/runner@{R}"
PROXY = f"ghcr.io/probe-runner/egress-proxy@{P}"
DIGESTS = (f"images.harnessDigest={H}", f"images.runnerDigest={R}", f"images.egressProxyDigest={P}")
PLAN = parse_plan(yaml.safe_load((REPO / "runner" / "demo" / "plan.json").read_text()), "plan")


def pod_images(objs: list[dict]) -> dict[tuple[str, str, str], str]:
    """(kind, name, container) -> image of every container of every pod the chart renders."""
    out = {}
    for o in objs:
        spec = o["spec"] if o["kind"] == "Pod" else o.get("spec", {}).get("template", {}).get("spec")
        for c in (spec or {}).get("initContainers", []) + (spec or {}).get("containers", []):
            out[(o["kind"], o["metadata"]["name"], c["name"])] = c["image"]
    return out


def built_images(objs: list[dict]) -> dict[tuple[str, str], str]:
    """(object, container) -> image of every pod the controller and submit build from the
    install's settings: a session pod, a canary, the controller and transform Jobs."""
    s = settings_of(objs, "team-a")
    route = manifests.Route("http://10.96.0.10:8080", token="t")
    built = {"session": manifests.session_pod(s, PLAN, PLAN.probes[0].id, "present-001", 1, "task", route),
             "canary": manifests.canary_pod(s, "c1", 1, "", route),
             "controller": jobs.controller_job(s, "c1"), "transform": jobs.transform_job(s, "c1")}
    return {(what, c["name"]): c["image"] for what, o in built.items()
            for c in (o["spec"] if o["kind"] == "Pod" else o["spec"]["template"]["spec"])["containers"]}


@pytest.mark.parametrize("gateway", [True, False])
def test_every_pod_refers_to_its_image_by_the_digest_given(gateway):
    objs = render(release="team-a", namespace="probes",
                  sets=(*DIGESTS, "images.prePull.enabled=true", f"gateway.enabled={str(gateway).lower()}"))
    route = ("Deployment", "team-a-gateway", "gateway") if gateway else ("Deployment", "team-a-egress-proxy", "squid")
    assert pod_images(objs) == {
        route: RUNNER if gateway else PROXY,
        ("DaemonSet", "team-a-prepull", "harness"): HARNESS,
        ("DaemonSet", "team-a-prepull", "runner"): RUNNER,
        ("Pod", "team-a-confinement-test", "canary"): HARNESS,  # helm test
    }
    assert built_images(objs) == {("session", "reader"): RUNNER, ("session", "harness"): HARNESS,
                                  ("canary", "canary"): HARNESS, ("controller", "controller"): RUNNER,
                                  ("transform", "transform"): RUNNER}
    # the admission policy admits the controller's session pods of exactly these images
    (policy,) = by_kind(objs, "ValidatingAdmissionPolicy").values()
    images = [v["expression"] for v in policy["spec"]["validations"] if "c.image in" in v["expression"]]
    assert images == [f"variables.containers.all(c, c.image in {json.dumps([HARNESS, RUNNER], separators=(',', ':'))})"]


def test_by_default_every_pod_refers_to_its_image_by_tag():
    objs = render(release="team-a", namespace="probes", sets=("gateway.enabled=false", "transformJob.campaign=c1"))
    assert pod_images(objs) == {
        ("Deployment", "team-a-egress-proxy", "squid"): "ghcr.io/probe-runner/egress-proxy:0.1.0",
        ("Job", names.object_name("transform", "c1"), "transform"): "ghcr.io/probe-runner/runner:0.1.0",
        ("Pod", "team-a-confinement-test", "canary"): "ghcr.io/probe-runner/harness:0.1.0",
    }
    assert not by_kind(objs, "DaemonSet")  # images.prePull is off by default
    tagged = render(release="team-a", namespace="probes", sets=("images.harness=registry:5000/team/harness:2.0.1",
                                                                f"images.harnessDigest={H}", "transformJob.campaign=c1"))
    # a registry's port is not a tag; a digest replaces the tag; a reference by digest is taken as is
    assert settings_of(tagged, "team-a").kube.harness_image == f"registry:5000/team/harness@{H}"
    as_is = render(release="team-a", namespace="probes", sets=(f"images.runner=registry:5000/runner@{R}",))
    assert pod_images(as_is)[("Deployment", "team-a-gateway", "gateway")] == f"registry:5000/runner@{R}"
    assert settings_of(as_is, "team-a").kube.reader_image == f"registry:5000/runner@{R}"


@pytest.mark.parametrize("sets, message", [
    ((f"images.harnessDigest={H[:-1]}",), "at '/images/harnessDigest'"),  # 63 hex
    ((f"images.runnerDigest={R.upper()}",), "at '/images/runnerDigest'"),
    (("images.egressProxyDigest=sha512:abc",), "at '/images/egressProxyDigest'"),
    (("images.harness=ghcr.io/probe-runner/harness@latest",), "at '/images/harness'"),
    ((f"images.runner=ghcr.io/probe-runner/runner@sha256:{'0' * 63}",), "at '/images/runner'"),
    (("images.prePull.enable=true",), "at '/images/prePull': additional properties 'enable' not allowed"),
])
def test_the_values_schema_refuses_a_malformed_digest(sets, message):
    args = ["template", "x", str(CHART)]
    for s in sets:
        args += ["--set", s]
    proc = helm(*args, check=False)
    assert proc.returncode != 0 and "values don't meet the specifications of the schema" in proc.stderr
    assert message in proc.stderr, proc.stderr


def test_two_digests_for_one_image_are_refused_at_render():
    proc = helm("template", "x", str(CHART), "--set", f"images.harness=ghcr.io/probe-runner/harness@{H}",
                "--set", f"images.harnessDigest={R}", check=False)
    assert proc.returncode != 0
    assert (f"images.harness names a digest already (ghcr.io/probe-runner/harness@{H}): leave images.harnessDigest "
            "empty, or give images.harness by tag") in proc.stderr


PLACEMENT = ("session.nodeSelector.pool=probes", "session.tolerations[0].key=probes",
             "session.tolerations[0].operator=Exists", "session.tolerations[0].effect=NoSchedule",
             "session.runtimeClassName=gvisor", "images.pullSecrets[0]=registry")
LABELS = {"app.kubernetes.io/name": "probe-runner", "app.kubernetes.io/instance": "team-a",
          "app.kubernetes.io/component": "prepull", "app.kubernetes.io/part-of": "probe-runner",
          "app.kubernetes.io/managed-by": "Helm", "app.kubernetes.io/version": "0.1.0", "helm.sh/chart": "probe-runner-0.1.0"}
SELECTOR = {k: LABELS[k] for k in ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/component")}


def _sleeper(name: str, image: str, uid: int) -> dict:
    return {"name": name, "image": image, "imagePullPolicy": "IfNotPresent", "command": ["sleep", "infinity"],
            "resources": {"requests": {"cpu": "1m", "memory": "4Mi"}, "limits": {"cpu": "10m", "memory": "16Mi"}},
            "securityContext": {"runAsUser": uid, "runAsGroup": uid, "runAsNonRoot": True, "readOnlyRootFilesystem": True,
                                "allowPrivilegeEscalation": False, "privileged": False, "capabilities": {"drop": ["ALL"]},
                                "seccompProfile": {"type": "RuntimeDefault"}}}


def test_the_prepull_daemonset_runs_both_images_on_the_nodes_session_pods_may_use():
    import kubernetes_validate

    objs = render(release="team-a", namespace="probes", sets=(*DIGESTS, *PLACEMENT, "images.prePull.enabled=true"))
    (daemonset,) = by_kind(objs, "DaemonSet").values()
    assert daemonset == {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "team-a-prepull", "namespace": "probes", "labels": LABELS},
        "spec": {
            "selector": {"matchLabels": SELECTOR},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
            "template": {
                "metadata": {"labels": LABELS},
                "spec": {
                    "serviceAccountName": "team-a-session",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "terminationGracePeriodSeconds": 1,
                    "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                    "imagePullSecrets": [{"name": "registry"}],
                    "nodeSelector": {"pool": "probes"},
                    "tolerations": [{"key": "probes", "operator": "Exists", "effect": "NoSchedule"}],
                    "runtimeClassName": "gvisor",
                    "containers": [_sleeper("harness", HARNESS, 10001), _sleeper("runner", RUNNER, 10002)],
                },
            },
        },
    }
    kubernetes_validate.validate(daemonset, KUBE_SCHEMA_VERSION, strict=True)
    # Placed, pulled and run as the controller's session pods are: the same nodes, images, uids.
    s = settings_of(objs, "team-a")
    session = manifests.session_pod(s, PLAN, PLAN.probes[0].id, "present-001", 1, "task",
                                    manifests.Route("http://10.96.0.10:8080", token="t"))["spec"]
    pod = daemonset["spec"]["template"]["spec"]
    for key in ("nodeSelector", "tolerations", "runtimeClassName", "imagePullSecrets"):
        assert pod[key] == session[key], key
    assert [(c["image"], c["securityContext"]["runAsUser"]) for c in pod["containers"]] == [
        (c["image"], c["securityContext"]["runAsUser"]) for c in reversed(session["containers"])]  # harness, reader
    assert {c["imagePullPolicy"] for c in pod["containers"]} == {c["imagePullPolicy"] for c in session["containers"]}
    # No network: a deny-all of its own, and no other policy of the install selects it.
    policy = names.object_name("team-a", "prepull", "policy")
    assert by_kind(objs, "NetworkPolicy")[policy] == {
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": policy, "namespace": "probes", "labels": LABELS},
        "spec": {"podSelector": {"matchLabels": SELECTOR}, "policyTypes": ["Ingress", "Egress"]}}
    assert [n for n, p in by_kind(objs, "NetworkPolicy").items()
            if label_selector_matches(p["spec"]["podSelector"], LABELS)] == [policy]


def test_the_prepull_command_is_one_both_images_hold():
    """`sleep infinity` is GNU coreutils' (an Essential package of every Debian system): both
    images' final stages are Debian bookworm images, and neither removes it."""
    from tests.unit.test_images import IMAGES, parse

    objs = render(sets=("images.prePull.enabled=true",))
    (daemonset,) = by_kind(objs, "DaemonSet").values()
    assert [c["command"] for c in daemonset["spec"]["template"]["spec"]["containers"]] == [["sleep", "infinity"]] * 2
    for image in ("harness", "runner"):
        stages = parse(IMAGES / image / "Dockerfile")
        by_alias = {s.alias: s for s in stages}
        chain = [stages[-1]]  # the final stage and the stages it is built on (the harness's: harness-base)
        while chain[-1].base in by_alias:
            chain.append(by_alias[chain[-1].base])
        assert "bookworm" in chain[-1].base, [s.base for s in chain]
        for stage in chain:
            assert not any("coreutils" in r or ("rm " in r and "/bin" in r) for r in stage.all("RUN")), image
