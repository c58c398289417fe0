"""tests/node/: one real Kubernetes node on this machine (realnode.py), real images built
from images/*/Dockerfile (images.sh), real packets through kube-router's NetworkPolicy
enforcement.

Three builds run while pytest collects, each cached by its pins outside the repository and
instant when warm: the control plane (tests/cluster/build.sh), the node's binaries
(build.sh: kubelet, kube-proxy, CoreDNS, kube-router) and the images (images.sh). A failed
build fails every test here with the tail of its log; nothing is skipped.

Session fixtures:
- ``real_node``: control plane + node + cluster DNS, the images imported into its containerd.
  Cluster DNS answers ``api.provider.test`` with the provider address and
  ``other.provider.test`` with another host address, and nothing outside the cluster.
- ``provider``: the scripted provider over TLS on the provider address, port 443, with a
  certificate for ``api.provider.test`` from a throwaway CA (``provider.ca_pem``); it plays
  the demo's scenarios, the channel attacks' and the hostile session's.
- ``bucket``: moto's S3 server on the host address the pods reach.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import ssl
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from teardown import sigterm_as_interrupt  # tests/teardown.py (tests/ is on the path: tests/conftest.py)

from tests.support.builds import CONTROL_PLANE, GVISOR, Build, build_while_collecting, cache_root
from tests.support.helm import helm
from tests.support.helm import helm_binary as pinned_helm_binary

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUILDS = {  # the control plane, shared with tests/cluster; the node's binaries; the images
    "cluster": CONTROL_PLANE,
    "node": Build("the node's binaries", HERE / "build.sh", cache_root() / "last-node-build.log"),
    "images": Build("the images", HERE / "images.sh", cache_root() / "last-images-build.log"),
    "gvisor": GVISOR,  # runsc and its containerd shim, shared with tests/integration's gVisor probe
}
PROVIDER_HOST = "api.provider.test"
OTHER_HOST = "other.provider.test"
# A session whose CLI stays busy for a while (tests/node/test_confinement.py changes the
# network under it): one Bash call that sleeps 45 s, then the answer. Not a standalone `sleep`:
# 2.1.337 refuses one itself ("Blocked: standalone sleep"), and the session would end at once.
LONG_TASK = "TASK-LONG: wait, then answer."
LONG_SCENARIO = {"name": "long", "match": "TASK-LONG", "turns": [
    {"tool_uses": [{"name": "Bash", "input": {"command": "sh -c 'sleep 45'"}}]}, {"text": "Waited.\nsealed"}]}
BUCKET_ENV = {"AWS_ACCESS_KEY_ID": "probe-runner-test", "AWS_SECRET_ACCESS_KEY": "probe-runner-test"}


def _load(name: str) -> Any:
    """A helper module of this folder (test files cannot import their siblings here)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


realnode = _load("realnode")
sys.path.insert(0, str(REPO / "tests" / "integration"))
import hostile  # noqa: E402  (tests/hostile.py)
import test_channel as channel  # noqa: E402

# ---- builds (during collection, outside any per-test timeout) -------------------------------

def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    build_while_collecting(config, items, HERE, BUILDS.values())


def built(name: str) -> Path:
    return BUILDS[name].built()


def image_archives() -> dict[str, dict[str, str]]:
    """images.json of images.sh: reference -> {"archive": path, "id": sha256:... (config digest), ...}."""
    out = built("images")
    listing = json.loads((out / "images.json").read_text())
    return {e["reference"]: {**e, "archive": str(out / e["archive"])} for e in listing["images"]}


# ---- the node and its neighbours --------------------------------------------------------
# Plain context managers (bench/realnode.py starts the same stack), and the fixtures over them.

@contextlib.contextmanager
def node_up(work: Path, mirror: Any = None) -> Iterator[Any]:
    """Control plane + node + cluster DNS, the built images imported; runc the default runtime,
    gVisor the RuntimeClass ``gvisor``; ``mirror``: realnode.start_node's (a registry of this
    machine the node pulls from, bench/realnode.py's cold start)."""
    cp_bin, node_bin = built("cluster"), built("node")
    archives = [Path(e["archive"]) for e in image_archives().values()]
    realnode.reap_orphans()
    with realnode.start_node(cp_bin, node_bin, work, archives, hosts={PROVIDER_HOST: "provider", OTHER_HOST: "other"},
                             gvisor=built("gvisor"), mirror=mirror) as node:
        yield node


@dataclass
class Provider:
    server: Any          # runner.demo.provider.ScriptedProvider
    ca_pem: str          # the throwaway CA that signed the provider's certificate
    ca_file: Path
    base_url: str        # https://api.provider.test


