"""What the install's gateway (``probe-runner gateway``, runner/gateway/cluster.py) adds on top
of the gateway itself (issue 15, item 2, the Kubernetes half), measured in one run against the
real API server of tests/cluster/ (kube-apiserver, etcd, KWOK nodes):

- **plain**: runner.gateway.server.Gateway alone, as a local run starts it (bench/gateway.py);
- **install**: ``probe-runner gateway`` as the chart's Deployment runs it: each token checked
  against a watch of the session pods, and each call forwarded only within what the gateway
  holds of the session's room in its attempt's Lease (runner/gateway/cluster.py), once with
  ``gateway.hold_usd`` 0 (a Lease write before every call, as the install's gateway did before
  issue 28 item 3) and once with the default $1 (one write holds room for many calls).

Both sides serve the same sessions: N session pods created for real (KWOK reports them
running), one token per pod, against the same upstream (bench/gateway.py's, an aiohttp server
answering like the Messages API). Measured, each side in its own process on loopback:

1. per request: small streamed answers one after another (one attempt);
2. N concurrent streaming sessions, each its own attempt (so N Leases are written), every
   session streaming a paced answer at once: the time to the first byte and to the end, and
   the errors;
3. N concurrent sessions each making a few small calls one after another: each call's time.

Each part also counts the Lease writes per call, from a watch of the API server.

    python bench/gateway_cluster.py [--sessions 500] [--requests 500] [--calls 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench"), str(REPO / "tests" / "cluster"), str(REPO / "tests")]

import aiohttp  # noqa: E402
from conftest import run_build, start_cluster  # noqa: E402  (tests/cluster)
from gateway import _one, _p, _sequential, serve_upstream_and_gateway  # noqa: E402  (bench/gateway.py)
from ports import free_port  # noqa: E402  (tests/ports.py)

from runner import demo  # noqa: E402
from runner.gateway import tokens  # noqa: E402
from runner.k8s import manifests, names  # noqa: E402
from runner.k8s.api import Kube  # noqa: E402
from runner.plan import parse_plan  # noqa: E402
from runner.settings import KubeSettings, load_settings  # noqa: E402

CAMPAIGN = "bench"


async def _many(url: str, tokens_: list[str]) -> tuple[list[float], list[float], int]:
    """Every session streams at once, each with its own token."""
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as s:
        results = await asyncio.gather(*(_one(s, url, {"x-api-key": t}) for t in tokens_), return_exceptions=True)
    ok = [r for r in results if not isinstance(r, BaseException)]
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        print(f"   first error: {errors[0]!r}"[:300])
    return [r[0] for r in ok], [r[1] for r in ok], len(errors)


def _pods(kube: Kube, n: int) -> list[tuple[str, str, int]]:
    """n session pods of the campaign, created and running (KWOK): their (probe, session, attempt)."""
    settings = load_settings(store="file:///unused", kube={"namespace": kube.namespace})
    data = json.loads(demo.PLAN.read_text())
    data["campaign"] = CAMPAIGN
    plan = parse_plan(data, "plan")
    keys = [("HW-PRB-0007", f"present-{i:04d}", 1) for i in range(n)]

    def create(key: tuple[str, str, int]) -> None:
        kube.create_pod(manifests.session_pod(settings, plan, key[0], key[1], key[2], "task",
                                              manifests.Route("http://127.0.0.1:1", token="t")))
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(create, keys))
    selector = names.selector_string(names.selector("probe-runner", names.SESSION_COMPONENT, CAMPAIGN))
    deadline = time.monotonic() + 300
    while sum(p.get("status", {}).get("phase") == "Running" for p in kube.list_pods(selector)[0]) < n:
        assert time.monotonic() < deadline, "the session pods did not run within 300 s"
        time.sleep(1)
    return keys


class LeaseWrites:
    """Counts the writes of the gateways' Leases as the API server reports them (a watch)."""

    def __init__(self, kube: Kube) -> None:
        self.kube, self.count, self._stop = kube, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from kubernetes import watch

        selector = names.selector_string(names.selector("probe-runner", names.GATEWAY_COMPONENT))
        rv = self.kube.coordination.list_namespaced_lease(self.kube.namespace, label_selector=selector).metadata.resource_version
        while not self._stop.is_set():
            w = watch.Watch()
            try:
                for event in w.stream(self.kube.coordination.list_namespaced_lease, self.kube.namespace,
                                      label_selector=selector, resource_version=rv, timeout_seconds=30):
                    rv = event["object"].metadata.resource_version
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self.count += 1
                    if self._stop.is_set():
                        w.stop()
            except Exception:
                if self._stop.is_set():
                    return  # the cluster went first
                raise

    def stop(self) -> None:
        self._stop.set()


