"""The controller at scale (issue 17, item 1): a campaign of --sessions with --concurrency at
once over --nodes simulated nodes, measured against a small campaign (--baseline-sessions) in
the same run on the same cluster; then the concurrency raised (--sweep) until something fails.

The cluster is tests/cluster/'s (kube-apiserver, etcd, scheduler, controller-manager, KWOK
nodes), its API server writing an audit event per request. tests/cluster/simnode.py plays the
nodes in its light form (``Replay``): no process per pod, every harness replays a stream the
real CLI produced over --seconds. Every transfer is still a real exec through the API server
and KWOK into the pod's directories. The controller is ``probe-runner run --executor
kubernetes``, a child process: its CPU and peak RSS come from ``wait4``.

Per run it prints:
- the controller's CPU seconds per session and peak RSS;
- its API requests per session by verb and resource, counted from the API server's audit log
  (every request of the runner carries the user agent ``probe-runner/VERSION``; SimNode's,
  KWOK's and the control plane's do not) — the API server's metrics have no label that tells
  clients apart;
- exec transfers per session and the retries among them, from the tally the controller logs at
  its end (``kubernetes: API requests N (R retried); exec transfers ...``); an exec the API
  server upgraded and KWOK then failed is audited as a success (101);
- p50/p99 from the pod's creation (the audit event's time) to its harness's start (SimNode's
  delivery seen), and from the harness's exit to the outcome journaled (the ledger entry's
  ``at``, milliseconds);
- whether every session succeeded once: one harness run per pod, one pod per session, every
  session at attempt 1, the ledger's chain intact;
- the control plane's share apart from the controller's (issue 32, item 4): each control-plane
  process's CPU seconds over the run (and the bench's own: SimNode) and its busiest 5 s (from /proc/PID/stat, sampled), the API
  server's p50/p99 for reads and writes (``apiserver_request_duration_seconds``, its buckets'
  bounds), etcd's WAL fsync and backend commit p99, every client's requests answered 429 or 5xx
  (the audit log), any control-plane process that ended; the controller's most threads.
  ``--wave-timeout`` stops a controller that does not finish, after recording what its
  threads wait on (their kernel wait channels) and its log's tail.

The last line is the verdict against the issue's goals: <= 0.15 s controller CPU per session,
<= 300 MiB peak RSS at --concurrency at once, API requests per session flat (within 10%) from
the baseline campaign to the large one.

    python bench/scale.py [--sessions 1000] [--concurrency 500] [--nodes 50] [--seconds 60]
                          [--baseline-sessions 200] [--sweep 750,1000,1500]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "cluster"), str(REPO / "tests")]  # conftest: the cluster tier's

from conftest import run_build, start_cluster  # noqa: E402
from controller import _measure, _plan  # noqa: E402  bench/controller.py
from simnode import Replay, SimNode, as_in_pod  # noqa: E402
from test_kubernetes_executor import install_objects  # noqa: E402

from runner import demo  # noqa: E402
from runner.clock import timestamp  # noqa: E402
from runner.k8s import manifests  # noqa: E402
from runner.k8s.api import USER_AGENT  # noqa: E402
from runner.ledger import Ledger  # noqa: E402
from runner.plan import MAX_REPETITIONS  # noqa: E402
from runner.settings import KubeSettings  # noqa: E402
from runner.store.file import FileStore  # noqa: E402

REAL_STREAM = REPO / "tests" / "data" / "claude-code-2.1.197" / "read-write-answer.jsonl"
CPU_GOAL, RSS_GOAL, FLAT_GOAL = 0.15, 300.0, 0.10
PODS_PER_NODE = 110  # each simulated node's pod limit (the kubelet's default)


@dataclass
class Run:
    label: str
    sessions: int
    concurrency: int
    wall: float = 0.0
    cpu: float = 0.0
    rss: float = 0.0
    rss_running: float = 0.0  # the peak while harnesses ran (sampled), apart from the transform at the end
    code: int = 0
    most: int = 0
    requests: Counter = field(default_factory=Counter)  # (verb, resource) -> count
    everyone: Counter = field(default_factory=Counter)  # verb -> count, every client's (the API server's metrics)
    tally: dict[str, tuple[int, int]] = field(default_factory=dict)  # the controller's log: kind -> (sent, retries)
    failed_codes: Counter = field(default_factory=Counter)  # the controller's requests answered >= 400
    start_lat: list[float] = field(default_factory=list)
    end_lat: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    stderr: str = ""
    running_at_kill: int = 0  # --restart: harnesses running when the first controller was killed
    adopted: list[float] = field(default_factory=list)  # --restart: kill -> the new controller's first exec, per such pod
    plane: dict[str, float] = field(default_factory=dict)  # control-plane process -> CPU seconds over the controller's run
    plane_peak: dict[str, float] = field(default_factory=dict)  # process -> most CPU in one 5 s sample, in cores
    plane_gone: list[str] = field(default_factory=list)  # control-plane processes that ended during the run, and when
    threads: int = 0  # the controller's most threads seen
    latency: dict[str, tuple[float, float]] = field(default_factory=dict)  # verb group -> API server p50/p99 s (bucket bounds)
    etcd: dict[str, float] = field(default_factory=dict)  # etcd's WAL fsync and backend commit p99 s over the run
    answered: Counter = field(default_factory=Counter)  # every client's requests answered 429, 5xx or 504, by code
    stalled: str = ""  # --wave-timeout: what the controller's threads waited on when it was stopped

    def per_session(self, key: tuple[str, str]) -> float:
        return self.requests[key] / self.sessions


def _pct(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else (values or [float("nan")])[0]


def _resource(obj: dict) -> str:
    return obj.get("resource", "") + (f"/{obj['subresource']}" if obj.get("subresource") else "")


def _served(cluster) -> Counter:
    """apiserver_request_total by verb: every request the API server has answered, any client's."""
    out: Counter = Counter()
    for line in cluster.kubectl("get", "--raw", "/metrics").stdout.splitlines():
        if line.startswith("apiserver_request_total{"):
            labels, _, value = line.rpartition(" ")
            verb = labels.split('verb="', 1)[1].split('"', 1)[0]
            out[verb] += int(float(value))
    return out


