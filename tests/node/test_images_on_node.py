"""The images built from images/*/Dockerfile run as pods on the real node, under the
``restricted`` Pod Security Standard, with the securityContext the product gives them; the
runtime reports the digest each ran from, as the capture record keeps it."""

from __future__ import annotations

import json
import secrets

import pytest

from runner.k8s import manifests, podstate
from tests.support.waiting import until

pytestmark = pytest.mark.timeout(600)


def _wait_done(node, ns: str, name: str, timeout: float = 180) -> dict:
    def pod() -> dict:
        return json.loads(node.kubectl("-n", ns, "get", "pod", name, "-o", "json").stdout)

    return until(lambda: (p := pod())["status"].get("phase") in ("Succeeded", "Failed") and p, timeout, f"{name} done",
                 interval=0.5, seen=lambda: json.dumps(pod()["status"])[:2000])


@pytest.mark.parametrize("image,uid,command,expect", [
    ("ghcr.io/probe-runner/harness:0.1.0", 10001,
     ["sh", "-c", "claude --version && python3 -c 'import runner.entrypoints.pod; print(\"runner ok\")' && id -u"],
     ["2.1.197 (Claude Code)", "runner ok", "10001"]),
    ("ghcr.io/probe-runner/runner:0.1.0", 10002, ["probe-runner", "--version"], ["probe-runner 0.1.0"]),
    ("ghcr.io/probe-runner/egress-proxy:0.1.0", 10003, ["sh", "-c", "squid -v | head -1; id -u"],
     ["Squid Cache: Version", "10003"]),
])
def test_each_image_runs_as_a_restricted_pod_and_its_digest_is_reported(real_node, built_images, image, uid, command,
                                                                        expect):
    ns = real_node.restricted_namespace(f"img-{secrets.token_hex(3)}")
    name = "run"
    real_node.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns}, "spec": {
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
