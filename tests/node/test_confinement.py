"""Real packets on the real node: a pod with the session pods' labels, under the chart's
NetworkPolicies as kube-router enforces them, reaches the provider gateway and nothing else
(and, on an install without the gateway, the provider through the egress proxy and nothing
else; the proxy pod reaches the provider port and nothing else); a foreign policy that selects
session pods is refused before a campaign and stops one that runs.

The canary (runner/k8s/canary.py, the product's own check) does the trying, so this also
tests the check itself against the real thing: each route must come out as it really is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from test_channel import channel_plan_data  # noqa: E402  (tests/integration, on the path by conftest.py)

from runner.errors import UserError
from runner.executors.kubernetes import KubernetesExecutor
from runner.k8s import manifests, names
from runner.k8s.api import Kube
from runner.k8s.confinement import ConfinementMonitor
from runner.settings import Settings
from tests.support.helm import helm

pytestmark = pytest.mark.timeout(900)

PROVIDER_HOST = "api.provider.test"
DROPPED = ("refused", "port unreachable", "timed out")
# The pods here have IPv4 addresses only: an IPv6 route has nowhere to go from them.
NO_V6 = ("network unreachable", "no address of that family", *DROPPED)
OTHER_HOST = "other.provider.test"


@contextmanager
def listener(netns: str | None, address: str, port: int):
    """A TCP listener that answers every connection with one line (so a route that opens is
    seen as connected, not merely refused), on the host or in the node's network namespace."""
    code = ("import socket,sys\n"
            "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            f"s.bind(({address!r},{port})); s.listen(16); print('ready', flush=True)\n"
            "while True:\n c,_=s.accept(); c.sendall(b'hello\\n'); c.close()\n")
    argv = ["python3", "-c", code]
    if netns:
        argv = ["nsenter", f"--net=/run/netns/{netns}", *argv]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def targets(real_node):
    """Something listening on each address a session must not reach: the metadata address in
    the node's namespace (as a node's metadata proxy would be), the provider's address on
    port 80, another host on port 80. The API server and kubelet listen already."""
    real_node.in_node("ip", "addr", "add", "169.254.169.254/32", "dev", "lo")
    try:
        with listener(real_node.netns, "169.254.169.254", 80), listener(None, real_node.other_ip, 80), \
                listener(None, real_node.provider_ip, 80):
            yield
    finally:
        real_node.in_node("ip", "addr", "del", "169.254.169.254/32", "dev", "lo", check=False)


@contextmanager
def _environ(env: dict[str, str]):
    """``env`` laid over the environment for the block (pytest's MonkeyPatch undoes it)."""
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        yield


def _install_env(install, tmp_path) -> dict[str, str]:
    """The workstation's environment plus the operator's settings, as the controller Job has them."""
    chart = install.node.kubectl("-n", install.namespace, "get", "configmap", f"{install.release}-settings",
                                 "-o", "json")
    return {**install.settings_env(tmp_path), **json.loads(chart.stdout)["data"]}


def _settings(install, tmp_path) -> Settings:
    with _environ(_install_env(install, tmp_path)):
        return Settings()


def _monitor(install, tmp_path, campaign: str) -> tuple[KubernetesExecutor, ConfinementMonitor]:
    settings = _settings(install, tmp_path)
    executor = KubernetesExecutor(settings, Kube(settings.kube))
    executor.preflight()
    assert executor.route is not None
    return executor, ConfinementMonitor(settings, executor.kube, campaign, executor.route, executor.foreign_policies,
                                        executor.token_secret)


# kube-router rejects with an ICMP port unreachable, which a client sees as a refusal; the kernel
# rate-limits those (about one a second per destination), so of routes tried at once some see the
# reply and some time out: both are a closed route
def _direct_routes(node) -> dict[str, tuple[str, ...]]:
    return {"cluster DNS": DROPPED, "the API server by its ClusterIP": DROPPED,
            "the API server on the node's address": DROPPED, "the kubelet on the node's address": DROPPED,
            "the metadata service": DROPPED, "another pod": DROPPED,
            "the metadata service over IPv6": NO_V6, "an outside address over IPv6": NO_V6,
            f"{node.host_ip}:6443 directly": DROPPED, f"{node.provider_ip}:443 directly": DROPPED,
            f"{node.other_ip}:80 directly": DROPPED}


def _report(check) -> str:
    return "\n".join(f"{r.name:55} {r.target:28} {'OPEN' if r.opened else 'closed'}  {r.detail}" for r in check.results)


