"""The provider gateway of an install (issue 15's Kubernetes half), as the chart's Deployment
runs it: ``probe-runner gateway`` in its own process, watching session pods and keeping Leases
through the real API server of ``kube_cluster``, forwarding to the scripted provider on loopback.

A token is served while its attempt's pod runs, and only from that pod's address; a gateway
restarted with another pod name counts what the first one held, so a session's limit holds
across it; two gateways serving one session at once hold one meter between them, exactly
(issue 28); and a whole campaign of the real CLI runs through it (on SimNode), its sessions
holding a token and never the key, with the gateway killed and started again while it runs.
"""

from __future__ import annotations

import http.client
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from kubernetes import client

from runner import demo
from runner.demo.provider import ScriptedProvider
from runner.gateway import tokens
from runner.gateway.cluster import meters_of, settled, total
from runner.k8s import manifests, names
from runner.k8s.api import Kube
from runner.ledger import Ledger
from runner.plan import parse_plan
from runner.settings import KubeSettings, load_settings
from runner.store import open_store
from runner.stream import money
from tests.support.waiting import until

sys.path.insert(0, str(Path(__file__).parent))
from ports import free_port  # noqa: E402  (tests/ is on sys.path: tests/conftest.py)
from simnode import SimNode  # noqa: E402
from test_kubernetes_executor import _uid, claude_path, nodes, sim_root  # noqa: E402,F401  (its fixtures, shared)

MODEL = "claude-sonnet-4-5-20250929"
SIDE = "side call please"
KEY = "demo-key"
SIDE_SCENARIOS = {"scenarios": [
    {"name": "side", "match": SIDE, "model": MODEL, "usage": {"input_tokens": 100000, "output_tokens": 1000},
     "turns": [{"text": "side answer"}]}]}  # $0.315 a call at Sonnet's list price
SIDE_BODY = json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 10, "tools": [{"name": "t", "input_schema": {"type": "object"}}],
                        "messages": [{"role": "user", "content": SIDE}]}).encode()
# The same call asking for enough output that its bound covers what the scenario reports ($0.315),
# as a real answer's usage always is: $0.375 of output and its body's bytes at the input rate.
BOUNDED_BODY = SIDE_BODY.replace(b'"max_tokens": 10', b'"max_tokens": 25000')


def _bound(body: bytes) -> Decimal:
    """The most the gateway reserves for ``body`` (runner/gateway/policy.py, default settings)."""
    from runner.gateway import policy
    from runner.settings import DEFAULT_PRICES, GatewaySettings, price_of

    call = policy.check(GatewaySettings(), None, body, None, "", counting=False)
    price = price_of(DEFAULT_PRICES, call.model)
    assert price is not None
    return policy.bound(price, call, policy.context_of(GatewaySettings(), call.model))


@pytest.fixture
def namespace(kube_cluster) -> Iterator[str]:
    name = kube_cluster.create_namespace(f"gw-{_uid()}")
    kube_cluster.apply({"apiVersion": "v1", "kind": "ServiceAccount", "automountServiceAccountToken": False,
                        "metadata": {"name": names.session_service_account("probe-runner"), "namespace": name}})
    yield name
    client.CoreV1Api(kube_cluster.api_client()).delete_namespace(name, propagation_policy="Background")


