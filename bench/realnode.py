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
  the provider are the same. Through the gateway it is named and annotated as an attempt of a
  campaign ``bare`` and holds a token of its own, minted with the install's key as the
  controller mints one (a copy of ours would be refused: a token is revoked when its session
  ends). A bare pod whose CLI fails or runs three times longer than ours ends the bench at once.

Three configurations are measured, each with an install of its own (``--configs``): the
provider gateway (the chart's default), the egress proxy (gateway.enabled false), both under
runc, and the gateway with the session pods in gVisor's sandbox (the RuntimeClass gvisor and the
harness image's gVisor variant; its bare pods run in gVisor too), and, first, a cold start: the
harness image removed from the node's containerd and the pull policy IfNotPresent, so the
kubelet pulls it (from Debian's registry on this machine, the node's mirror of ghcr.io:
tests/node/registry.py) for the first wave (no bare side: the image is there by then). For
ours, the campaign's start phases (runner/phases.py, from ``status --json``) say where the time
went, p50 per phase.

Both sides are timed by the same observers: a pod watch (creation: its ADDED event; the harness
container running, as the kubelet reports it; end of a bare pod: the first event with the
harness container terminated) and a sampler of the node's
pod cgroups every 50 ms (the CLI's start from its /proc start time, 10 ms resolution; its exit
when it is gone, so exit times are late by up to 50 ms on both sides). The outcome's time is
the ledger entry's own ``at`` (milliseconds; the controller runs on this machine's clock).

The machine is shared and has two cores: read the ratios, not the absolute figures.

    python bench/realnode.py [--sessions 8] [--concurrency 2] [--configs cold,gateway,proxy,gvisor]
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "node"), str(REPO / "tests")]  # conftest: the node tier's

import conftest as stack  # noqa: E402  (tests/node/conftest.py: the same stack the node tier starts)
import registry  # noqa: E402  (tests/node/registry.py: the registry a cold start pulls from)
from kubernetes import client, watch  # noqa: E402
from kubernetes import config as kubeconfig  # noqa: E402

from runner import demo  # noqa: E402
from runner.clock import timestamp  # noqa: E402
from runner.gateway import tokens  # noqa: E402
from runner.k8s import manifests, names  # noqa: E402
from runner.ledger import Ledger  # noqa: E402
from runner.phases import PHASES  # noqa: E402
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
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            w = watch.Watch()
            while not self._halt.is_set():
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
                    if self._halt.is_set():
                        break
        except BaseException as e:  # reported by main(), never swallowed
            self.error = e

    def stop(self) -> None:
        self._halt.set()


class CliSampler(threading.Thread):
    """Per pod uid: the CLI's start (its /proc start time) and exit (first sample without it)."""

    def __init__(self, node_id: str):
        super().__init__(daemon=True)
        tops = [h / node_id / "kubepods" for h in stack.realnode._cgroup_hierarchies()]
        self.top = next(t for t in tops if t.exists())
        self.cli: dict[str, dict] = {}      # pod uid -> {"start", "exit"}
        self.alive: dict[int, str] = {}     # pid -> pod uid
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def _start_time(self, pid: int) -> float:
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / CLK_TCK)

    def run(self) -> None:
        try:
            while not self._halt.wait(SAMPLE_SECONDS):
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
        self._halt.set()


