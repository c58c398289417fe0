"""What one exec costs the controller and the API server, with TLS session resumption and
without it, in the same run (issue 32, item 1: the CPU per session).

Every exec transfer is a new connection (a WebSocket upgrade takes its connection), so
without resumption each pays a full TLS handshake: the controller verifies the API server's
certificate chain, the API server signs. ``runner/k8s/api.py`` offers each exec connection
the session the last one to the same server left. This bench runs the controller's own
``Kube.exec`` (the retry-free call every transfer makes) against tests/cluster/'s control plane,
from --threads threads at once, into a KWOK pod whose exec runs ``true`` on this host, in
alternating rounds: ``full`` wraps every connection as a plain SSLContext does (every handshake a
full one, as before resumption), ``resumed`` as the runner does. Per round it reads this process's CPU
(user + system: the controller's side of every exec) and the API server's and KWOK's (from
/proc), and prints their medians per exec and the ratio resumed / full.

    python bench/exec_cost.py [--execs 400] [--threads 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import functools
import os
import ssl
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "cluster"), str(REPO / "tests")]  # conftest: the cluster tier's

from conftest import run_build, start_cluster  # noqa: E402
from scale import _cpu_seconds, _plane_pids  # noqa: E402

from runner.k8s import api  # noqa: E402
from runner.k8s.api import Kube  # noqa: E402
from runner.settings import KubeSettings  # noqa: E402


def _context(kube: Kube) -> api._ResumingContext:
    """The exec connections' TLS context, as Kube.exec's connections take it."""
    c = kube._exec_config
    return api._tls_context(c.ssl_ca_cert or None, True if c.assert_hostname is None else bool(c.assert_hostname),
                            c.cert_file or None, c.key_file or None)


def one_round(kube: Kube, pod: str, execs: int, threads: int, resumed: bool, pids: dict[str, int]) -> dict[str, float]:
    """``execs`` execs, ``threads`` at once; ``resumed`` False: every connection wrapped as an
    SSLContext wraps one (no session offered, none kept: the runner before resumption)."""
    context = _context(kube)
    context._sessions.clear()
    if resumed:
        context.__dict__.pop("wrap_socket", None)
    else:
        context.wrap_socket = functools.partial(ssl.SSLContext.wrap_socket, context)

    def one(_: int) -> None:
        res = kube.exec(pod, "c", ["true"], timeout=30)
        if res.code != 0:
            raise SystemExit(f"exec into {pod} exited {res.code}: {res.stderr[-300:]!r}")

    before = {name: _cpu_seconds(pid) or 0.0 for name, pid in pids.items()}
    mine, t0 = os.times(), time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(execs)))
    wall, after, done = time.monotonic() - t0, {name: _cpu_seconds(pid) or 0.0 for name, pid in pids.items()}, os.times()
    out = {"controller": (done.user + done.system - mine.user - mine.system) / execs * 1000, "wall": wall / execs * 1000}
    for name in pids:
        out[name] = (after[name] - before[name]) / execs * 1000
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--execs", type=int, default=400, help="execs per round")
    ap.add_argument("--threads", type=int, default=8, help="execs at once")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of each kind, alternating")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="bx-", dir="/tmp"))
    base.chmod(0o755)
    with start_cluster(run_build(), base / "kwok") as cluster:
        cluster.add_nodes(1, prefix="exec")
        ns = cluster.create_namespace("exec-cost")
        cluster.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "target", "namespace": ns},
                       "spec": {"containers": [{"name": "c", "image": "none"}]}})
        cluster.kubectl("-n", ns, "wait", "--for=condition=Ready", "pod/target", "--timeout=60s")
        cluster.serve_exec("target", ns, base)
        kube = Kube(KubeSettings(kubeconfig=cluster.kubeconfig, namespace=ns))
        pids = {k: v for k, v in _plane_pids(cluster).items() if k in ("kube-apiserver", "kwok-controller")}
        one_round(kube, "target", 20, args.threads, True, pids)  # warm: clients built, the first session held
        rows: dict[str, list[dict[str, float]]] = {"full": [], "resumed": []}
        for i in range(args.rounds):
            for kind in ("full", "resumed") if i % 2 == 0 else ("resumed", "full"):
                r = one_round(kube, "target", args.execs, args.threads, kind == "resumed", pids)
                rows[kind].append(r)
                print(f"[round {i + 1}] {kind:<8} " + "  ".join(f"{k} {v:.2f} ms" for k, v in r.items()), flush=True)
    print(f"\n{args.execs} execs per round, {args.threads} at once, {args.rounds} rounds each; medians per exec:")
    print(f"  {'':<20}{'full':>10}{'resumed':>10}{'ratio':>8}")
    for key in rows["full"][0]:
        full = statistics.median(r[key] for r in rows["full"])
        res = statistics.median(r[key] for r in rows["resumed"])
        label = {"controller": "controller CPU", "wall": "wall / exec"}.get(key, key + " CPU")
        print(f"  {label:<20}{full:>8.2f}ms{res:>8.2f}ms{res / full if full else float('nan'):>7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