def _assert_closed(check, expected_closed: dict) -> None:
    by_name, report = {r.name: r for r in check.results}, _report(check)
    for name, why in expected_closed.items():
        assert name in by_name, f"route {name!r} not tried:\n{report}"
        r = by_name[name]
        assert not r.opened, f"{name} is open:\n{report}"
        assert any(w in r.detail for w in ((why,) if isinstance(why, str) else why)), f"{name}: {r.detail}\n{report}"


def test_a_session_pod_reaches_the_provider_gateway_and_nothing_else(install, targets, provider, tmp_path):
    """Issue 15: "session pods reach only it, in place of the CONNECT proxy". The canary, with
    the session pods' labels, finds every direct route closed (the provider's address too) and
    the gateway answering; with its check's own token (issue 28) it asks the gateway for the
    provider-side routes, a server tool and an MCP server, and finds them refused by the
    gateway's policy. (That the gateway reaches the provider, over TLS under its name, is the
    campaign's test: every session's calls go that way.)"""
    node = install.node
    _, monitor = _monitor(install, tmp_path, "packets")
    check = monitor.check()
    print(_report(check))
    _assert_closed(check, {**_direct_routes(node),
                           "a server tool through the gateway (web_fetch)": "refused by the gateway: the tool type",
                           "an MCP server through the gateway (the metadata service's URL)": "refused by the gateway: "
                                                                                             "the request holds 'mcp_servers'"})
    assert [r.name for r in check.results if r.must_open] == ["the provider gateway",
                                                              "the provider gateway's key check (a token count)"]
    good, key = (r for r in check.results if r.must_open)
    assert good.opened and "answered HTTP/1.1 200" in good.detail, _report(check)
    assert key.opened and key.detail.startswith("accepted (a token count, nothing spent)"), _report(check)
    assert not [r for r in check.results if "proxy" in r.name], _report(check)  # no proxy is installed
    assert check.passed, check.problem
    assert check.settled_seconds is not None and check.settled_seconds < 30


def test_a_session_pod_reaches_the_provider_through_the_proxy_and_nothing_else(proxy_install, targets, provider, tmp_path):
    """Without the gateway (gateway.enabled false: a credentials.json login, the exception), the
    session's one route is the egress proxy, which allows the provider host alone."""
    install = proxy_install
    node = install.node
    _, monitor = _monitor(install, tmp_path, "packets")
    check = monitor.check()
    by_name, report = {r.name: r for r in check.results}, _report(check)
    print(report)
    # Every route the design names, each as a user would meet it.
    expected_closed = {
        **_direct_routes(node),
        # Squid refuses a name it does not allow by answering TLS with its own certificate
        f"{OTHER_HOST} through the egress proxy": "CERTIFICATE_VERIFY_FAILED",
        # and cuts a tunnel whose TLS server name is not the provider's
        "the provider under another TLS server name": "TLS to other.provider.test failed",
        "plain HTTP through the egress proxy": "the proxy refused: HTTP/1.1 403",
    }
    _assert_closed(check, expected_closed)
    good = by_name["the provider through the egress proxy"]
    assert good.opened and f"TLS to {PROVIDER_HOST} verified, answered HTTP/1.1 200" in good.detail, report
    assert check.passed, check.problem
    assert check.settled_seconds is not None and check.settled_seconds < 30
    # The provider saw the canary's request, over TLS, through the proxy.
    assert any(r["method"] == "HEAD" and r["headers"].get("host") == PROVIDER_HOST for r in provider.server.requests)


def test_the_proxy_pod_reaches_the_provider_port_and_nothing_else(proxy_install, targets):
    install = proxy_install
    node = install.node
    pods = json.loads(node.kubectl("-n", install.namespace, "get", "pods", "-l",
                                   "app.kubernetes.io/component=egress-proxy", "-o", "json").stdout)["items"]
    proxy = pods[0]["metadata"]["name"]

    def connect(target: str) -> subprocess.CompletedProcess[str]:
        return node.kubectl("-n", install.namespace, "exec", proxy, "--", "sh", "-c",
                            f"timeout 6 openssl s_client -connect {target} -servername {PROVIDER_HOST} </dev/null",
                            check=False, timeout=30)

    ok = connect(f"{PROVIDER_HOST}:443")
    assert ok.returncode == 0 and "Verify return code" in ok.stdout, ok.stdout + ok.stderr
    for target in (f"{node.other_ip}:80", f"{node.provider_ip}:80", f"{node.host_ip}:6443", "169.254.169.254:80"):
        res = connect(target)
        assert res.returncode != 0, f"the proxy pod reached {target}:\n{res.stdout}"
        assert "hello" not in res.stdout