@contextlib.contextmanager
def serve_provider(node: Any, work: Path) -> Iterator[Provider]:
    from runner.demo.provider import ScriptedProvider

    pki = realnode.Pki(work)
    crt, key = pki.issue("provider", PROVIDER_HOST, server=True, dns=[PROVIDER_HOST, OTHER_HOST])
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(crt), str(key))
    # The demo's scenarios, the channel attacks' (tests/integration/test_channel.py), the hostile
    # session's (tests/hostile.py) and a long one.
    scenarios = json.loads((REPO / "runner" / "demo" / "scenarios.json").read_text())
    scenarios["scenarios"] += [*channel.SCENARIOS["scenarios"], *hostile.SCENARIOS, LONG_SCENARIO]
    with ScriptedProvider(scenarios, host=node.provider_ip, port=443, tls=ctx, api_key="demo-key",
                          server_name=PROVIDER_HOST) as server:
        yield Provider(server, pki.ca.read_text(), pki.ca, server.base_url)


@contextlib.contextmanager
def serve_bucket(node: Any) -> Iterator[tuple[str, Any]]:
    """moto's S3 server on the host address (the pods reach it through the node's NAT), with
    the bucket ``probes``: (endpoint, boto3 client)."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not a line per request
    port = realnode.free_port(node.host_ip)
    server = ThreadedMotoServer(ip_address=node.host_ip, port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://{node.host_ip}:{port}"
        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **{
            "aws_access_key_id": BUCKET_ENV["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": BUCKET_ENV["AWS_SECRET_ACCESS_KEY"]})
        s3.create_bucket(Bucket="probes")
        yield endpoint, s3
    finally:
        server.stop()


@dataclass
class Install:
    namespace: str
    release: str
    node: Any
    bucket: str      # the moto endpoint

    def settings_env(self, tmp: Path) -> dict[str, str]:
        """A user's workstation, set up as the chart's NOTES say (and the test's own targets)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
        return {**env, **BUCKET_ENV, "RUNNER_STORE": "s3://probes", "RUNNER_S3__ENDPOINT_URL": self.bucket,
                "RUNNER_S3__REGION": "us-east-1", "RUNNER_KUBE__NAMESPACE": self.namespace,
                "RUNNER_KUBE__INSTANCE": self.release, "RUNNER_KUBE__KUBECONFIG": str(self.node.kubeconfig),
                "RUNNER_LOCAL__WORKDIR": str(tmp / "user")}


def install_chart(node: Any, provider: Provider, bucket_endpoint: str, work: Path,
                  concurrency: int = 2, gateway: bool = True, runtime: str | None = None,
                  pull_policy: str = "Never", prepull: bool = True) -> Install:
    """The chart installed with the real helm into a namespace enforcing the restricted Pod
    Security Standard: provider https://api.provider.test with the throwaway CA as its
    caBundle, the bucket on moto, images as imported (pullPolicy Never), the canary's foreign
    host and extra targets pointed at this node's other addresses; one gateway pod, or without
    the gateway (``gateway`` false) one egress proxy pod. ``runtime`` "gvisor": session pods
    (and their canaries) in gVisor's sandbox, the harness image's gVisor variant.
    ``pull_policy``: the images' (Never: as imported; IfNotPresent pulls what the node lacks,
    from the node's registry mirror where it has one); ``prepull``: images.prePull.enabled."""
    import secrets

    uid = secrets.token_hex(3)
    ns, release = node.restricted_namespace(f"pr-{uid}"), f"pr-{uid}"
    node.apply([
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "provider", "namespace": ns},
         "stringData": {"api-key": "demo-key"}},
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "bucket", "namespace": ns}, "stringData": BUCKET_ENV},
    ])
    values = work / "values.json"
    values.write_text(json.dumps(node_values(node, provider, bucket_endpoint, concurrency, gateway, runtime, pull_policy,
                                             prepull)))
    try:
        helm("install", release, str(REPO / "helm" / "probe-runner"), "--namespace", ns, "-f", str(values),
                  "--kubeconfig", str(node.kubeconfig), "--wait", "--timeout", "100s")
    except AssertionError as e:  # say why a pod of the install is not ready: its state and its last log lines
        raise AssertionError(f"{e}\n{install_state(node, ns)}") from None
    return Install(ns, release, node, bucket_endpoint)


def install_state(node: Any, ns: str) -> str:
    """The pods of an install: their state, descriptions and last log lines."""
    seen = [node.kubectl("-n", ns, "get", "pods", "-o", "wide", check=False).stdout]
    for pod in node.kubectl("-n", ns, "get", "pods", "-o", "name", check=False).stdout.split():
        seen.append(node.kubectl("-n", ns, "describe", pod, check=False).stdout[-3000:])
        seen.append(node.kubectl("-n", ns, "logs", pod, "--all-containers", "--tail=30", check=False).stdout)
    return "\n".join(seen)


GVISOR_HARNESS = "ghcr.io/probe-runner/harness:0.1.0-gvisor"  # images.sh: images/harness/Dockerfile's harness-gvisor