PLANE = ("kube-apiserver", "etcd", "kube-scheduler", "kube-controller-manager", "kwok-controller")
TICK = os.sysconf("SC_CLK_TCK")


def _plane_pids(cluster) -> dict[str, int]:
    """The control plane's processes by name, from kwokctl's pid files."""
    return {name: int((cluster.cluster_dir / "pids" / f"{name}.pid").read_text()) for name in PLANE}


def _cpu_seconds(pid: int) -> float | None:
    """utime + stime of ``pid`` (its threads' included), None once it has ended."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK if fields[0] != "Z" else None


def _histograms(text: str, metric: str, label: str) -> dict[str, Counter]:
    """Cumulative bucket counts of a Prometheus histogram, summed over every series with the
    same ``label`` value: value -> {le: count}."""
    out: dict[str, Counter] = {}
    for line in text.splitlines():
        if line.startswith(metric + "_bucket{"):
            labels, _, value = line.rpartition(" ")
            key = re.search(label + '="([^"]*)"', labels).group(1) if label else ""
            le = re.search('le="([^"]*)"', labels).group(1)
            out.setdefault(key, Counter())[le] += int(float(value))
    return out


def _quantile(after: Counter, before: Counter, q: float) -> float:
    """The upper bound of the bucket that holds the ``q`` quantile of what was observed between
    two readings of a histogram (nan if nothing was)."""
    bounds = sorted(after, key=lambda le: float(le))
    total = after["+Inf"] - before["+Inf"]
    if total <= 0:
        return float("nan")
    for le in bounds:
        if after[le] - before[le] >= q * total:
            return float(le)
    return float("inf")


LATENCY_GROUPS = {"reads": ("GET", "LIST"), "writes": ("POST", "PUT", "PATCH", "DELETE")}
ETCD_DISK = ("etcd_disk_wal_fsync_duration_seconds", "etcd_disk_backend_commit_duration_seconds")


def _metrics(cluster) -> tuple[dict[str, Counter], dict[str, Counter]]:
    """apiserver_request_duration_seconds by verb, and etcd's disk histograms (WAL fsync,
    backend commit), as cumulative buckets: read before and after a run, their difference is the run's."""
    apiserver = _histograms(cluster.kubectl("get", "--raw", "/metrics").stdout, "apiserver_request_duration_seconds", "verb")
    cmdline = Path(f"/proc/{_plane_pids(cluster)['etcd']}/cmdline").read_bytes().decode().split("\0")
    url = next(a.split("=", 1)[1].split(",")[0] for a in cmdline if a.startswith("--listen-client-urls="))
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    return apiserver, {name: _histograms(text, name, "").get("", Counter()) for name in ETCD_DISK}