def test_a_foreign_policy_selecting_session_pods_is_refused_and_measured(install, targets, tmp_path):
    node = install.node
    foreign = allow_all_egress("allow-all-egress", install.namespace)
    node.apply(foreign)
    try:
        settings = _settings(install, tmp_path)
        executor = KubernetesExecutor(settings, Kube(settings.kube))
        with pytest.raises(UserError, match="NetworkPolicy allow-all-egress also selects session pods"):
            executor.preflight()
        # What the policy really opens, measured: kube-router applies it within seconds.
        monitor = ConfinementMonitor(settings, executor.kube, "foreign", manifests.Route("http://%s:%s" % _gateway(node, install)),
                                     executor.foreign_policies)
        deadline = time.monotonic() + 60
        while True:
            check = monitor.check()
            opened = [r.name for r in check.results if r.opened and not r.must_open]
            if opened or time.monotonic() > deadline:
                break
        assert "the metadata service" in opened and f"{node.other_ip}:80 directly" in opened, opened
        assert not check.passed and "a route opened" in check.problem
    finally:
        node.kubectl("-n", install.namespace, "delete", "networkpolicy", "allow-all-egress")


def allow_all_egress(name: str, namespace: str) -> dict:
    """A foreign NetworkPolicy that lets session pods' egress go anywhere: allow rules add up."""
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"name": name, "namespace": namespace},
            "spec": {"podSelector": {"matchLabels": {names.COMPONENT: names.SESSION_COMPONENT}},
                     "policyTypes": ["Egress"], "egress": [{}]}}


def _gateway(node, install) -> tuple[str, int]:
    svc = json.loads(node.kubectl("-n", install.namespace, "get", "service", f"{install.release}-gateway",
                                  "-o", "json").stdout)
    return svc["spec"]["clusterIP"], svc["spec"]["ports"][0]["port"]


def _campaign_with_egress_opened(install, tmp_path, plan: dict, corpus: Path, when, policy: str
                                 ) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    """Run ``plan`` from a workstation as the controller Job would (the chart's settings, a check
    every 5 s, one session at a time); once ``when()`` holds, add a foreign NetworkPolicy that
    opens all egress of session pods. Returns the finished run and its environment."""
    node = install.node
    env = {**_install_env(install, tmp_path), "RUNNER_KUBE__CANARY_INTERVAL_SECONDS": "5", "RUNNER_CONCURRENCY": "1"}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    argv = [sys.executable, "-m", "runner", "run", str(tmp_path / "plan.json"), "--corpus", str(corpus),
            "--executor", "kubernetes"]
    run = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    foreign = allow_all_egress(policy, install.namespace)
    try:
        deadline = time.monotonic() + 240
        while not when():
            assert run.poll() is None, run.communicate()
            assert time.monotonic() < deadline, "the moment to open egress never came"
            time.sleep(0.2)
        node.apply(foreign)
        out, err = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
        node.kubectl("-n", install.namespace, "delete", "networkpolicy", policy, check=False)
    return subprocess.CompletedProcess(argv, run.returncode, out, err), env


def test_a_foreign_policy_during_a_campaign_stops_it_and_refuses_the_sessions_it_overlapped(install, provider, tmp_path):
    """The campaign runs from a workstation as the controller Job would (the chart's settings,
    checks every 5 s, one session at a time). Once the first session pod exists, a foreign
    policy opens all egress of session pods: the next check measures it, no further session
    starts, the run exits 12 naming what opened, and each session whose pod existed is refused
    (its entry point finds the API server reachable before the CLI starts; had the CLI started,
    the transform would refuse it for the failed check that overlapped it)."""
    from runner import demo, layout
    from runner.corpus import load_stored_plan
    from runner.ledger import Ledger
    from runner.status import campaign_status
    from runner.store import open_store

    node = install.node
    campaign = f"foreign-{os.urandom(3).hex()}"
    plan = json.loads(demo.PLAN.read_text())
    plan.update(campaign=campaign, repetitions=1)  # 4 sessions, one at a time

    def a_session_pod_exists() -> bool:
        return bool(json.loads(node.kubectl("-n", install.namespace, "get", "pods", "-l",
                                            f"{names.COMPONENT}={names.SESSION_COMPONENT},{names.PROBE}!=canary",
                                            "-o", "json").stdout)["items"])

    run, env = _campaign_with_egress_opened(install, tmp_path, plan, demo.CORPUS, a_session_pod_exists,
                                            "allow-all-egress-later")
    out, err = run.stdout, run.stderr
    assert run.returncode == 12, out + err
    assert "halted: confinement check" in err and "no further session was started" in err, err
    assert "a route opened" in err or "allow-all-egress-later" in err, err
    with _environ(env):
        store = open_store("s3://probes", Settings())
        states = Ledger(store, campaign).sessions()
        refusals = json.loads(store.get(layout.refusals_key(campaign)))["refusals"]
        # What a user's status --watch ends on, rather than waiting for sessions nothing starts.
        stopped = campaign_status(store, load_stored_plan(store, campaign), {}).stopped
    assert stopped is not None and stopped.exit == 12 and stopped.why.startswith("halted: confinement check"), stopped
    assert len([s for s in states.values() if s.status not in ("intended", "pending")]) < 4, states
    # The session whose pod existed when the policy came is refused either way: by its own entry
    # point if its CLI had not started (the API server was reachable), else by the transform.
    reasons = [(r.get("session"), r.get("status"), r["reason"]) for r in refusals]
    refused = [r for r in reasons if "network policy was not in force" in r[2] or "failed while this session ran" in r[2]]
    # (A check waits up to 30 s for the policy to be in force before it measures; a session that
    # starts meanwhile is refused by its own entry point the same way.)
    assert refused and all(r[1] == "refused" for r in refused), reasons
    assert not [r for r in reasons if r[1] == "succeeded"], reasons