def node_values(node: Any, provider: Provider, bucket_endpoint: str, concurrency: int = 2,
                gateway: bool = True, runtime: str | None = None, pull_policy: str = "Never",
                prepull: bool = True) -> dict[str, Any]:
    """The chart's values for this node: images as imported, the scripted provider, moto;
    ``runtime`` "gvisor": the RuntimeClass of the node's gVisor (realnode.GVISOR_RUNTIME_CLASS)
    and the harness image's variant for it."""
    assert runtime in (None, "gvisor"), runtime
    gvisor = runtime == "gvisor"
    return {
        # pre-pulled: the DaemonSet's pod on the node (it holds both images there, which are imported anyway)
        "images": {"pullPolicy": pull_policy, "prePull": {"enabled": prepull},
                   **({"harness": GVISOR_HARNESS} if gvisor else {})},
        "provider": {"baseUrl": provider.base_url, "caBundle": provider.ca_pem, "credentialsSecret": "provider"},
        "bucket": {"store": "s3://probes", "endpoint": bucket_endpoint, "region": "us-east-1",
                   "credentialsSecret": "bucket"},
        # The transform at the end of each campaign parses its streams in 2 processes of the
        # controller's pod (its CPU limit), however few the bytes.
        "controller": {"concurrency": concurrency, "transformParallelMinBytes": 0,
                       "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                                     "limits": {"cpu": "2", "memory": "1Gi", "ephemeral-storage": "1Gi"}}},
        "session": {"timeoutSeconds": 300, **({"runtimeClassName": realnode.GVISOR_RUNTIME_CLASS} if gvisor else {}),
                    "resources": {"requests": {"cpu": "100m", "memory": "256Mi"},
                                  "limits": {"cpu": "1", "memory": "2Gi", "ephemeral-storage": "1Gi"}},
                    "canary": {"enabled": True, "intervalSeconds": 300, "foreignHosts": [OTHER_HOST],
                               "extraTargets": [f"{node.host_ip}:6443", f"{node.provider_ip}:443",
                                                f"{node.other_ip}:80"]}},
        "gateway": {"enabled": gateway, "replicas": 1},
        "egressProxy": {"replicas": 1},
        # The scripted provider has a private address here, as an on-prem provider would: the
        # proxy's egress names its range (by default private ranges are out of reach).
        "networkPolicy": {"providerIPBlocks": [{"cidr": f"{node.provider_ip}/32"}]},
    }


@pytest.fixture(scope="session")
def node_values_for(real_node: Any, provider: Provider, bucket: tuple[str, Any]) -> Any:
    """``node_values`` of this session's node, for a test that installs the chart its own way."""
    return lambda **kw: node_values(real_node, provider, bucket[0], **kw)


@pytest.fixture(scope="session")
def helm_binary() -> str:
    return pinned_helm_binary()


@pytest.fixture(scope="session")
def bucket_env() -> dict[str, str]:
    """The bucket's credentials (moto takes any)."""
    return dict(BUCKET_ENV)


@pytest.fixture(scope="session")
def built_images() -> dict[str, dict[str, str]]:
    return image_archives()


@pytest.fixture(scope="session")
def real_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    # A SIGTERM (a CI timeout, `kill`) still stops the node (tests/teardown.py).
    with sigterm_as_interrupt(), node_up(tmp_path_factory.mktemp("node")) as node:
        yield node


@pytest.fixture(scope="session")
def provider(real_node: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Provider]:
    with serve_provider(real_node, tmp_path_factory.mktemp("provider-pki")) as p:
        yield p


@pytest.fixture(scope="session")
def long_task() -> str:
    """The task of a session whose CLI stays busy for 45 s (the provider plays LONG_SCENARIO)."""
    return LONG_TASK


@pytest.fixture(scope="session")
def bucket(real_node: Any) -> Iterator[tuple[str, Any]]:
    with serve_bucket(real_node) as b:
        yield b


@pytest.fixture(scope="session")
def install(real_node: Any, provider: Provider, bucket: tuple[str, Any], tmp_path_factory: pytest.TempPathFactory
            ) -> Install:
    return install_chart(real_node, provider, bucket[0], tmp_path_factory.mktemp("values"))


@pytest.fixture(scope="session")
def gvisor_install(real_node: Any, provider: Provider, bucket: tuple[str, Any], tmp_path_factory: pytest.TempPathFactory
                   ) -> Install:
    """An install whose session pods run in gVisor's sandbox (issue 31, item 4)."""
    return install_chart(real_node, provider, bucket[0], tmp_path_factory.mktemp("values"), runtime="gvisor")


@pytest.fixture(scope="session")
def proxy_install(real_node: Any, provider: Provider, bucket: tuple[str, Any], tmp_path_factory: pytest.TempPathFactory
                  ) -> Install:
    """An install without the gateway (the credentials.json exception): the egress proxy's path."""
    return install_chart(real_node, provider, bucket[0], tmp_path_factory.mktemp("values"), gateway=False)