class GatewayProcess:
    """``probe-runner gateway`` as the chart's Deployment runs it: its settings from the
    environment, its own pod name, the key and the token secret; on loopback here."""

    def __init__(self, kube_cluster, namespace: str, upstream: str, secret: bytes, pod_name: str, port: int,
                 **settings: str) -> None:
        self.port, self.url = port, f"http://127.0.0.1:{port}"
        self.log = Path(tempfile.mkstemp(prefix=f"{pod_name}-", suffix=".log")[1])
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
        env.update({"RUNNER_KUBE__KUBECONFIG": str(kube_cluster.kubeconfig), "RUNNER_KUBE__NAMESPACE": namespace,
                    "RUNNER_PROVIDER__BASE_URL": upstream, "RUNNER_PROVIDER__API_KEY": KEY,
                    "RUNNER_GATEWAY__TOKEN_SECRET": secret.decode(), "RUNNER_GATEWAY__PORT": str(port),
                    "RUNNER_GATEWAY__DRAIN_SECONDS": "1",
                    "RUNNER_GATEWAY__DEREGISTER_SECONDS": "0", "RUNNER_LOG__LEVEL": "info", "POD_NAME": pod_name,
                    # the clients here are on loopback, not at their KWOK pods' addresses (but in
                    # the test of the binding itself)
                    "RUNNER_GATEWAY__BIND_TO_POD_ADDRESS": "false",
                    **{f"RUNNER_GATEWAY__{k.upper()}": v for k, v in settings.items()}})
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "runner", "gateway"], env=env, stdout=out,
                                         stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, f"the gateway exited {self.proc.returncode}: {self.text()}"
            try:
                if _request(self.url, "GET", "/", None)[0] == 200:  # the chart's readiness probe
                    return
            except OSError:
                pass
            assert time.monotonic() < deadline, f"the gateway did not serve within 60 s: {self.text()}"
            time.sleep(0.2)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(30)