def _long_session(tmp_path: Path, long_task: str, probe_id: str) -> tuple[Path, dict]:
    """A corpus of one probe whose session's CLI stays busy for 45 s: (the corpus, the probe)."""
    corpus = tmp_path / "corpus"
    (corpus / "docs/probes").mkdir(parents=True)
    (corpus / "docs/a.md").write_text("# A\n")
    probe = {"id": probe_id, "path": "docs/probes/long.md", "title": "Long session", "task": long_task,
             "answers": ["sealed"], "examines": ["docs/a.md"]}
    (corpus / probe["path"]).write_text(f"# {probe['title']}\n\n## Task\n\n{long_task}\n")
    return corpus, probe


def test_a_session_whose_cli_ran_while_a_check_failed_is_refused_by_the_transform(install, provider, long_task,
                                                                                 tmp_path):
    """The case the entry point cannot catch: the CLI has started (its first request reached the
    provider) when a foreign policy opens all egress of session pods. The next check measures
    it, the run stops starting sessions and exits 12, the session runs to its end (its CLI is
    never killed mid-stream) and its capture carries the failed check, so the transform refuses
    it; no transcript states it. DESIGN: a session is recorded only if confinement held for
    the whole of it."""
    from runner import layout
    from runner.demo.provider import first_user_text
    from runner.ledger import Ledger
    from runner.store import open_store

    campaign = f"overlap-{os.urandom(3).hex()}"
    corpus, probe = _long_session(tmp_path, long_task, "HW-PRB-0102")
    asked = len(provider.server.requests)

    def the_cli_reached_the_provider() -> bool:
        return any(long_task in first_user_text(r["body"]) for r in provider.server.requests[asked:]
                   if isinstance(r.get("body"), dict))

    run, env = _campaign_with_egress_opened(install, tmp_path, {**channel_plan_data(campaign), "probes": [probe]},
                                            corpus, the_cli_reached_the_provider, "allow-all-egress-overlap")
    out, err = run.stdout, run.stderr
    assert run.returncode == 12, out + err
    assert "halted: confinement check" in err, err
    with _environ(env):
        store = open_store("s3://probes", Settings())
        (state,) = Ledger(store, campaign).sessions().values()
        capture = json.loads(store.get(layout.SessionKeys(campaign, probe["id"], "present-001").capture))
        refusals = json.loads(store.get(layout.refusals_key(campaign)))["refusals"]
    # The CLI ran to its end: the session itself succeeded ...
    assert state.status == "succeeded", (state.status, state.detail)
    assert capture["exit_code"] == 0
    failed = [c for c in capture["confinement_checks"] if not c["passed"]]
    assert failed, capture["confinement_checks"]
    # ... and the transform refuses it, naming the check that failed while it ran.
    (refusal,) = refusals
    assert "failed while this session ran" in refusal["reason"], refusal


