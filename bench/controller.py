"""Pods per second, and the controller's CPU and memory per 1,000 sessions, on the simulated
cluster of tests/cluster/, printed beside the same figures for a naive loop in the same run.

Both sides run the same session pods against the same control plane (kube-apiserver,
scheduler, controller-manager, etcd, KWOK nodes), with tests/cluster/simnode.py playing the
kubelet: it runs each pod's reader and a harness that replays a stream the real CLI produced.
What differs is the controller:

- controller: ``probe-runner run --executor kubernetes`` (watch cache, ledger, exec transfers
  verified by sha256, artifact collection, then the transform of every stream);
- naive: bench/naive_controller.py (seal, create, deliver, GET-poll every 0.5 s, one log read,
  delete; no ledger, no verification, no transform).

Each runs as a child process; its CPU (user + system) and peak RSS come from ``wait4``. The
machine is shared and has two cores, and SimNode's own processes compete with the controller
for them: read the ratios, not the absolute figures.

    python bench/controller.py [--sessions 1000] [--concurrency 20] [--nodes 20]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kubernetes import client

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "cluster"), str(REPO / "tests")]  # conftest: the cluster tier's

from conftest import run_build, start_cluster, write_cri_log  # noqa: E402
from simnode import SimNode  # noqa: E402
from test_kubernetes_executor import install_objects  # noqa: E402

from runner import demo  # noqa: E402

REAL_STREAM = REPO / "tests" / "data" / "claude-code-2.1.197" / "read-write-answer.jsonl"


def _plan(path: Path, campaign: str, sessions: int) -> None:
    data = json.loads(demo.PLAN.read_text())
    data["campaign"] = campaign
    data["repetitions"] = max(1, sessions // (len(data["probes"]) * len(data["arms"])))
    path.write_text(json.dumps(data))


def _measure(argv: list[str], env: dict[str, str], started=None) -> tuple[float, float, float, int, str]:
    """Wall seconds, CPU seconds, peak RSS (MiB), exit status and stderr of one child process;
    ``started(pid)`` is called once it runs."""
    t0 = time.monotonic()
    # stderr to a file, read after the child ends: a pipe read only then fills at 64 KiB and
    # blocks the child's logging (it did at concurrency 100: the controller hung in write).
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=log)
        if started is not None:
            started(proc.pid)
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.monotonic() - t0
        log.seek(0)
        err = log.read().decode(errors="replace")
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        print(err[-3000:], file=sys.stderr)
    return wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024, code, err


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=1000, help="sessions per side (rounded down to a multiple of 4)")
    ap.add_argument("--concurrency", type=int, default=20)
    ap.add_argument("--nodes", type=int, default=20)
    args = ap.parse_args()

    bin_dir = run_build()
    base = Path(tempfile.mkdtemp(prefix="bc-", dir="/tmp"))  # short: socket paths below it have 108 bytes
    base.chmod(0o755)
    shared = base / "shared"
    shared.mkdir(mode=0o755)
    stream = shared / "real.jsonl"
    stream.write_bytes(REAL_STREAM.read_bytes())
    stream.chmod(0o644)
    replay = ["sh", "-c", 'exec cat "$0"', str(stream)]
    cri = write_cri_log(shared / "harness.log", REAL_STREAM.read_text().splitlines())
    rows = []
    with start_cluster(bin_dir, base / "kwok") as cluster:
        cluster.add_nodes(args.nodes, prefix="bench")
        for side in ("naive", "controller"):
            ns = cluster.create_namespace(f"bench-{side}")
            cluster.apply([{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "provider", "namespace": ns},
                            "stringData": {"api-key": "k"}}, *install_objects(ns)])
            cluster.serve_cluster_logs(f"bench-{side}", cri, match_namespaces=[ns], containers=["harness"])
            plan = base / f"plan-{side}.json"
            _plan(plan, f"bench-{side}", args.sessions)
            sessions = len(json.loads(plan.read_text())["probes"]) * 2 * json.loads(plan.read_text())["repetitions"]
            env = {**os.environ, "RUNNER_STORE": (base / f"store-{side}").as_uri(), "RUNNER_KUBE__NAMESPACE": ns,
                   "RUNNER_KUBE__KUBECONFIG": str(cluster.kubeconfig), "RUNNER_KUBE__CREDENTIALS_SECRET": "provider",
                   "RUNNER_PROVIDER__API_KEY": "k", "RUNNER_LOCAL__WORKDIR": str(base / f"work-{side}"),
                   "RUNNER_KUBE__CANARY_ENABLED": "false",  # KWOK runs no container to measure with
                   "RUNNER_GATEWAY__ENABLED": "false",  # the egress proxy's path: gateway_cluster.py measures the gateway
                   "PYTHONPATH": str(REPO)}
            if side == "controller":
                argv = [sys.executable, "-m", "runner", "run", str(plan), "--corpus", str(demo.CORPUS),
                        "--executor", "kubernetes", "--concurrency", str(args.concurrency)]
            else:
                argv = [sys.executable, str(REPO / "bench" / "naive_controller.py"), str(plan), str(demo.CORPUS),
                        str(base / "naive-out"), str(args.concurrency)]
            sim_root = base / f"sim-{side}"
            sim_root.mkdir(mode=0o755)
            with SimNode(cluster.api_client(), ns, sim_root, replay, harness_binds=(str(shared),)) as sim:
                wall, cpu, rss, code, _ = _measure(argv, env)
            # 1: sessions left not started (nothing spent; the next run starts them), counted below
            if code not in (0, 1, 12):
                raise SystemExit(f"{side} exited {code}; sim errors: {sim.errors[:5]}")
            created = len(sim.created)
            rows.append((side, sessions, created, wall, cpu, rss, sim.max_running))
            if side == "controller":
                from runner.ledger import Ledger
                from runner.store.file import FileStore

                states = [st.status for st in Ledger(FileStore(base / "store-controller"), "bench-controller").sessions().values()]
                counted = {k: states.count(k) for k in sorted(set(states))}
                print(f"controller's ledger: {counted} of {sessions} sessions; exit {code}", flush=True)
            client.CoreV1Api(cluster.api_client()).delete_namespace(ns)
    print(f"\n{'side':<11}{'sessions':>9}{'pods':>6}{'wall s':>9}{'pods/s':>8}{'CPU s/1000':>12}{'peak RSS MiB':>14}{'max running':>13}")
    for side, n, created, wall, cpu, rss, most in rows:
        print(f"{side:<11}{n:>9}{created:>6}{wall:>9.1f}{created / wall:>8.2f}{cpu * 1000 / n:>12.1f}{rss:>14.1f}{most:>13}")
    (_, n0, c0, w0, cpu0, rss0, _), (_, n1, c1, w1, cpu1, rss1, _) = rows
    print(f"\ncontroller / naive: pods/s {(c1 / w1) / (c0 / w0):.2f}x, CPU per session {(cpu1 / n1) / (cpu0 / n0):.2f}x, "
          f"peak RSS {rss1 / rss0:.2f}x")
    print(f"(this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB peak, SimNode included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
