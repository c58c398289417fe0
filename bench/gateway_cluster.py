"""What the install's gateway (``probe-runner gateway``, runner/gateway/cluster.py) adds on top
of the gateway itself (issue 15, item 2, the Kubernetes half), measured in one run against the
real API server of tests/cluster/ (kube-apiserver, etcd, KWOK nodes):

- **plain**: runner.gateway.server.Gateway alone, as a local run starts it (bench/gateway.py);
- **install**: ``probe-runner gateway`` as the chart's Deployment runs it: each token checked
  against a watch of the session pods, and each call written into its attempt's Lease (in
  flight) before it is forwarded, then its usage after.

Both sides serve the same sessions: N session pods created for real (KWOK reports them
running), one token per pod, against the same upstream (bench/gateway.py's, an aiohttp server
answering like the Messages API). Measured, each side in its own process on loopback:

1. per request: small streamed answers one after another (one attempt);
2. N concurrent streaming sessions, each its own attempt (so N Leases are written), every
   session streaming a paced answer at once: the time to the first byte and to the end, and
   the errors.

    python bench/gateway_cluster.py [--sessions 500] [--requests 500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=500)
    ap.add_argument("--requests", type=int, default=500)
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
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("RUNNER_")}
        env.update({"RUNNER_KUBE__KUBECONFIG": str(cluster.kubeconfig), "RUNNER_KUBE__NAMESPACE": ns,
                    "RUNNER_PROVIDER__BASE_URL": upstream, "RUNNER_PROVIDER__API_KEY": "bench-key",
                    "RUNNER_GATEWAY__TOKEN_SECRET": secret.hex(), "RUNNER_GATEWAY__PORT": str(port),
                    "RUNNER_LOG__LEVEL": "warning", "POD_NAME": "gateway-bench", "PYTHONPATH": str(REPO)})
        install_proc = subprocess.Popen([sys.executable, "-m", "runner", "gateway"], env=env)
        install = f"http://127.0.0.1:{port}"
        cluster_secret = secret.hex().encode()  # what the process was given, as bytes
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    asyncio.run(_ping(install))
                    break
                except OSError:
                    assert time.monotonic() < deadline and install_proc.poll() is None, "the install's gateway did not start"
                    time.sleep(0.2)
            expires = int(time.time() + 3600)

            def token(sec: bytes, key: tuple[str, str, int]) -> str:
                return tokens.mint(sec, tokens.Claims(CAMPAIGN, *key, expires))

            plain_tokens = [token(secret, k) for k in keys]
            install_tokens = [token(cluster_secret, k) for k in keys]
            small = "/v1/messages?events=3&size=200"
            d = asyncio.run(_sequential(upstream + small, {"x-api-key": "bench-key"}, args.requests))
            p = asyncio.run(_sequential(plain + small, {"x-api-key": plain_tokens[0]}, args.requests))
            g = asyncio.run(_sequential(install + small, {"x-api-key": install_tokens[0]}, args.requests))
            print(f"1. {args.requests} small streamed answers one after another, one attempt (p50, p90 of the whole request):")
            for name, v in (("direct", d), ("plain gateway", p), ("install's gateway", g)):
                print(f"   {name:18} {1000 * _p(v, 50):.3f} ms, {1000 * _p(v, 90):.3f} ms")
            print(f"   the install's gateway adds {1000 * (_p(g, 50) - _p(p, 50)):.3f} ms per request at p50 to the plain one "
                  f"(the Lease written before forwarding); ratio {_p(g, 50) / _p(p, 50):.2f}x")

            paced = "/v1/messages?events=40&size=400&pace=0.05"  # about 2 s and 16 KiB each
            pf, pe, perr = asyncio.run(_many(plain + paced, plain_tokens))
            gf, ge, gerr = asyncio.run(_many(install + paced, install_tokens))
            print(f"2. {args.sessions} concurrent streaming sessions, each its own attempt (40 events 50 ms apart):")
            for name, f, e, err in (("plain gateway", pf, pe, perr), ("install's gateway", gf, ge, gerr)):
                print(f"   {name:18} first byte p50 {1000 * _p(f, 50):.1f} ms p99 {1000 * _p(f, 99):.1f} ms; "
                      f"whole p50 {_p(e, 50):.3f} s p99 {_p(e, 99):.3f} s; errors {err}")
            print(f"   ratio of the whole stream at p99: {_p(ge, 99) / _p(pe, 99):.2f}x; "
                  f"of the first byte at p99: {_p(gf, 99) / _p(pf, 99):.2f}x")
            leases = kube.list_leases(names.selector_string(names.selector("probe-runner", names.GATEWAY_COMPONENT)))
            print(f"   Leases written: {len(leases)} (one per attempt)")
        finally:
            install_proc.terminate()
            install_proc.wait(30)
    for proc in procs:
        proc.terminate()
    subprocess.run(["rm", "-rf", str(base)], check=False)


async def _ping(url: str) -> None:
    async with aiohttp.ClientSession() as s, s.get(url + "/") as r:
        if r.status != 200:
            raise OSError(f"HTTP {r.status}")


if __name__ == "__main__":
    main()