def run_ours(install, work: Path, campaign: str, sessions: int) -> tuple[dict[str, float], dict]:
    """Submit a demo campaign of ``sessions`` sessions and wait for its end: pod name -> the
    time its outcome was journaled (the ledger entry's own ``at``), and the campaign's start
    phases as ``status --json`` gives them (runner/phases.py: each session's milestones)."""
    plan = json.loads(demo.PLAN.read_text())
    per_rep = len(plan["probes"]) * len(plan["arms"])
    plan.update(campaign=campaign, repetitions=max(1, sessions // per_rep))
    (work / "plan.json").write_text(json.dumps(plan))
    env = install.settings_env(work)
    for args in (["submit", str(work / "plan.json"), "--corpus", str(demo.CORPUS)],
                 ["status", campaign, "--watch", "--interval", "1"], ["status", campaign, "--json"]):
        done = subprocess.run([sys.executable, "-m", "runner", *args], env=env, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=1800)
        if done.returncode != 0:
            raise SystemExit(f"probe-runner {args[0]} failed ({done.returncode}):\n{done.stderr}")
    phases = json.loads(done.stdout)["phases"]["phases"]
    os.environ.update({k: v for k, v in env.items() if k.startswith(("RUNNER_", "AWS_"))})
    settings = Settings()
    ledger = Ledger(open_store(settings.store, settings), campaign)
    out = {}
    for e in ledger.entries:
        if e["type"] == "outcome":
            probe, name = e["session"].split("/", 1)
            assert e["status"] == "succeeded", e
            out[manifests.pod_name(settings.kube.instance, campaign, probe, name, e["attempt"])] = timestamp(e["at"])
    return out, phases


def bare_manifest(template: dict, name: str, secret: bytes | None) -> dict:
    """Only the harness container of one of our session pods, its command piping the task into
    the CLI directly; labels as a session's (the same network policy), another campaign's
    (``bare``). Through the gateway (``secret``: the install's token key) it is named and
    annotated as that campaign's attempt and holds a token of its own, minted as the controller
    mints one: the template's token was revoked when its session ended, and a copy of it is
    refused (401) from any pod but its own."""
    spec = json.loads(json.dumps(template["spec"]))
    (harness,) = [c for c in spec["containers"] if c["name"] == "harness"]
    harness["command"] = ["sh", "-c", 'printf %s "$PROBE_TASK" | "$@"', "sh"]
    # The scheduler places it; the priority admission refuses a pod that states its own priority.
    for key in ("nodeName", "priority"):
        spec.pop(key, None)
    spec["containers"] = [harness]
    meta = template["metadata"]
    labels = {**meta["labels"], names.CAMPAIGN: "bare", names.SESSION: name}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items()
                   if k in (names.CAMPAIGN, names.PROBE, names.SESSION, names.ATTEMPT)}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": spec}
    if secret is None:  # through the egress proxy: the pod reads the provider's key from its Secret
        return pod
    env = {e["name"]: e for e in harness["env"] if "value" in e}
    variable = next(n for n, e in env.items() if e["value"].startswith(f"{tokens.PREFIX}."))
    ours = tokens.verify(secret, env[variable]["value"], now=0)
    claims = dataclasses.replace(ours, campaign="bare", session=name, attempt=1, nonce="",
                                 expires=int(time.time()) + ours.expires - int(timestamp(meta["creationTimestamp"])))
    env[variable]["value"] = tokens.mint(secret, claims)
    pod["metadata"]["name"] = manifests.pod_name(meta["labels"][names.INSTANCE], "bare", ours.probe, name, 1)
    pod["metadata"]["annotations"] = {**annotations, names.CAMPAIGN: "bare", names.SESSION: name, names.ATTEMPT: "1"}
    return pod


def run_bare(core: client.CoreV1Api, namespace: str, podwatch: PodWatch, template: dict, sessions: int,
             concurrency: int, secret: bytes | None, limit: float) -> list[str]:
    """The bare pods, ``concurrency`` at once: their names. A bare pod whose CLI fails, or that
    runs longer than ``limit`` seconds, ends the bench at once with its log: a baseline that
    cannot run is a broken bench, not a slow one."""
    pending = [bare_manifest(template, f"bare-{i:03d}", secret) for i in range(sessions)]
    names_, running = [p["metadata"]["name"] for p in pending], {}
    while pending or running:
        while pending and len(running) < concurrency:
            pod = pending.pop(0)
            core.create_namespaced_pod(namespace, pod)
            running[pod["metadata"]["name"]] = time.monotonic()
        for name, created in list(running.items()):
            seen = podwatch.pods.get(name, {})
            if "terminated_seen" in seen:
                if seen.get("exit_code") != 0:
                    raise SystemExit(f"bare pod {name}: the CLI exited {seen.get('exit_code')}: the baseline cannot run\n"
                                     f"{_log(core, namespace, name)}")
                del running[name]
                core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
            elif time.monotonic() - created > limit:
                raise SystemExit(f"bare pod {name}: not ended {limit:.0f} s after its creation (ours took at most "
                                 f"{limit / 3:.0f} s): the baseline cannot run\n{_log(core, namespace, name)}")
        time.sleep(0.05)
    return names_


def _log(core: client.CoreV1Api, namespace: str, name: str) -> str:
    try:
        return str(core.read_namespaced_pod_log(name, namespace, container="harness", tail_lines=30))
    except client.ApiException as e:
        return f"(no log: {e.reason})"


def summary(label: str, values: list[float]) -> str:
    v = sorted(values)
    return (f"{label:<48} n={len(v):<3} p50 {statistics.median(v):6.2f} s   "
            f"min {v[0]:6.2f} s   max {v[-1]:6.2f} s")


CONFIGS = {  # name -> (route, runtime class, whether the harness image is pulled first)
    "gateway": ("gateway", None, False),
    "proxy": ("proxy", None, False),
    "gvisor": ("gateway", "gvisor", False),
    "cold": ("gateway", None, True),
}
HARNESS = "ghcr.io/probe-runner/harness:0.1.0"


def forget_harness(node) -> None:
    """Remove the harness image from the node's containerd, and its gVisor variant, which
    shares every layer but the loader's, by every name they have there, and wait for their
    content to go: the next session pod's kubelet pulls the image (from the registry mirror),
    every layer of it but those the runner image shares (the Debian base)."""
    ids = {stack.image_archives()[ref]["id"] for ref in (HARNESS, stack.GVISOR_HARNESS)}
    repository = HARNESS.split(":")[0]
    names_ = [n for n in node.ctr("images", "ls", "-q").stdout.split()
              if n in ids or n.startswith((f"{repository}:", f"{repository}@"))]
    if names_:
        node.ctr("images", "rm", "--sync", *names_)
    left = [n for n in node.ctr("images", "ls", "-q").stdout.split() if n in ids or n.startswith(repository)]
    if left:
        raise SystemExit(f"the harness image is still in the node's containerd: {left}")


def restore_gvisor_harness(node) -> None:
    """The gVisor variant back in the node's containerd, as imported (its installs pull nothing)."""
    node.ctr("images", "import", stack.image_archives()[stack.GVISOR_HARNESS]["archive"])


def measure(node, provider, endpoint: str, work: Path, config: str, sessions: int, concurrency: int,
            pulls: Callable[[], int]) -> tuple[dict[str, list], dict]:
    """One configuration (CONFIGS: the route to the provider and the runtime): the chart
    installed for it, ours then the bare pods: per side, (pod created -> CLI started, CLI
    exited -> outcome, pod created -> harness container running) per session; and our
    campaign's phases."""
    path, runtime, cold = CONFIGS[config]
    work.mkdir()
    install = stack.install_chart(node, provider, endpoint, work, concurrency=concurrency, gateway=path == "gateway",
                                  runtime=runtime, pull_policy="IfNotPresent" if cold else "Never",
                                  prepull=not cold)  # a pre-pull pod would hold the image on the node
    if cold:
        forget_harness(node)
    core = client.CoreV1Api(kubeconfig.new_client_from_config(str(node.kubeconfig)))
    secret = None
    if path == "gateway":
        data = core.read_namespaced_secret(f"{install.release}-gateway", install.namespace).data
        secret = base64.b64decode(data["token-secret"])
    podwatch, sampler = PodWatch(core, install.namespace), CliSampler(node.id)
    podwatch.start()
    sampler.start()
    print(f"{config}: ours, {sessions} sessions, {concurrency} at once ...", flush=True)
    pulled = pulls()
    journaled, phases = run_ours(install, work, f"bench-{os.urandom(3).hex()}", sessions)
    if cold:  # what reached the registry: a cold start that pulled nothing is no cold start
        print(f"{config}: the registry served {pulls() - pulled} harness blob request(s) to the node meanwhile", flush=True)
    template = podwatch.pods[next(iter(journaled))]["object"]
    longest = max(podwatch.pods[n]["terminated_seen"] - podwatch.pods[n]["added"] for n in journaled)
    if cold:
        restore_gvisor_harness(node)
    bare: list[str] = []
    # A cold start has no bare side (the image is on the node by then: it would be warm), nor has
    # gVisor: its sandbox's processes are the Sentry's, not the node's, so the sampler sees no CLI
    # in either side's pod (ours are timed by their start phases alone, below).
    sampled = runtime is None
    if not cold and sampled:
        print(f"{config}: bare, {sessions} pods, {concurrency} at once ...", flush=True)
        bare = run_bare(core, install.namespace, podwatch, template, sessions, concurrency, secret, 3 * longest + 30)
    time.sleep(3 * SAMPLE_SECONDS)
    podwatch.stop()
    sampler.stop()
    for t in (podwatch, sampler):
        if t.error is not None:
            raise SystemExit(f"{type(t).__name__} failed: {t.error!r}")
    rows: dict[str, list] = {"ours": [], "bare": []}
    for side, pods in (("ours", journaled if sampled else {}), ("bare", bare)):
        for name in pods:
            pod = podwatch.pods[name]
            cli = sampler.cli.get(pod["uid"])
            if cli is None or "exit" not in cli:
                raise SystemExit(f"{config}: {side} pod {name}: the CLI was never seen running ({cli})")
            end = journaled[name] if side == "ours" else pod["terminated_seen"]
            rows[side].append((cli["start"] - pod["added"], end - cli["exit"], pod["running_seen"] - pod["added"]))
    node.kubectl("delete", "namespace", install.namespace, "--wait=false")  # the next configuration's install alone
    return rows, phases


def report(config: str, rows: dict[str, list]) -> None:
    """The configuration's figures, and its ratios ours/bare (p50): creation -> harness start,
    harness exit -> outcome (a cold start has no bare side: its first wave pulled)."""
    path, runtime, cold = CONFIGS[config]
    starts = {s: [r[0] for r in rows[s]] for s in rows}
    ends = {s: [r[1] for r in rows[s]] for s in rows}
    print(f"\n-- {config}: through the {'provider gateway' if path == 'gateway' else 'egress proxy'}, "
          f"{'gVisor' if runtime else 'runc'}{', the harness image pulled by the first wave' if cold else ''}")
    if not rows["ours"]:
        print("no CLI sampled (gVisor's processes are its Sentry's): its start phases below say where the time went")
        return
    if cold:
        first = sorted(starts["ours"])[:2]
        print(summary("ours: pod created -> harness (CLI) started", starts["ours"]))
        print(f"first wave (the first two sessions): pod created -> harness started {first[0]:.2f} s and {first[-1]:.2f} s")
        return
    print(summary("ours: pod created -> harness container running", [r[2] for r in rows["ours"]]))
    print(summary("bare: pod created -> harness container running", [r[2] for r in rows["bare"]]))
    print(summary("ours: pod created -> harness (CLI) started", starts["ours"]))
    print(summary("bare: pod created -> harness (CLI) started", starts["bare"]))
    print(summary("ours: harness exited -> outcome journaled", ends["ours"]))
    print(summary("bare: harness exited -> termination seen", ends["bare"]))
    start_ratio = statistics.median(starts["ours"]) / statistics.median(starts["bare"])
    end_ratio = statistics.median(ends["ours"]) / max(statistics.median(ends["bare"]), SAMPLE_SECONDS)
    print(f"ratio ours/bare (p50), {config}: creation -> harness start {start_ratio:.2f}x, "
          f"harness exit -> outcome {end_ratio:.2f}x")


BEFORE_HARNESS = PHASES[PHASES.index("scheduled"):PHASES.index("harness_started") + 1]
AFTER_HARNESS = PHASES[PHASES.index("stream_collected"):]


def around(phases: dict[str, dict]) -> tuple[float, float]:
    """The sums of the p50s of the phases from the pod's creation to the harness's start, and
    from the harness's exit to the outcome journaled."""
    return (sum(phases[p]["p50"] for p in BEFORE_HARNESS if p in phases),
            sum(phases[p]["p50"] for p in AFTER_HARNESS if p in phases))


def phase_table(phases: dict[str, dict]) -> None:
    """Our sessions' phases, p50 per configuration, one column each (a markdown table, as
    bench/README.md keeps it), and each configuration's sum of the p50s."""
    configs = list(phases)
    names = [p for p in PHASES if any(p in phases[c] for c in configs)]
    print("\n| phase (p50, s) | " + " | ".join(configs) + " |")
    print("|---|" + "---:|" * len(configs))
    for name in names:
        print(f"| {name} | " + " | ".join(f"{phases[c][name]['p50']:.3f}" if name in phases[c] else "-"
                                         for c in configs) + " |")
    print("| sum of p50s | " + " | ".join(f"{sum(v['p50'] for v in phases[c].values()):.3f}" for c in configs) + " |")


def mirror_of(reg):
    """The registry, with the harness image in it, as the node's mirror of ghcr.io (the node
    reaches this machine at its host-side address)."""
    reg.push(Path(stack.image_archives()[HARNESS]["archive"]), HARNESS)
    port = reg.url.rsplit(":", 1)[1]
    return lambda host: registry.containerd_mirror(f"{host}:{port}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=8, help="sessions per side (default 8; the demo's 4 per repetition)")
    ap.add_argument("--concurrency", type=int, default=2, help="sessions at once per side (default 2)")
    ap.add_argument("--configs", default="cold,gateway,proxy,gvisor",
                    help="what to measure, in order (default all): cold (the gateway, runc, the harness image pulled "
                         "from a registry of this machine by the first wave), gateway (the provider gateway, runc, the "
                         "image on the node), proxy (the egress proxy, runc), gvisor (the gateway, sessions in gVisor's "
                         "sandbox)")
    args = ap.parse_args()
    configs = args.configs.split(",")
    if not configs or not set(configs) <= set(CONFIGS):
        raise SystemExit(f"--configs: some of {', '.join(CONFIGS)}, not {args.configs!r}")
    if os.geteuid() != 0:
        raise SystemExit("bench/realnode.py starts a real node: run it as root")
    with tempfile.TemporaryDirectory(prefix="bench-realnode-") as tmp:
        work = Path(tmp)
        for d in ("node", "pki"):
            (work / d).mkdir()
        print("starting a registry, the real node, the provider and the bucket ...", flush=True)
        with registry.serve_registry("0.0.0.0", work / "registry") as reg, \
                stack.node_up(work / "node", mirror=mirror_of(reg)) as node, \
                stack.serve_provider(node, work / "pki") as provider, stack.serve_bucket(node) as (endpoint, _):
            def pulls() -> int:  # the harness's blob requests in the registry's access log
                return reg.log.read_text(errors="replace").count("/v2/probe-runner/harness/blobs/")

            measured = {c: measure(node, provider, endpoint, work / c, c, args.sessions, args.concurrency, pulls)
                        for c in configs}
    for config, (rows, _) in measured.items():
        report(config, rows)
    phase_table({c: phases for c, (_, phases) in measured.items()})
    if "gateway" in measured and "gvisor" in measured:
        runc, gvisor = (around(measured[c][1]) for c in ("gateway", "gvisor"))
        print(f"\ngVisor's overhead per session (ours; sums of the phases' p50s: creation -> harness started, "
              f"harness exited -> outcome journaled): {gvisor[0]:.2f} s and {gvisor[1]:.2f} s against runc's "
              f"{runc[0]:.2f} s and {runc[1]:.2f} s ({gvisor[0] / runc[0]:.2f}x, {gvisor[1] / runc[1]:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