def _stop(pid: int, run: Run, after: float) -> None:
    """--wave-timeout: record what the controller's threads wait on (their kernel wait channel and
    state) and the tail of its log, then SIGTERM it (SIGKILL 60 s later if it is still there)."""
    waits: Counter = Counter()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            waits[f"{(task / 'wchan').read_text().strip() or '-'} ({state})"] += 1
        except OSError:
            continue
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        rss = int(status.split("VmRSS:", 1)[1].split()[0]) / 1024
        cpu = _cpu_seconds(pid) or 0.0
        with open(f"/proc/{pid}/fd/2", "rb") as log:
            log.seek(max(0, os.fstat(log.fileno()).st_size - 3000))
            tail = log.read().decode(errors="replace")
    except OSError:
        return
    run.stalled = (f"after {after:.0f} s: {sum(waits.values())} threads, {rss:.0f} MiB RSS, {cpu:.1f} s CPU; "
                   f"threads by wait channel (state): {dict(waits.most_common(8))}\nthe log's tail:\n{tail}")
    print(f"[{run.label}] stopping the controller {run.stalled}", flush=True)
    os.kill(pid, signal.SIGTERM)
    for _ in range(60):
        time.sleep(1)
        if _cpu_seconds(pid) is None:
            return
    os.kill(pid, signal.SIGKILL)