def test_a_session_runs_on_across_a_restart_of_the_gateway(install, provider, long_task, tmp_path):
    """Issue 15: "a gateway restart does not fail running sessions beyond the CLI's own
    retries". Once the session's CLI has reached the provider (its first call, through the
    gateway), the gateway's pod is deleted; while the session's Bash sleeps, the Deployment
    starts another, which knows the attempt from its watch of session pods and carries the
    first pod's meter from the attempt's Lease. The CLI's next call goes to it: the session
    succeeds, and its meter holds both calls, one from each gateway pod."""
    from runner import layout
    from runner.demo.provider import first_user_text
    from runner.ledger import Ledger
    from runner.store import open_store

    node = install.node
    campaign = f"restart-{os.urandom(3).hex()}"
    corpus, probe = _long_session(tmp_path, long_task, "HW-PRB-0103")
    (tmp_path / "plan.json").write_text(json.dumps({**channel_plan_data(campaign), "probes": [probe]}))
    asked = len(provider.server.requests)
    env = {**_install_env(install, tmp_path), "RUNNER_CONCURRENCY": "1"}
    selector = f"{names.COMPONENT}={names.GATEWAY_COMPONENT},{names.INSTANCE}={install.release}"

    def gateway_pods() -> dict[str, bool]:
        pods = json.loads(node.kubectl("-n", install.namespace, "get", "pods", "-l", selector, "-o", "json").stdout)["items"]
        return {p["metadata"]["name"]: any(c["type"] == "Ready" and c["status"] == "True"
                                           for c in p.get("status", {}).get("conditions", [])) for p in pods}

    run = subprocess.Popen([sys.executable, "-m", "runner", "run", str(tmp_path / "plan.json"), "--corpus", str(corpus),
                            "--executor", "kubernetes"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not any(long_task in first_user_text(r["body"]) for r in provider.server.requests[asked:]
                      if isinstance(r.get("body"), dict)):
            assert run.poll() is None, run.communicate()
            assert time.monotonic() < deadline, "the session's CLI never reached the provider"
            time.sleep(0.2)
        (first,) = gateway_pods()
        node.kubectl("-n", install.namespace, "delete", "pod", first, "--wait=false")
        deadline = time.monotonic() + 40  # within the session's 45 s sleep
        while not any(ready for name, ready in gateway_pods().items() if name != first):
            assert time.monotonic() < deadline, f"no new gateway pod was ready within 40 s: {gateway_pods()}"
            time.sleep(0.5)
        out, err = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, out + err
    with _environ(env):
        store = open_store("s3://probes", Settings())
        (state,) = Ledger(store, campaign).sessions().values()
        capture = json.loads(store.get(layout.SessionKeys(campaign, probe["id"], "present-001").capture))
    assert state.status == "succeeded" and capture["exit_code"] == 0, (state.status, state.detail)
    meter = capture["gateway"]
    assert meter["calls"] >= 2 and not meter["refused"], meter  # the call before the restart and the one after


def test_the_egress_proxy_reaches_the_provider_port_at_the_provider_range_only(proxy_install, real_node):
    """Before, the proxy's policy allowed the provider's port at any address, so the proxy (and
    through a Squid misconfiguration, a session) could reach any host of the cluster's network
    on that port. Now its egress names the provider's range (the public internet by default):
    a listener on another host's port 443 stays out of reach, the provider's does not."""
    install = proxy_install
    node = install.node
    probe = ("timeout 8 openssl s_client -connect {}:443 </dev/null 2>/dev/null | head -1")
    with listener(None, real_node.other_ip, 443):
        other = node.kubectl("-n", install.namespace, "exec", f"deploy/{install.release}-egress-proxy", "--",
                             "sh", "-c", probe.format(real_node.other_ip), check=False)
    provider = node.kubectl("-n", install.namespace, "exec", f"deploy/{install.release}-egress-proxy", "--",
                            "sh", "-c", probe.format(real_node.provider_ip), check=False)
    assert provider.stdout.startswith("CONNECTED"), provider.stdout + provider.stderr
    assert not other.stdout.startswith("CONNECTED"), other.stdout + other.stderr


def test_helm_test_checks_an_install_without_a_campaign(install, targets):
    """`helm test` runs the chart's confinement-test pod (the canary, judged by the controller's
    rule): it passes on this install, and fails, naming the route, once a foreign policy opens
    the session pods' egress."""
    node = install.node
    run = ("test", install.release, "-n", install.namespace, "--kubeconfig", str(node.kubeconfig), "--logs",
           "--timeout", "100s")
    passed = helm(*run, check=False)
    assert passed.returncode == 0 and "confinement check: passed" in passed.stdout, passed.stdout + passed.stderr
    foreign = allow_all_egress("allow-all-egress-helm-test", install.namespace)
    node.apply(foreign)
    try:
        failed = helm(*run, check=False)
        said = failed.stdout + failed.stderr
        assert failed.returncode != 0 and "confinement check: a route opened" in said, said
    finally:
        node.kubectl("-n", install.namespace, "delete", "networkpolicy", "allow-all-egress-helm-test")