def _install_gateway(cluster, ns: str, upstream: str, secret: bytes, name: str, hold_usd: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
    env.update({"RUNNER_KUBE__KUBECONFIG": str(cluster.kubeconfig), "RUNNER_KUBE__NAMESPACE": ns,
                "RUNNER_PROVIDER__BASE_URL": upstream, "RUNNER_PROVIDER__API_KEY": "bench-key",
                "RUNNER_GATEWAY__TOKEN_SECRET": secret.hex(), "RUNNER_GATEWAY__PORT": str(port),
                "RUNNER_GATEWAY__HOLD_USD": hold_usd, "RUNNER_LOG__LEVEL": "warning", "POD_NAME": name,
                "RUNNER_GATEWAY__BIND_TO_POD_ADDRESS": "false",  # the clients are on loopback, not at their pods' addresses
                "PYTHONPATH": str(REPO)})
    proc = subprocess.Popen([sys.executable, "-m", "runner", "gateway"], env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            asyncio.run(_ping(url))
            return proc, url
        except OSError:
            assert time.monotonic() < deadline and proc.poll() is None, "the install's gateway did not start"
            time.sleep(0.2)


async def _calls(url: str, tokens_: list[str], calls: int) -> tuple[list[float], int]:
    """Every session at once, each making ``calls`` small calls one after another: each call's time."""
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=600)) as s:
        async def session(t: str) -> list[float]:
            return [(await _one(s, url, {"x-api-key": t}))[1] for _ in range(calls)]
        results = await asyncio.gather(*(session(t) for t in tokens_), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        print(f"   first error: {errors[0]!r}"[:300])
    return [x for r in results if not isinstance(r, BaseException) for x in r], len(errors)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=500)
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--calls", type=int, default=4, help="calls each session makes one after another in part 3")
    args = ap.parse_args()

    base = Path(tempfile.mkdtemp(prefix="bgc-", dir="/tmp"))
    secret = tokens.new_secret()
    procs, upstream, plain = serve_upstream_and_gateway(secret)
    with start_cluster(run_build(), base / "kwok") as cluster:
        cluster.add_nodes(args.sessions // 40 + 1, prefix="bench")  # 32 CPUs each: 58 session pods (550m) fit
        ns = cluster.create_namespace("bench-gateway")
        cluster.apply({"apiVersion": "v1", "kind": "ServiceAccount", "automountServiceAccountToken": False,
                       "metadata": {"name": names.session_service_account("probe-runner"), "namespace": ns}})
        kube = Kube(KubeSettings(namespace=ns, kubeconfig=cluster.kubeconfig))
        t0 = time.monotonic()
        keys = _pods(kube, args.sessions)
        print(f"{args.sessions} session pods created and running in {time.monotonic() - t0:.1f} s")
        expires = int(time.time() + 3600)

        def token(sec: bytes, key: tuple[str, str, int]) -> str:
            return tokens.mint(sec, tokens.Claims(CAMPAIGN, *key, expires))

        plain_tokens = [token(secret, k) for k in keys]
        install_tokens = [token(secret.hex().encode(), k) for k in keys]  # what the process was given, as bytes
        small = "/v1/messages?events=3&size=200"
        paced = "/v1/messages?events=40&size=400&pace=0.05"  # about 2 s and 16 KiB each
        writes = LeaseWrites(kube)
        rows: dict[str, dict[str, object]] = {}
        sides = [("plain gateway", None), ("install, hold_usd 0", "0"), ("install, hold_usd 1", "1")]
        try:
            for name, hold in sides:
                proc, url = (None, plain) if hold is None else _install_gateway(
                    cluster, ns, upstream, secret, f"gateway-bench-{name[-1]}", hold)
                toks = plain_tokens if hold is None else install_tokens
                try:
                    w0 = writes.count
                    seq = asyncio.run(_sequential(url + small, {"x-api-key": toks[0]}, args.requests))
                    w1 = writes.count
                    f, e, err = asyncio.run(_many(url + paced, toks))
                    w2 = writes.count
                    c, cerr = asyncio.run(_calls(url + small, toks, args.calls))
                    w3 = writes.count
                finally:
                    if proc is not None:
                        proc.terminate()
                        proc.wait(30)
                rows[name] = {"seq": seq, "first": f, "whole": e, "err": err + cerr, "calls": c,
                              "w_seq": (w1 - w0) / (args.requests + 20), "w_many": (w2 - w1) / args.sessions,
                              "w_calls": (w3 - w2) / (args.sessions * args.calls)}
        finally:
            writes.stop()
        d = asyncio.run(_sequential(upstream + small, {"x-api-key": "bench-key"}, args.requests))
        print(f"direct to the upstream: {1000 * _p(d, 50):.3f} ms per request at p50")
        print("| | " + " | ".join(rows) + " |")
        print("| --- |" + " --- |" * len(rows))
        line = lambda label, f: print(f"| {label} | " + " | ".join(f(r) for r in rows.values()) + " |")  # noqa: E731
        line(f"1. {args.requests} small answers one after another (one attempt), p50 / p90",
             lambda r: f"{1000 * _p(r['seq'], 50):.3f} / {1000 * _p(r['seq'], 90):.3f} ms")
        line("   Lease writes per call", lambda r: f"{r['w_seq']:.3f}")
        line(f"2. {args.sessions} sessions at once, each its first call: first byte p50 / p99",
             lambda r: f"{1000 * _p(r['first'], 50):.0f} / {1000 * _p(r['first'], 99):.0f} ms")
        line("   whole 2 s stream p50 / p99", lambda r: f"{_p(r['whole'], 50):.3f} / {_p(r['whole'], 99):.3f} s")
        line("   Lease writes per call", lambda r: f"{r['w_many']:.3f}")
        line(f"3. {args.sessions} sessions at once, {args.calls} small calls each in turn: per call p50 / p99",
             lambda r: f"{1000 * _p(r['calls'], 50):.1f} / {1000 * _p(r['calls'], 99):.1f} ms")
        line("   Lease writes per call", lambda r: f"{r['w_calls']:.3f}")
        line("errors", lambda r: str(r["err"]))
        p, h0, h1 = rows.values()
        for label, key, q in (("1, p50", "seq", 50), ("2, first byte p99", "first", 99), ("2, whole p99", "whole", 99),
                              ("3, p99", "calls", 99)):
            print(f"ratio to the plain gateway, {label}: hold_usd 0 {_p(h0[key], q) / _p(p[key], q):.2f}x, "  # type: ignore[arg-type]
                  f"hold_usd 1 {_p(h1[key], q) / _p(p[key], q):.2f}x")  # type: ignore[arg-type]
    for proc_ in procs:
        proc_.terminate()
    subprocess.run(["rm", "-rf", str(base)], check=False)


async def _ping(url: str) -> None:
    async with aiohttp.ClientSession() as s, s.get(url + "/") as r:
        if r.status != 200:
            raise OSError(f"HTTP {r.status}")


if __name__ == "__main__":
    main()
