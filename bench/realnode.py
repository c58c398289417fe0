"""On the real node of tests/node/: the time from a session pod's creation to its harness's
start, and from the harness's exit to the session's outcome journaled, beside a bare pod of the
same image running the same command, measured in the same run.

- ours: ``probe-runner submit`` into the chart installed with the real helm; the controller Job
  creates each session pod, delivers the workspace by exec, the entry point waits until the
  pod's network policy is in force and starts the CLI; after the CLI's exit the controller
  fetches and verifies the stream, collects the artifacts and journals the outcome.
- bare: a pod with only the harness container of one of ours (same image, volumes, security
  context, environment and CLI arguments, same network policy), whose command pipes the task
  into the CLI directly: no reader, no delivery, no policy wait, no collection. Its "outcome"
  is the moment a watch sees its container terminated: the earliest any controller could know.
  Its workspace is empty (nothing delivers one), so its Read calls return errors; its turns with
  the provider are the same.

Both sides are timed by the same observers: a pod watch (creation: its ADDED event; the harness
container running, as the kubelet reports it; end of a bare pod: the first event with the
harness container terminated) and a sampler of the node's
pod cgroups every 50 ms (the CLI's start from its /proc start time, 10 ms resolution; its exit
when it is gone, so exit times are late by up to 50 ms on both sides). The outcome's time is
the ledger entry's own ``at`` (milliseconds; the controller runs on this machine's clock).

The machine is shared and has two cores: read the ratios, not the absolute figures.

    python bench/realnode.py [--sessions 8] [--concurrency 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "node"), str(REPO / "tests")]  # conftest: the node tier's

import conftest as stack  # noqa: E402  (tests/node/conftest.py: the same stack the node tier starts)
from kubernetes import client, config, watch  # noqa: E402

from runner import demo  # noqa: E402
from runner.k8s import manifests, names  # noqa: E402
from runner.ledger import Ledger, timestamp  # noqa: E402
from runner.settings import Settings  # noqa: E402
from runner.store import open_store  # noqa: E402

SAMPLE_SECONDS = 0.05
CLK_TCK = os.sysconf("SC_CLK_TCK")


class PodWatch(threading.Thread):
    """Per pod name: ADDED time, uid, and when the harness container was first seen terminated."""

    def __init__(self, core: client.CoreV1Api, namespace: str):
        super().__init__(daemon=True)
        self.core, self.namespace = core, namespace
        self.pods: dict[str, dict] = {}
        self.error: BaseException | None = None
        self._stop = threading.Event()

    def run(self) -> None:
        try:
            w = watch.Watch()
            while not self._stop.is_set():
                for ev in w.stream(self.core.list_namespaced_pod, self.namespace, timeout_seconds=5,
                                   _request_timeout=10):
                    t = time.time()
                    pod = ev["object"]
                    rec = self.pods.setdefault(pod.metadata.name, {"added": t, "uid": pod.metadata.uid})
                    rec.setdefault("object", client.ApiClient().sanitize_for_serialization(pod))
                    for cs in pod.status.container_statuses or []:
                        if cs.name == "harness" and cs.state and (cs.state.running or cs.state.terminated):
                            rec.setdefault("running_seen", t)
                        if cs.name == "harness" and cs.state and cs.state.terminated:
                            rec.setdefault("terminated_seen", t)
                            rec["exit_code"] = cs.state.terminated.exit_code
                    if self._stop.is_set():
                        break
        except BaseException as e:  # reported by main(), never swallowed
            self.error = e

    def stop(self) -> None:
        self._stop.set()


class CliSampler(threading.Thread):
    """Per pod uid: the CLI's start (its /proc start time) and exit (first sample without it)."""

    def __init__(self, node_id: str):
        super().__init__(daemon=True)
        tops = [h / node_id / "kubepods" for h in stack.realnode._cgroup_hierarchies()]
        self.top = next(t for t in tops if t.exists())
        self.cli: dict[str, dict] = {}      # pod uid -> {"start", "exit"}
        self.alive: dict[int, str] = {}     # pid -> pod uid
        self.error: BaseException | None = None
        self._stop = threading.Event()

    def _start_time(self, pid: int) -> float:
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / CLK_TCK)

    def run(self) -> None:
        try:
            while not self._stop.wait(SAMPLE_SECONDS):
                now, seen = time.time(), set()
                for group, _, _ in os.walk(self.top):  # pod cgroups come and go: os.walk skips the gone
                    uid = next((p[3:] for p in Path(group).parts if p.startswith("pod")), None)
                    try:
                        pids = [int(p) for p in Path(group, "cgroup.procs").read_text().split()]
                    except OSError:
                        continue
                    for pid in pids:
                        seen.add(pid)
                        if pid in self.alive or uid is None:
                            continue
                        try:
                            if Path(f"/proc/{pid}/comm").read_text().strip() != "claude":
                                continue
                            start = self._start_time(pid)
                        except OSError:
                            continue
                        self.alive[pid] = uid
                        rec = self.cli.setdefault(uid, {"start": start})
                        rec["start"] = min(rec["start"], start)
                for pid in [p for p in self.alive if p not in seen]:
                    rec = self.cli[self.alive.pop(pid)]
                    rec["exit"] = max(rec.get("exit", 0.0), now)
        except BaseException as e:
            self.error = e

    def stop(self) -> None:
        self._stop.set()


