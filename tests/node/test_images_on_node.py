"""The images built from images/*/Dockerfile run as pods on the real node, under the
``restricted`` Pod Security Standard, with the securityContext the product gives them; the
runtime reports the digest each ran from, as the capture record keeps it. The harness image's
gVisor variant runs in gVisor's sandbox (the RuntimeClass ``gvisor``), which the default image
cannot: its execute-only loader is one gVisor will not load."""

from __future__ import annotations

import json
import os
import secrets

import pytest

from runner import harnesses
from runner.k8s import manifests, podstate
from tests.support.waiting import until

pytestmark = pytest.mark.timeout(600)


def _wait_done(node, ns: str, name: str, timeout: float = 180) -> dict:
    def pod() -> dict:
        return json.loads(node.kubectl("-n", ns, "get", "pod", name, "-o", "json").stdout)

    return until(lambda: (p := pod())["status"].get("phase") in ("Succeeded", "Failed") and p, timeout, f"{name} done",
                 interval=0.5, seen=lambda: json.dumps(pod()["status"])[:2000])


HARNESS_CHECK = ["sh", "-c", "claude --version && python3 -c 'import runner.entrypoints.pod; print(\"runner ok\")' && id -u "
                 "&& echo kernel $(uname -r)"]


@pytest.mark.parametrize("image,uid,command,expect,runtime", [
    ("ghcr.io/probe-runner/harness:0.1.0", 10001, HARNESS_CHECK,
     [f"{harnesses.HARNESS.version} (Claude Code)", "runner ok", "10001", f"kernel {os.uname().release}"], None),
    # gVisor's variant in gVisor's sandbox: its own kernel (the Sentry says it is Linux 4.4.0)
    ("ghcr.io/probe-runner/harness:0.1.0-gvisor", 10001, HARNESS_CHECK,
     [f"{harnesses.HARNESS.version} (Claude Code)", "runner ok", "10001", "kernel 4.4.0"], "gvisor"),
    ("ghcr.io/probe-runner/runner:0.1.0", 10002, ["probe-runner", "--version"], ["probe-runner 0.1.0"], None),
    ("ghcr.io/probe-runner/egress-proxy:0.1.0", 10003, ["sh", "-c", "squid -v | head -1; id -u"],
     ["Squid Cache: Version", "10003"], None),
])
def test_each_image_runs_as_a_restricted_pod_and_its_digest_is_reported(real_node, built_images, image, uid, command,
                                                                        expect, runtime):
    ns = real_node.restricted_namespace(f"img-{secrets.token_hex(3)}")
    name = "run"
    real_node.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns}, "spec": {
        **({"runtimeClassName": runtime} if runtime else {}),
        "restartPolicy": "Never", "automountServiceAccountToken": False, "enableServiceLinks": False,
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never", "command": command,
                        "securityContext": manifests.container_security(uid),
                        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]}],
        "volumes": [{"name": "tmp", "emptyDir": {}}]}})
    pod = _wait_done(real_node, ns, name)
    log = real_node.kubectl("-n", ns, "logs", name).stdout
    assert pod["status"]["phase"] == "Succeeded", log
    for line in expect:
        assert line in log
    # The runtime's imageID names the image's config digest, which images.sh recorded.
    built = built_images[image]["id"]
    assert podstate.image_id(pod, "main").endswith(built), (podstate.image_id(pod, "main"), built)
    real_node.kubectl("delete", "namespace", ns, "--wait=false")


def test_the_default_harness_image_does_not_start_in_gvisor(real_node):
    """Why the gVisor variant exists: gVisor's loader reads what it starts with the task's own
    rights (gvisor.dev/issue/160), and the default image's ELF loader is execute-only, so its
    container is never started; the kubelet's reason says so."""
    ns = real_node.restricted_namespace(f"img-{secrets.token_hex(3)}")
    real_node.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "run", "namespace": ns}, "spec": {
        "runtimeClassName": "gvisor", "restartPolicy": "Never", "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "main", "image": "ghcr.io/probe-runner/harness:0.1.0", "imagePullPolicy": "Never",
                        "command": ["sh", "-c", "true"], "securityContext": manifests.container_security(10001)}]}})

    def refused() -> str | None:
        pod = json.loads(real_node.kubectl("-n", ns, "get", "pod", "run", "-o", "json").stdout)
        (status,) = pod["status"].get("containerStatuses") or [{}]
        state = status.get("state", {})
        why = (state.get("terminated") or state.get("waiting") or {}).get("message", "")
        return why if "permission denied" in why else None

    why = until(refused, 120, "the container refused by gVisor's loader", interval=0.5)
    assert "failed to load /usr/bin/sh: permission denied" in why, why
    real_node.kubectl("delete", "namespace", ns, "--wait=false")