def _plan_and_corpus(base: Path, path: Path, campaign: str, sessions: int) -> Path:
    """Write the plan of ``sessions`` sessions; return the corpus it runs on. The demo's two
    probes hold at most 3,996 sessions (999 repetitions of each arm), so a larger campaign runs on
    a copy of the demo corpus whose probes are repeated under new ids and paths, as few as make
    ``sessions`` a whole number of repetitions of at most 999."""
    _plan(path, campaign, sessions)
    data = json.loads(path.read_text())
    arms, originals = len(data["arms"]), data["probes"]
    if data["repetitions"] <= MAX_REPETITIONS:
        return demo.CORPUS
    fits = [n for n in range(len(originals), sessions + 1) if sessions // (n * arms) <= MAX_REPETITIONS]
    count = next((n for n in fits if sessions % (n * arms) == 0), fits[0])
    corpus = base / f"corpus-{campaign}"
    shutil.copytree(demo.CORPUS, corpus)
    probes = []
    for i in range(count):
        copy, k = originals[i % len(originals)], i // len(originals)
        if k:
            number = int(copy["id"][-4:]) + 100 * k
            new_id, source = f"{copy['id'][:-4]}{number:04d}", corpus / copy["path"]
            target = source.with_name(f"{source.stem}-{k}{source.suffix}")
            target.write_text(source.read_text().replace(f"id: {copy['id']}", f"id: {new_id}", 1))
            copy = {**copy, "id": new_id, "path": target.relative_to(corpus).as_posix()}
        probes.append(copy)
    data["probes"], data["repetitions"] = probes, sessions // (count * arms)
    path.write_text(json.dumps(data))
    return corpus


def _kill_when_all_run(argv: list[str], env: dict[str, str], sim: SimNode, concurrency: int, log: Path,
                       timeout: float) -> tuple[float, set[str]]:
    """Run a first controller until ``concurrency`` harnesses run at once, then SIGKILL it;
    return the kill's time (epoch seconds, as the audit log's) and the pods running then."""
    with open(log, "wb") as err:
        first = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + timeout
        while sim.running_now < concurrency:
            if first.poll() is not None or time.monotonic() > deadline:
                first.kill()
                raise SystemExit(f"--restart: {sim.running_now} of {concurrency} harnesses ran at once "
                                 f"(the first controller's log: {log})")
            time.sleep(0.2)
        first.send_signal(signal.SIGKILL)
        killed = time.time()
        first.wait()
    return killed, {name for name, runs in sim.harness_runs.items() if runs and runs[-1][1] is None}


def one_run(cluster, base: Path, stream: Path, label: str, sessions: int, concurrency: int, seconds: float,
            extra_env: dict[str, str], restart: bool = False, timeout: float = 0.0) -> Run:
    """One campaign. ``restart``: its controller is SIGKILLed once ``concurrency`` harnesses run
    and started again (issue 32, item 6), which must adopt every running pod: the run is the
    second controller's, and ``adopted`` times each running pod's first exec after the kill.
    ``timeout``: the controller is stopped (SIGTERM) after that many seconds, what its threads
    waited on recorded first."""
    ns = cluster.create_namespace(f"scale-{label}")
    cluster.apply([{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "provider", "namespace": ns},
                    "stringData": {"api-key": "k"}}, *install_objects(ns)])
    plan_path = base / f"plan-{label}.json"
    campaign = f"scale-{label}"
    corpus = _plan_and_corpus(base, plan_path, campaign, sessions)
    plan = json.loads(plan_path.read_text())
    run = Run(label, len(plan["probes"]) * len(plan["arms"]) * plan["repetitions"], concurrency)
    env = {**os.environ, "RUNNER_STORE": (base / f"store-{label}").as_uri(), "RUNNER_KUBE__NAMESPACE": ns,
           "RUNNER_KUBE__KUBECONFIG": str(cluster.kubeconfig), "RUNNER_KUBE__CREDENTIALS_SECRET": "provider",
           "RUNNER_PROVIDER__API_KEY": "k", "RUNNER_LOCAL__WORKDIR": str(base / f"work-{label}"),
           "RUNNER_KUBE__CANARY_ENABLED": "false",  # KWOK runs no container to measure with
           "RUNNER_GATEWAY__ENABLED": "false",  # the egress proxy's path: gateway_cluster.py measures the gateway
           "RUNNER_LOG__LEVEL": "info",  # one line per session, and the executor's tally at the end
           "PYTHONPATH": str(REPO), **extra_env}
    argv = [sys.executable, "-m", "runner", "run", str(plan_path), "--corpus", str(corpus),
            "--executor", "kubernetes", "--concurrency", str(concurrency)]
    offset = cluster.audit_offset()
    served = _served(cluster)
    pids = {**_plane_pids(cluster), "bench": os.getpid()}  # the bench: SimNode's threads, the samplers
    metrics_before = _metrics(cluster)
    sim_root = base / f"sim-{label}"
    sim_root.mkdir(mode=0o755)
    print(f"[{label}] {run.sessions} sessions, {concurrency} at once, {seconds:g} s each ...", flush=True)
    with SimNode(cluster.api_client(), ns, sim_root, Replay(stream, seconds)) as sim:
        def sample(pid: int) -> None:
            def loop() -> None:
                while True:
                    try:
                        status = Path(f"/proc/{pid}/status").read_text()
                    except OSError:
                        return
                    if sim.running_now:
                        kib = int(status.split("VmRSS:", 1)[1].split()[0])
                        run.rss_running = max(run.rss_running, kib / 1024)
                    time.sleep(0.25)
            threading.Thread(target=loop, daemon=True).start()

            def plane_loop() -> None:
                """The control plane's CPU over the run and its busiest 5 s; the controller's threads."""
                t0 = time.monotonic()
                first = last = {name: _cpu_seconds(p) for name, p in pids.items()}
                while Path(f"/proc/{pid}").exists():
                    time.sleep(5)
                    now = {name: _cpu_seconds(p) for name, p in pids.items()}
                    for name, cpu in now.items():
                        if cpu is None:
                            if not any(gone.startswith(name + " ") for gone in run.plane_gone):
                                run.plane_gone.append(f"{name} at {time.monotonic() - t0:.0f} s")
                            continue
                        run.plane[name] = cpu - (first[name] or 0.0)
                        run.plane_peak[name] = max(run.plane_peak.get(name, 0.0), (cpu - (last[name] or cpu)) / 5)
                    last = {k: (v if v is not None else last[k]) for k, v in now.items()}
                    try:
                        threads = int(Path(f"/proc/{pid}/status").read_text().split("Threads:", 1)[1].split()[0])
                    except (OSError, IndexError):
                        return
                    run.threads = max(run.threads, threads)
            threading.Thread(target=plane_loop, daemon=True).start()
            if timeout:
                stopper.append(threading.Timer(timeout, _stop, (pid, run, timeout)))
                stopper[0].start()

        killed, running = 0.0, set()
        stopper: list[threading.Timer] = []
        if restart:
            killed, running = _kill_when_all_run(argv, env, sim, concurrency, base / f"controller-{label}-killed.log",
                                                 timeout=600 + seconds)
            run.running_at_kill = len(running)
            print(f"[{label}] killed the controller with {len(running)} harnesses running; starting it again ...", flush=True)
        run.wall, run.cpu, run.rss, run.code, run.stderr = _measure(argv, env, sample)
        for timer in stopper:
            timer.cancel()
        metrics_after = _metrics(cluster)
        for group, verbs in LATENCY_GROUPS.items():
            after, before = Counter(), Counter()
            for verb in verbs:
                after.update(metrics_after[0].get(verb, Counter()))
                before.update(metrics_before[0].get(verb, Counter()))
            if after["+Inf"] > before["+Inf"]:
                run.latency[group] = (_quantile(after, before, 0.5), _quantile(after, before, 0.99))
        for name in metrics_after[1]:
            run.etcd[name] = _quantile(metrics_after[1][name], metrics_before[1].get(name, Counter()), 0.99)
        (base / f"controller-{label}.log").write_text(run.stderr)
        time.sleep(2)  # the audit log's last events
    run.most = sim.max_running
    said = re.findall(r"runner\.executors\.kubernetes: kubernetes: (.*)", run.stderr)
    if said:
        run.tally = {kind.strip(): (int(n), int(r)) for kind, n, r in re.findall(r"([a-zA-Z ]+?) (\d+) \((\d+) retried\)", said[-1])}
    run.everyone = _served(cluster) - served
    events, _ = cluster.audit_events(offset)
    ours = [e for e in events if e.get("userAgent", "").startswith(USER_AGENT)]
    for e in events:
        code = (e.get("responseStatus") or {}).get("code", 0)
        if code == 429 or code >= 500:
            run.answered[code] += 1
    created: dict[str, float] = {}
    first_exec: dict[str, float] = {}
    for e in ours:
        obj = e.get("objectRef") or {}
        res = _resource(obj)
        run.requests[(e["verb"], res)] += 1
        code = (e.get("responseStatus") or {}).get("code", 0)
        if code >= 400:
            run.failed_codes[f"{e['verb']} {res} {code}"] += 1
        if e["verb"] == "create" and res == "pods" and code < 300:
            created[obj["name"]] = timestamp(e["requestReceivedTimestamp"])
        if restart and res == "pods/exec" and obj["name"] in running and obj["name"] not in first_exec:
            if (at := timestamp(e["requestReceivedTimestamp"])) > killed:
                first_exec[obj["name"]] = at
    if restart:
        run.adopted = sorted(at - killed for at in first_exec.values())
        if len(first_exec) != len(running):
            run.problems.append(f"{len(running) - len(first_exec)} of {len(running)} running pods not adopted")
    ledger = Ledger(FileStore(base / f"store-{label}"), campaign)
    broken = ledger.verify()
    if broken:
        run.problems.append(f"the ledger's chain does not verify: {broken[:3]}")
    states = ledger.sessions()
    counted = Counter(s.status for s in states.values())
    if counted != Counter({"succeeded": run.sessions}):
        run.problems.append(f"sessions: {dict(counted)} of {run.sessions}")
    if any(s.attempt != 1 for s in states.values()):
        run.problems.append(f"{sum(s.attempt != 1 for s in states.values())} sessions at attempt > 1")
    instance = KubeSettings.model_fields["instance"].default  # the controller's: RUNNER_KUBE__INSTANCE is not set
    outcome_at = {manifests.pod_name(instance, campaign, *e["session"].split("/", 1), e["attempt"]): timestamp(e["at"])
                  for e in ledger.entries if e["type"] == "outcome"}
    twice = [n for n, runs in sim.harness_runs.items() if len(runs) != 1]
    if twice:
        run.problems.append(f"{len(twice)} pods ran their harness more than once")
    if len(sim.created) != run.sessions or any(len(u) != 1 for u in sim.created.values()):
        run.problems.append(f"{len(sim.created)} pod names for {run.sessions} sessions")
    if sim.errors:
        run.problems.append(f"SimNode: {len(sim.errors)} errors, first: {sim.errors[:3]}")
    if run.plane_gone:
        run.problems.append(f"control-plane processes ended: {', '.join(run.plane_gone)}")
    if run.stalled:
        run.problems.append(f"stopped after {timeout:.0f} s")
    if run.code != 0:
        run.problems.append(f"the controller exited {run.code} (its log: {base / f'controller-{label}.log'}): "
                            f"{run.stderr.strip().splitlines()[-1][-300:] if run.stderr.strip() else ''}")
    for name, runs in sim.harness_runs.items():
        start, end = runs[0]
        if name in created:
            run.start_lat.append(start - created[name])
        if end is not None and name in outcome_at:
            run.end_lat.append(outcome_at[name] - end)
    client.CoreV1Api(cluster.api_client()).delete_namespace(ns)
    return run