def run_ours(install, work: Path, campaign: str, sessions: int) -> dict[str, float]:
    """Submit a demo campaign of ``sessions`` sessions and wait for its end: pod name -> the
    time its outcome was journaled (the ledger entry's own ``at``)."""
    plan = json.loads(demo.PLAN.read_text())
    per_rep = len(plan["probes"]) * len(plan["arms"])
    plan.update(campaign=campaign, repetitions=max(1, sessions // per_rep))
    (work / "plan.json").write_text(json.dumps(plan))
    env = install.settings_env(work)
    for args in (["submit", str(work / "plan.json"), "--corpus", str(demo.CORPUS)],
                 ["status", campaign, "--watch", "--interval", "1"]):
        done = subprocess.run([sys.executable, "-m", "runner", *args], env=env, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=1800)
        if done.returncode != 0:
            raise SystemExit(f"probe-runner {args[0]} failed ({done.returncode}):\n{done.stderr}")
    os.environ.update({k: v for k, v in env.items() if k.startswith(("RUNNER_", "AWS_"))})
    settings = Settings()
    ledger = Ledger(open_store(settings.store, settings), campaign)
    out = {}
    for e in ledger.entries:
        if e["type"] == "outcome":
            probe, name = e["session"].split("/", 1)
            assert e["status"] == "succeeded", e
            out[manifests.pod_name(settings.kube.instance, campaign, probe, name, e["attempt"])] = timestamp(e["at"])
    return out


def bare_manifest(template: dict, name: str) -> dict:
    """Only the harness container of one of our session pods, its command piping the task into
    the CLI directly; labels as a session's (the same network policy), another campaign's."""
    spec = json.loads(json.dumps(template["spec"]))
    (harness,) = [c for c in spec["containers"] if c["name"] == "harness"]
    harness["command"] = ["sh", "-c", 'printf %s "$PROBE_TASK" | "$@"', "sh"]
    # The scheduler places it; the priority admission refuses a pod that states its own priority.
    for key in ("nodeName", "priority"):
        spec.pop(key, None)
    spec["containers"] = [harness]
    labels = {**template["metadata"]["labels"], names.CAMPAIGN: "bare", names.SESSION: name}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": spec}


def run_bare(core: client.CoreV1Api, namespace: str, podwatch: PodWatch, template: dict, sessions: int,
             concurrency: int) -> list[str]:
    names_ = [f"bare-{i:03d}" for i in range(sessions)]
    pending, running = list(names_), []
    deadline = time.monotonic() + 1800
    while pending or running:
        while pending and len(running) < concurrency:
            name = pending.pop(0)
            core.create_namespaced_pod(namespace, bare_manifest(template, name))
            running.append(name)
        for name in [n for n in running if "terminated_seen" in podwatch.pods.get(n, {})]:
            running.remove(name)
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        if time.monotonic() > deadline:
            raise SystemExit(f"bare pods did not end: {running}")
        time.sleep(0.05)
    return names_


def summary(label: str, values: list[float]) -> str:
    v = sorted(values)
    return (f"{label:<48} n={len(v):<3} p50 {statistics.median(v):6.2f} s   "
            f"min {v[0]:6.2f} s   max {v[-1]:6.2f} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=8, help="sessions per side (default 8; the demo's 4 per repetition)")
    ap.add_argument("--concurrency", type=int, default=2, help="sessions at once per side (default 2)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/realnode.py starts a real node: run it as root")
    with tempfile.TemporaryDirectory(prefix="bench-realnode-") as tmp:
        work = Path(tmp)
        for d in ("node", "pki", "values", "ours"):
            (work / d).mkdir()
        print("starting the real node, the provider, the bucket and the chart ...", flush=True)
        with stack.node_up(work / "node") as node, stack.serve_provider(node, work / "pki") as provider, \
                stack.serve_bucket(node) as (endpoint, _):
            install = stack.install_chart(node, provider, endpoint, work / "values", concurrency=args.concurrency)
            core = client.CoreV1Api(config.new_client_from_config(str(node.kubeconfig)))
            podwatch, sampler = PodWatch(core, install.namespace), CliSampler(node.id)
            podwatch.start()
            sampler.start()
            print(f"ours: {args.sessions} sessions, {args.concurrency} at once ...", flush=True)
            journaled = run_ours(install, work / "ours", f"bench-{os.urandom(3).hex()}", args.sessions)
            template = podwatch.pods[next(iter(journaled))]["object"]
            print(f"bare: {args.sessions} pods, {args.concurrency} at once ...", flush=True)
            bare = run_bare(core, install.namespace, podwatch, template, args.sessions, args.concurrency)
            time.sleep(3 * SAMPLE_SECONDS)
            podwatch.stop()
            sampler.stop()
            for t in (podwatch, sampler):
                if t.error is not None:
                    raise SystemExit(f"{type(t).__name__} failed: {t.error!r}")
            rows = {"ours": [], "bare": []}
            for side, pods in (("ours", journaled), ("bare", bare)):
                for name in pods:
                    pod = podwatch.pods[name]
                    cli = sampler.cli.get(pod["uid"])
                    if cli is None or "exit" not in cli:
                        raise SystemExit(f"{side} pod {name}: the CLI was never seen running ({cli})")
                    if side == "bare" and pod.get("exit_code") != 0:
                        raise SystemExit(f"bare pod {name}: the CLI exited {pod.get('exit_code')}")
                    end = journaled[name] if side == "ours" else pod["terminated_seen"]
                    rows[side].append((cli["start"] - pod["added"], end - cli["exit"],
                                       pod["running_seen"] - pod["added"]))
    starts = {s: [r[0] for r in rows[s]] for s in rows}
    ends = {s: [r[1] for r in rows[s]] for s in rows}
    print()
    print(summary("ours: pod created -> harness container running", [r[2] for r in rows["ours"]]))
    print(summary("bare: pod created -> harness container running", [r[2] for r in rows["bare"]]))
    print(summary("ours: pod created -> harness (CLI) started", starts["ours"]))
    print(summary("bare: pod created -> harness (CLI) started", starts["bare"]))
    print(summary("ours: harness exited -> outcome journaled", ends["ours"]))
    print(summary("bare: harness exited -> termination seen", ends["bare"]))
    start_ratio = statistics.median(starts["ours"]) / statistics.median(starts["bare"])
    end_ratio = statistics.median(ends["ours"]) / max(statistics.median(ends["bare"]), SAMPLE_SECONDS)
    print(f"ratio ours/bare (p50): creation -> harness start {start_ratio:.2f}x, "
          f"harness exit -> outcome {end_ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