def _request(url: str, method: str, path: str, token: str | None, body: bytes = b"",
             source: str | None = None) -> tuple[int, bytes]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30, source_address=(source, 0) if source else None)
    try:
        headers = {"content-type": "application/json", "anthropic-version": "2023-06-01",
                   **({"x-api-key": token} if token else {})}
        conn.request(method, path, body=body or None, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _token(secret: bytes, campaign: str, limit: str | None = None, call: str = "0.5", session: str = "present-001") -> str:
    return tokens.mint(secret, tokens.Claims(campaign, "HW-PRB-0007", session, 1, int(time.time()) + 600, limit, call))


def _session_pod(kube: Kube, campaign: str, session: str = "present-001") -> str:
    settings = load_settings(store="file:///unused", kube={"namespace": kube.namespace})
    data = json.loads(demo.PLAN.read_text())
    data["campaign"] = campaign
    pod = manifests.session_pod(settings, parse_plan(data, "plan"), "HW-PRB-0007", session, 1, "task",
                                manifests.Route("http://127.0.0.1:1", token="t"))
    kube.create_pod(pod)
    return pod["metadata"]["name"]


def _wait(what: str, ok, timeout: float = 30):
    return until(ok, timeout, what, interval=0.2)


def test_a_token_is_served_while_its_attempts_pod_runs_and_refused_before_and_after(kube_cluster, nodes, namespace):  # noqa: F811
    """Issue 15: a token "valid only while that attempt runs and revoked when its outcome is
    journaled". On Kubernetes the attempt runs while its pod does (the controller deletes it
    once the outcome is journaled): before the pod exists and after it is deleted the token is
    refused, with the reason in the gateway's log; meanwhile its calls are forwarded with the
    key and metered into the attempt's Lease, owned by the pod."""
    secret = secrets.token_hex(24).encode()
    kube = Kube(KubeSettings(namespace=namespace, kubeconfig=kube_cluster.kubeconfig))
    campaign = f"gw-{_uid()}"
    token = _token(secret, campaign)
    with ScriptedProvider(SIDE_SCENARIOS, api_key=KEY) as provider:
        gw = GatewayProcess(kube_cluster, namespace, provider.base_url, secret, "gateway-a", free_port())
        try:
            status, body = _request(gw.url, "POST", "/v1/messages", token, SIDE_BODY)
            assert status == 401 and b"the attempt has no session pod (it ended)" in body, body
            pod = _session_pod(kube, campaign)
            answers = []  # refused until the gateway's watch has seen the pod

            def served() -> bool:
                answers.append(_request(gw.url, "POST", "/v1/messages", token, SIDE_BODY))
                return answers[-1][0] == 200
            _wait("a served call", served)
            status, body = answers[-1]
            assert all(a[0] == 401 for a in answers[:-1]), answers
            assert json.loads(body)["usage"]["input_tokens"] == 100000
            # the provider records a request once it has answered it
            _wait("the call in the provider's record", lambda: any(r["path"].startswith("/v1/messages") for r in provider.requests))
            assert {r["credential"] for r in provider.requests if r["path"].startswith("/v1/messages")} == {"key"}
            # Before the call was forwarded, the Lease held its bound and gateway.hold_usd ($1) more
            # (the session has no limit), with what was counted so far: the refusals before it.
            zero = dict.fromkeys(["input_tokens", "output_tokens", "cache_creation_input_tokens",
                                  "cache_read_input_tokens"], 0)
            assert meters_of(kube.lease_annotations(pod) or {}) == [
                {"calls": 0, "usage": zero, "cost_usd": "0", "unpriced_models": [], "refused": len(answers),
                 "held_usd": str(_bound(SIDE_BODY) + 1)}]
            owner = client.CoordinationV1Api(kube_cluster.api_client()).read_namespaced_lease(pod, namespace)
            assert [(o.kind, o.name) for o in owner.metadata.owner_references] == [("Pod", pod)]
        finally:
            gw.stop()  # SIGTERM: it gives back what it holds beyond the spend, with its counts
        assert meters_of(kube.lease_annotations(pod) or {}) == [
            {"calls": 1, "usage": {"input_tokens": 100000, "output_tokens": 1000, "cache_creation_input_tokens": 0,
                                   "cache_read_input_tokens": 0},
             "cost_usd": "0.315", "unpriced_models": [], "refused": len(answers), "held_usd": "0.315"}]
        gw = GatewayProcess(kube_cluster, namespace, provider.base_url, secret, "gateway-a", free_port())
        try:
            kube.delete_pod(pod, grace_seconds=0)
            # refused while the watch sees the pod being deleted, then as gone (the reason logged below)
            _wait("the refusal of an ended attempt", lambda: b"has no session pod" in _request(
                gw.url, "POST", "/v1/messages", token, SIDE_BODY)[1])
            # another campaign's token, a forged one and a path outside the allow-list, each with its reason
            assert _request(gw.url, "POST", "/v1/messages", _token(b"not-the-secret" * 3, campaign), SIDE_BODY)[0] == 401
            assert _request(gw.url, "GET", "/v1/files", token)[0] == 401  # the token first: the attempt has ended
        finally:
            gw.stop()
    log = gw.text()
    assert f"refused POST /v1/messages ({campaign}/HW-PRB-0007/present-001#1): token refused: the attempt has no session pod" in log
    assert "token refused: forged: the signature does not match" in log


def test_the_gateway_settles_an_ended_attempts_meter_as_its_watch_shows_the_end(kube_cluster, nodes, namespace):  # noqa: F811
    """The controller journals an outcome once every gateway has given back what it held of the
    attempt beyond its spend (its Lease settled). The gateway gave it back on a round every
    second, so an outcome waited up to a second for it (bench/realnode.py's
    artifacts_collected: 0.52 s p50 through the gateway, 0.04 s through the proxy); the watch's
    news of the harness's end now wakes it. Four attempts, each ended at a random moment of
    the round: each meter settled within 0.6 s of the end's report (a round of a second let
    all four through about once in forty)."""
    import random

    secret = secrets.token_hex(24).encode()
    kube = Kube(KubeSettings(namespace=namespace, kubeconfig=kube_cluster.kubeconfig))
    core = client.CoreV1Api(kube_cluster.api_client())
    campaign = f"gw-{_uid()}"
    took = []
    with ScriptedProvider(SIDE_SCENARIOS, api_key=KEY) as provider:
        gw = GatewayProcess(kube_cluster, namespace, provider.base_url, secret, "gateway-a", free_port())
        try:
            for i in range(4):
                session = f"present-{i + 1:03d}"
                pod = _session_pod(kube, campaign, session)
                token = _token(secret, campaign, session=session)
                _wait("a served call", lambda t=token: _request(gw.url, "POST", "/v1/messages", t, SIDE_BODY)[0] == 200)
                _wait("the hold in the Lease", lambda p=pod: not settled(meters_of(kube.lease_annotations(p) or {})))
                time.sleep(random.uniform(0, 1))
                spec = core.read_namespaced_pod(pod, namespace).spec
                ended = time.monotonic()
                core.patch_namespaced_pod_status(pod, namespace, {"status": {"containerStatuses": [
                    {"name": c.name, "image": c.image, "imageID": "", "ready": c.name != "harness", "restartCount": 0,
                     "started": c.name != "harness",
                     "state": {"terminated": {"exitCode": 0, "reason": "Completed"}} if c.name == "harness"
                     else {"running": {}}} for c in spec.containers]}})
                until(lambda p=pod: settled(meters_of(kube.lease_annotations(p) or {})), 10, "the meter settled", interval=0.01)
                took.append(round(time.monotonic() - ended, 3))
        finally:
            gw.stop()
    assert max(took) < 0.6, took


def test_a_stopped_gateway_serves_on_while_the_service_forgets_its_pod(kube_cluster, nodes, namespace):  # noqa: F811
    """Issue 29, item 10: a `helm test` right after a rollout failed once while the old gateway
    pod was terminating. The pod's deletion and its SIGTERM arrive together, but the Service's
    endpoints and each node's proxy forget the pod a moment later; a gateway that closed its
    listener at the signal refused the connections still sent to it. Stopped, it answers new
    connections for gateway.deregister_seconds, then stops within its drain."""
    with ScriptedProvider(SIDE_SCENARIOS, api_key=KEY) as provider:
        gw = GatewayProcess(kube_cluster, namespace, provider.base_url, secrets.token_hex(24).encode(), "gateway-a",
                            free_port(), deregister_seconds="3")
        try:
            gw.proc.send_signal(signal.SIGTERM)
            stopped = time.monotonic()
            answers = []
            while time.monotonic() - stopped < 2:  # each on a new connection, as the Service sends them
                try:
                    answers.append(_request(gw.url, "HEAD", "/", None)[0])
                except OSError as e:
                    answers.append(type(e).__name__)
                time.sleep(0.1)
            assert set(answers) == {200}, answers
            # but it vouches for no key: a rollout after the key's fix is replacing it
            status, body = _request(gw.url, "GET", tokens.KEY_PATH, None)
            assert status == 503 and tokens.STOPPING.encode() in body, body
            gw.proc.wait(3 + 1 + 10)  # deregister, drain (1 s here), and a margin
        finally:
            gw.stop(signal.SIGKILL)
    assert "stopping: serving 3 s more while the Service forgets this pod, then open calls get 1 s" in gw.text()


@pytest.fixture
def on_loopback() -> Iterator[list[str]]:
    """Addresses put on the loopback device for a test (root), and taken off after it."""
    added: list[str] = []
    yield added
    for ip in added:
        subprocess.run(["ip", "addr", "del", f"{ip}/32", "dev", "lo"], check=False)


def test_a_token_is_served_only_from_its_own_pods_address(kube_cluster, nodes, namespace, on_loopback):  # noqa: F811
    """Issue 28, item 4: tokens "usable only from their own pod's address (the gateway knows it
    from its watch)". Two session pods of one campaign, their KWOK addresses put on this host's
    loopback so a client can send from each: the first pod's token is served from its own
    address, and refused from the other pod's (a token one session read off another's
    environment) and from the host's (a node, a pod outside the campaign), each with the reason
    in the gateway's log. Before, a token was served from any address."""
    secret = secrets.token_hex(24).encode()
    kube = Kube(KubeSettings(namespace=namespace, kubeconfig=kube_cluster.kubeconfig))
    campaign = f"gw-{_uid()}"
    token = _token(secret, campaign)
    with ScriptedProvider(SIDE_SCENARIOS, api_key=KEY) as provider:
        pods = [_session_pod(kube, campaign), _session_pod(kube, campaign, "present-002")]
        core = client.CoreV1Api(kube_cluster.api_client())
        ips = [_wait(f"{p}'s address", lambda p=p: core.read_namespaced_pod(p, namespace).status.pod_ip) for p in pods]
        for ip in ips:
            subprocess.run(["ip", "addr", "add", f"{ip}/32", "dev", "lo"], check=True)
            on_loopback.append(ip)
        gw = GatewayProcess(kube_cluster, namespace, provider.base_url, secret, "gateway-a", free_port(),
                            bind_to_pod_address="true")
        try:
            _wait("the pod's call served from its address",
                  lambda: _request(gw.url, "POST", "/v1/messages", token, SIDE_BODY, source=ips[0])[0] == 200)
            for source in (ips[1], "127.0.0.1"):
                status, body = _request(gw.url, "POST", "/v1/messages", token, SIDE_BODY, source=source)
                assert status == 401 and f"used from {source}, not its session pod's address ({ips[0]})".encode() in body, body
            assert _request(gw.url, "POST", "/v1/messages/count_tokens", token, SIDE_BODY, source=ips[1])[0] == 401
        finally:
            gw.stop()
    assert sum(r["path"] == "/v1/messages" for r in provider.requests) == 1
    assert f"token refused: used from {ips[1]}, not its session pod's address ({ips[0]})" in gw.text()


def test_a_restarted_gateway_carries_the_meter_so_the_sessions_limit_holds(kube_cluster, nodes, namespace):  # noqa: F811
    """Issue 15: "a gateway restart does not fail running sessions", and the limit at the
    gateway "so side calls count" must survive it. Gateway A forwards one call of a session
    limited to $0.5 (it costs $0.315; its bound, $0.376, is what A holds, gateway.hold_usd 0)
    and is killed (SIGKILL: nothing is given back at exit); gateway B, a new pod, counts A's
    hold as spent, admits one more call (0.376 < 0.5) and refuses the next, even after a
    refused request of the attempt came first; the controller's sum of the Lease is A at its
    hold (its answer was never settled in the Lease) and B at what it metered."""
    secret = secrets.token_hex(24).encode()
    kube = Kube(KubeSettings(namespace=namespace, kubeconfig=kube_cluster.kubeconfig))
    campaign = f"gw-{_uid()}"
    token = _token(secret, campaign, limit="0.5", call="0.5")
    bound = _bound(BOUNDED_BODY)
    with ScriptedProvider(SIDE_SCENARIOS, api_key=KEY) as provider:
        pod = _session_pod(kube, campaign)
        a = GatewayProcess(kube_cluster, namespace, provider.base_url, secret, "gateway-a", free_port(), hold_usd="0")
        try:
            _wait("a served call", lambda: _request(a.url, "POST", "/v1/messages", token, BOUNDED_BODY)[0] == 200)
        finally:
            a.stop(signal.SIGKILL)
        b = GatewayProcess(kube_cluster, namespace, provider.base_url, secret, "gateway-b", free_port(), hold_usd="0")
        try:
            # A refused request first (a path outside the allow-list): before, it left B a meter
            # of the attempt that had never read A's, and B then admitted two more calls.
            assert _request(b.url, "GET", "/v1/files", token)[0] == 404
            assert _request(b.url, "POST", "/v1/messages", token, BOUNDED_BODY)[0] == 200
            status, body = _request(b.url, "POST", "/v1/messages", token, BOUNDED_BODY)
            assert status == 403 and tokens.LIMIT_SPENT.encode() in body, body
            assert f"$0.315 metered here, ${bound} held by other gateways".encode() in body, body
        finally:
            b.stop()  # SIGTERM: it gives back what it holds beyond its spend
        both = meters_of(kube.lease_annotations(pod) or {})
    assert total(both) == {"calls": 1, "usage": {"input_tokens": 100000, "output_tokens": 1000,
                                                 "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0},
                           "cost_usd": str(bound + Decimal("0.315")), "unpriced_models": [], "refused": 2,
                           "held_usd": str(bound)}


def test_a_session_calling_every_replica_directly_spends_at_most_its_limit_and_one_call(kube_cluster, nodes, namespace):  # noqa: F811
    """Issue 28, item 3: "one meter per attempt across replicas, exact, with N gateway replicas
    and a session calling each pod directly". Two gateways serve at once, as the chart's two
    replicas do; a hostile session limited to $1 (a call's most: $0.5) sends 16 calls at once
    spread over both, then alternates between them until both refuse. Before, each replica
    read the other's meter once, at the attempt's first call, and each admitted calls until its
    own meter reached $1: eight calls ($2.52). Now a call is forwarded only within what its
    gateway holds in the Lease, written at the Lease's resourceVersion against what the other
    holds: together at most $1.5, and the meter the controller reads is the calls served."""
    secret = secrets.token_hex(24).encode()
    kube = Kube(KubeSettings(namespace=namespace, kubeconfig=kube_cluster.kubeconfig))
    campaign = f"gw-{_uid()}"
    token = _token(secret, campaign, limit="1.0", call="0.5")
    with ScriptedProvider(SIDE_SCENARIOS, api_key=KEY) as provider:
        pod = _session_pod(kube, campaign)
        a = GatewayProcess(kube_cluster, namespace, provider.base_url, secret, "gateway-a", free_port())
        b = GatewayProcess(kube_cluster, namespace, provider.base_url, secret, "gateway-b", free_port())
        try:
            _wait("the pod in both gateways' watch", lambda: all(
                _request(g.url, "POST", "/v1/messages/count_tokens", token, SIDE_BODY)[0] == 200 for g in (a, b)))
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(16) as pool:
                burst = list(pool.map(lambda i: _request((a, b)[i % 2].url, "POST", "/v1/messages", token, BOUNDED_BODY),
                                      range(16)))
            after = [_request((a, b)[i % 2].url, "POST", "/v1/messages", token, BOUNDED_BODY) for i in range(8)]
        finally:
            a.stop()
            b.stop()
        meters = meters_of(kube.lease_annotations(pod) or {})
    served = sum(status == 200 for status, _ in burst + after)
    assert {status for status, _ in burst + after} <= {200, 403}, burst + after
    assert all(tokens.LIMIT_SPENT.encode() in body for status, body in burst + after if status == 403)
    assert [status for status, _ in after[-2:]] == [403, 403]  # both replicas refuse in the end
    assert 3 <= served and served * Decimal("0.315") <= Decimal("1.5"), served
    assert total(meters)["calls"] == served and Decimal(total(meters)["cost_usd"]) == served * Decimal("0.315")
    assert len(meters) == 2 and all(Decimal(m["held_usd"]) == Decimal(m["cost_usd"]) for m in meters), meters
    assert {r["credential"] for r in provider.requests if r["path"] == "/v1/messages"} == {"key"}
    assert sum(r["path"] == "/v1/messages" for r in provider.requests) == served  # nothing forwarded unmetered


def test_a_campaign_of_the_real_cli_runs_through_the_gateway_across_its_restart(  # noqa: F811
        kube_cluster, nodes, namespace, sim_root, tmp_path, claude_path):  # noqa: F811
    """The demo campaign (8 sessions, the real CLI on SimNode) through `probe-runner gateway`:
    every session pod holds a token of its own attempt and no credential (no Secret is named
    in it), every request reaches the provider with the key, each capture record keeps the
    gateway's meter, equal to the stream's cost; and the gateway is killed and started again
    (as a new pod) after the first session's calls, which the CLI's own retries ride out."""
    secret = secrets.token_hex(24).encode()
    port = free_port()
    store = (tmp_path / "store").as_uri()
    data = json.loads(demo.PLAN.read_text())
    data["campaign"] = f"gw-{_uid()}"
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(data))
    kube = Kube(KubeSettings(namespace=namespace, kubeconfig=kube_cluster.kubeconfig))
    with ScriptedProvider(json.loads(demo.SCENARIOS.read_text()), api_key=KEY) as provider, \
            SimNode(kube_cluster.api_client(), namespace, sim_root, [claude_path]) as sim:
        gw = GatewayProcess(kube_cluster, namespace, provider.base_url, secret, "gateway-a", port)
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
        env.update({"RUNNER_STORE": store, "RUNNER_KUBE__NAMESPACE": namespace,
                    "RUNNER_KUBE__KUBECONFIG": str(kube_cluster.kubeconfig), "RUNNER_KUBE__START_TIMEOUT_SECONDS": "30",
                    "RUNNER_KUBE__CANARY_ENABLED": "false",  # KWOK runs no container: tests/node measures it
                    "RUNNER_KUBE__GATEWAY_URL": gw.url, "RUNNER_GATEWAY__TOKEN_SECRET": secret.decode(),
                    "RUNNER_PROVIDER__BASE_URL": provider.base_url, "RUNNER_LOCAL__WORKDIR": str(tmp_path / "work")})
        run = subprocess.Popen([sys.executable, "-m", "runner", "run", str(plan_file), "--corpus", str(demo.CORPUS),
                                "--executor", "kubernetes", "--concurrency", "4"],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            _wait("a metered call", lambda: any(meters_of(lease["metadata"].get("annotations") or {})
                                                for lease in kube.list_leases(names.selector_string(
                                                    names.selector("probe-runner", names.GATEWAY_COMPONENT)))), 120)
            gw.stop(signal.SIGKILL)
            gw = GatewayProcess(kube_cluster, namespace, provider.base_url, secret, "gateway-b", port)
            out, err = run.communicate(timeout=300)
        finally:
            run.kill()
            gw.stop()
        assert run.returncode == 0, err + out + "\n".join(sim.errors) + sim.logs() + gw.text()
        harness_env = [e for spec in sim.specs.values() for e in spec["containers"][1]["env"]]
        assert {e["value"] for e in harness_env if e["name"] == "ANTHROPIC_BASE_URL"} == {gw.url}
        assert all(e["value"].startswith("prt1.") for e in harness_env if e["name"] == "ANTHROPIC_API_KEY")
        assert not [e for e in harness_env if "valueFrom" in e] and KEY not in json.dumps(list(sim.specs.values()))
        assert {r["credential"] for r in provider.requests if r["path"].startswith("/v1/")} == {"key"}
    assert "refused:" not in out, out
    st = open_store(store)
    ledger = Ledger(st, data["campaign"])
    assert not ledger.verify()
    assert {s.status for s in ledger.sessions().values()} == {"succeeded"}
    for key, state in ledger.sessions().items():
        capture = json.loads(st.get(f"campaigns/{data['campaign']}/sessions/{key}/capture.json"))
        meter = capture["gateway"]
        stream = money(Decimal(str(json.loads(st.get(capture["stream"]["key"]).splitlines()[-1])["total_cost_usd"])))  # as the books read it
        metered = Decimal(meter["cost_usd"])
        assert meter["calls"] >= 1 and Decimal(state.detail["cost_usd"]) == max(stream, metered), meter  # the books
        # What the killed gateway held and never gave back counts in full: the most it could have cost.
        held = Decimal(meter.get("held_usd", 0))
        assert stream - Decimal("1e-6") <= metered <= stream + held + Decimal("1e-6"), (meter, stream)
        if not held:
            assert abs(metered - stream) < Decimal("1e-6"), (meter, stream)
    assert "gateway" in st.get(f"campaigns/{data['campaign']}/transcripts/campaign-present.md").decode()