def report(runs: list[Run]) -> None:
    print(f"\n{'run':<10}{'sessions':>9}{'at once':>8}{'most':>6}{'wall s':>8}{'CPU s/session':>14}{'peak RSS MiB (running)':>23}"
          f"{'requests/session':>17}{'execs/session (retried)':>24}"
          f"{'create->start p50/p99 s':>25}{'exit->outcome p50/p99 s':>25}{'threads':>8}{'apiserver/etcd CPU s':>21}  problems")
    for r in runs:
        total = sum(r.requests.values()) / r.sessions
        print(f"{r.label:<10}{r.sessions:>9}{r.concurrency:>8}{r.most:>6}{r.wall:>8.1f}{r.cpu / r.sessions:>14.3f}{r.rss:>14.1f} ({r.rss_running:>5.1f})"
              f"{total:>17.2f}{r.tally.get('exec transfers', (0, 0))[0] / r.sessions:>15.2f} ({r.tally.get('exec transfers', (0, 0))[1] / r.sessions:.3f})"
              f"{_pct(r.start_lat, 50):>12.2f} / {_pct(r.start_lat, 99):>6.2f}    {_pct(r.end_lat, 50):>10.2f} / {_pct(r.end_lat, 99):>6.2f}"
              f"{r.threads:>8}{r.plane.get('kube-apiserver', 0.0):>12.0f} / {r.plane.get('etcd', 0.0):<7.0f}"
              f"  {'; '.join(r.problems) or 'none'}")
    for r in runs:  # the control plane's share of each run, apart from the controller's
        plane = ", ".join(f"{name} {r.plane[name]:.0f} s (busiest 5 s: {r.plane_peak.get(name, 0.0):.2f} cores)"
                          for name in (*PLANE, "bench") if name in r.plane)
        latency = ", ".join(f"{group} {p50:g} / {p99:g} s" for group, (p50, p99) in r.latency.items())
        etcd = ", ".join(f"{name.split('_')[2]} {p99:g} s" for name, p99 in r.etcd.items())
        print(f"  {r.label}: CPU over {r.wall:.0f} s: controller {r.cpu:.0f} s, {plane}; API server p50 / p99 (bucket bounds): "
              f"{latency or 'none'}; etcd p99: {etcd}; every client's 429 / 5xx: {dict(r.answered) or 'none'}")
        if r.stalled:
            print(f"  {r.label}: stopped {r.stalled}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=1000, help="sessions of the large campaign (rounded down to a multiple of 4)")
    ap.add_argument("--concurrency", type=int, default=500, help="sessions at once in the large campaign")
    ap.add_argument("--baseline-sessions", type=int, default=200, help="sessions of the baseline campaign, at a fifth of --concurrency, harnesses as long")
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=60.0, help="each harness's length at --concurrency; the sweep scales it with the concurrency")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="more environment of the controller, every run's")
    ap.add_argument("--sweep", default="750,1000,1500", help="concurrencies to try after the large campaign, one wave each, until one fails ('' for none)")
    ap.add_argument("--sweep-only", action="store_true", help="no baseline and large campaign: the sweep alone, and no verdict on the goals")
    ap.add_argument("--restart", type=int, default=0, metavar="N",
                    help="then N sessions at N at once, the controller SIGKILLed once all run and started again: "
                         "every running pod adopted (timed), every session once (issue 32, item 6); with --sweep-only, "
                         "after the sweep")
    ap.add_argument("--campaign", type=int, default=0, metavar="N",
                    help="with --sweep-only, after the sweep: one campaign of N sessions at --concurrency, --seconds "
                         "each, every session once (issue 32, item 4)")
    ap.add_argument("--wave-timeout", type=float, default=0.0, metavar="S",
                    help="stop a run's controller after S seconds (0: never), what its threads waited on recorded: "
                         "a wave that does not end is a failure")
    args = ap.parse_args()
    extra = dict(e.split("=", 1) for e in args.env)
    most = max([args.concurrency, args.restart, *[int(x) for x in args.sweep.split(",") if x.strip()]])
    if most > args.nodes * PODS_PER_NODE:
        ap.error(f"{most} sessions at once do not fit on {args.nodes} nodes of {PODS_PER_NODE} pods: raise --nodes")

    bin_dir = run_build()
    base = Path(tempfile.mkdtemp(prefix="bs-", dir="/tmp"))
    base.chmod(0o755)
    stream = base / "real.jsonl"
    stream.write_bytes(as_in_pod(REAL_STREAM.read_bytes()))
    runs: list[Run] = []
    with start_cluster(bin_dir, base / "kwok") as cluster:
        # CPU enough for the pod limit: at the default 32 CPUs a node held 58 session pods (550m
        # each, the reader's and the harness's requests), so 50 nodes held 2,900 and a wave of
        # 3,000 left its last pods unschedulable.
        cluster.add_nodes(args.nodes, prefix="scale", cpu="128", pods=str(PODS_PER_NODE))
        small = max(1, args.concurrency // 5)
        if not args.sweep_only:
            runs.append(one_run(cluster, base, stream, "baseline", args.baseline_sessions, small, args.seconds, extra))
            runs.append(one_run(cluster, base, stream, "large", args.sessions, args.concurrency, args.seconds, extra))
            report(runs)
        failed_at = None
        for c in [int(x) for x in args.sweep.split(",") if x.strip()]:
            r = one_run(cluster, base, stream, f"sweep-{c}", c, c, args.seconds * c / args.concurrency, extra,
                        timeout=args.wave_timeout)
            runs.append(r)
            report(runs)
            if r.problems:
                failed_at = r
                break
        if args.campaign and args.sweep_only and failed_at is None:
            r = one_run(cluster, base, stream, f"campaign-{args.campaign}", args.campaign, args.concurrency,
                        args.seconds, extra, timeout=args.wave_timeout)
            runs.append(r)
            report([r])
            print(f"campaign of {r.sessions} sessions at {r.concurrency} at once: {r.wall:.0f} s end to end; "
                  f"every session once: {'yes' if not r.problems else 'NO: ' + '; '.join(r.problems)}")
            if r.problems:
                failed_at = r
        if args.restart:
            r = one_run(cluster, base, stream, f"restart-{args.restart}", args.restart, args.restart,
                        args.seconds * args.restart / args.concurrency, extra, restart=True)
            report([r])
            print(f"restart at {r.running_at_kill} running: {len(r.adopted)} pods adopted, kill -> the new controller's "
                  f"first exec into each p50 {_pct(r.adopted, 50):.1f} s, last {max(r.adopted, default=float('nan')):.1f} s; "
                  f"every session once: {'yes' if not r.problems else 'NO: ' + '; '.join(r.problems)}")
            if r.problems:
                return 1
    if args.sweep_only:
        if runs:
            failed = f"first failure at {failed_at.concurrency} at once: {'; '.join(failed_at.problems)}" if failed_at else None
            print(f"\nverdict (sweep only): {failed or f'no failure up to {runs[-1].concurrency} at once'}")
        return 1 if failed_at else 0
    b, big = runs[0], runs[1]
    print("\nAPI requests per session by verb and resource (the runner's, from the audit log):")
    keys = sorted(set(b.requests) | set(big.requests))
    print(f"  {'verb resource':<28}{b.label:>10}{big.label:>10}{'ratio':>8}")
    for k in keys:
        x, y = b.per_session(k), big.per_session(k)
        print(f"  {k[0] + ' ' + k[1]:<28}{x:>10.3f}{y:>10.3f}{(y / x if x else float('inf')):>7.2f}x")
    tb, tl = sum(b.requests.values()) / b.sessions, sum(big.requests.values()) / big.sessions
    print(f"  {'all':<28}{tb:>10.3f}{tl:>10.3f}{tl / tb:>7.2f}x")
    print("every client's requests per session by verb (apiserver_request_total; SimNode, KWOK and the control plane included):")
    for verb in sorted(set(b.everyone) | set(big.everyone)):
        x, y = b.everyone[verb] / b.sessions, big.everyone[verb] / big.sessions
        print(f"  {verb:<28}{x:>10.3f}{y:>10.3f}{(y / x if x else float('inf')):>7.2f}x")
    for r in runs:
        if r.failed_codes:
            print(f"  {r.label}: the runner's requests answered >= 400: {dict(r.failed_codes.most_common(6))}")
    if failed_at is not None:
        print(f"\nfirst failure: {failed_at.label} ({failed_at.concurrency} at once): {'; '.join(failed_at.problems)}")
    elif len(runs) > 2:
        print(f"\nno failure up to {runs[-1].concurrency} at once")
    cpu, flat = big.cpu / big.sessions, abs(tl / tb - 1)
    held = [cpu <= CPU_GOAL, big.rss <= RSS_GOAL, flat <= FLAT_GOAL, not big.problems]
    print(f"verdict: CPU {cpu:.3f} s/session (goal <= {CPU_GOAL}) {'holds' if held[0] else 'FAILS'}; "
          f"peak RSS {big.rss:.0f} MiB ({big.rss_running:.0f} while harnesses ran) at {big.most} at once "
          f"(goal <= {RSS_GOAL:.0f} at {big.concurrency}) "
          f"{'holds' if held[1] and big.most >= big.concurrency else 'FAILS'}; "
          f"requests/session {tl / tb:.2f}x the baseline's (goal flat, within {FLAT_GOAL:.0%}) {'holds' if held[2] else 'FAILS'}; "
          f"every session once: {'yes' if held[3] else 'NO'}")
    return 0 if all(held) else 1


if __name__ == "__main__":
    sys.exit(main())
