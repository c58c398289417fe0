"""The node half of a session pod on KWOK's simulated nodes.

KWOK schedules pods, reports their containers running and serves exec, but runs no container.
``SimNode`` plays the kubelet and container runtime for session pods, with the product's own
code: for every session pod bound to a node it makes host directories for the pod's volumes,
points KWOK's exec for the pod at them (so the controller's exec transfers run the real shell
commands against real files through the real API server), runs the pod's ``reader`` command
(``python3 -m runner.entrypoints.pod reader``) as a host process, and runs the ``harness`` container's
command under bubblewrap with the volumes bound at the pod's mount paths, and a file of its own
at /dev/termination-log. When the harness process exits, it reports the container terminated in
the pod's status with that file's text as its message, as a kubelet would.
Deleting the pod kills both processes.

``harness`` overrides the CLI executable: the real Claude Code CLI for recorder tests, or a
replay of a stream the real CLI produced for tests of scale and transport.

``Replay`` is the light node, for scale: no process per pod at all. Two Python processes per
pod (the reader, the harness's entry point) do not fit 500 pods at once on two cores, and at
that scale what is measured is the controller and the API server, not the pod. One thread of
SimNode plays every pod's reader and harness: once the controller's delivery (a real exec, as
every transfer stays) has marked the workspace delivered, the harness "starts"; the stream
grows in the capture volume over the session's seconds, as the reader writes what arrives;
then the reader's record is written as the reader writes it and the harness is reported
terminated.

The KWOK ``Exec`` object that points a pod's exec at its directories is created when the pod
is first seen, before it is scheduled, by one of WORKERS threads (a pod's events always go to
the same one, in order): KWOK answers an exec it has not yet seen the object for with "no exec
found". Done in the watch's own thread, one pod after another, it fell behind the controller
by over a hundred pods at 500 at once.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from kubernetes import client, watch

from runner import sandbox
from runner.clock import now as _reader_now
from runner.entrypoints.pod import DELIVERED_NAME, RECORD_NAME, STREAM_NAME, _write_atomic
from runner.executors.elf import elf_loader

REPO = Path(__file__).resolve().parents[2]
KWOK_GROUP, KWOK_VERSION = "kwok.x-k8s.io", "v1alpha1"
WORKERS = 8
SECRET_TTL_SECONDS = 2.0  # a Secret read serves the pods started within this long


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def as_in_pod(stream: bytes) -> bytes:
    """A stream the real CLI wrote under the local executor (its configuration in
    /session/config), as the CLI writes it in a session pod: there its configuration is in
    sandbox.CONFIG_DIR, under which it names its memory path (the transform refuses one
    outside it)."""
    return stream.replace(b"/session/config/", sandbox.CONFIG_DIR.encode() + b"/")


@dataclass(frozen=True)
class Replay:
    """The light node: every harness writes ``stream`` over ``seconds`` and exits 0."""
    stream: Path
    seconds: float


@dataclass
class _Pod:
    name: str
    uid: str
    root: Path
    procs: list[subprocess.Popen] = field(default_factory=list)
    started: bool = False  # its containers run (it was scheduled)
    harness_started: float | None = None
    harness_ended: float | None = None
    ended: dict[str, dict] = field(default_factory=dict)  # container -> its terminated state
    pod: dict = field(default_factory=dict)  # as first seen scheduled
    mounts: dict[str, dict[str, Path]] = field(default_factory=dict)  # per container, mount path -> host directory
    reader_env: dict[str, str] = field(default_factory=dict)  # the reader container's (and its exec's) environment
    capture: Path | None = None  # the light node: the capture volume's host directory
    written: int = 0  # the light node: stream bytes written so far
    run: tuple[int, str] | None = None  # the light node: the harness run's index in harness_runs, its start
    gone: bool = False  # deleted: nothing more is started for it


class SimNode:
    def __init__(self, api: client.ApiClient, namespace: str, root: Path, harness: list[str] | Replay,
                 harness_delay: float = 0.0, harness_binds: tuple[str, ...] = (), loader_exec_only: bool = True):
        self.api = api
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.root = root
        self.harness = harness
        self.harness_delay = harness_delay
        self.harness_binds = harness_binds  # host paths the harness override needs (read-only)
        self.loader_exec_only = loader_exec_only  # False: an image that forgot to make its loader execute-only
        self.pods: dict[str, _Pod] = {}
        self.created: dict[str, set[str]] = {}  # pod name -> every uid seen under it
        self.specs: dict[str, dict] = {}  # pod name -> its spec as first seen
        self.running_now = 0
        self.max_running = 0
        # pod name -> wall-clock (start, end) of each harness run, for the scale bench's latencies
        self.harness_runs: dict[str, list[tuple[float, float | None]]] = {}
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._light: dict[str, _Pod] = {}  # the light node's pods, by name
        self._workers = [ThreadPoolExecutor(1, thread_name_prefix=f"simnode-{i}") for i in range(WORKERS)]
        self._secrets: dict[str, tuple[float, dict[str, str]]] = {}
        if isinstance(harness, Replay):
            self._replay = harness.stream.read_bytes()
            self._replay_sha = "sha256:" + hashlib.sha256(self._replay).hexdigest()
            self._reports = ThreadPoolExecutor(8, thread_name_prefix="simnode-status")
            self._light_thread = threading.Thread(target=self._light_loop, daemon=True)
        # The "image": the package copied where the pod's uids can read it, run by the system
        # python3 (the pod's command names python3, resolved on the container's PATH).
        self.image = root / "image"
        shutil.copytree(REPO / "runner", self.image / "runner", ignore=shutil.ignore_patterns("__pycache__"))
        for d in (root, self.image):
            d.chmod(0o755)

    # ---- lifecycle ----------------------------------------------------------------------

    def __enter__(self) -> SimNode:
        self._thread.start()
        if isinstance(self.harness, Replay):
            self._light_thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for w in self._workers:
            w.shutdown()
        if isinstance(self.harness, Replay):
            self._light_thread.join()
            self._reports.shutdown()
        with self._lock:
            pods = list(self.pods.values())
        for p in pods:
            self._kill(p)

    def _watch(self) -> None:
        rv = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    lst = self.core.list_namespaced_pod(self.namespace)
                    rv = lst.metadata.resource_version
                    for pod in lst.items:
                        self._on(("ADDED", self.api.sanitize_for_serialization(pod)))
                for ev in watch.Watch().stream(self.core.list_namespaced_pod, self.namespace, resource_version=rv,
                                               timeout_seconds=30, deserialize=False):
                    obj = ev.get("raw_object") or ev["object"]
                    rv = obj["metadata"]["resourceVersion"]
                    self._on((ev["type"], obj))
                    if self._stop.is_set():
                        return
            except Exception as e:  # 410 and dropped watches: list again
                rv = None
                if not self._stop.is_set():
                    time.sleep(0.2)
                if "410" not in str(e):
                    self.errors.append(f"watch: {e}")

    def _on(self, event: tuple[str, dict]) -> None:
        kind, pod = event
        meta = pod["metadata"]
        name, uid = meta["name"], meta["uid"]
        if kind == "DELETED" or meta.get("deletionTimestamp"):
            with self._lock:
                p = self.pods.pop(name, None)
            if p is not None and p.uid == uid:
                p.gone = True
                self._submit(p, self._kill, p)
            return
        with self._lock:
            self.created.setdefault(name, set()).add(uid)
            self.specs.setdefault(name, pod["spec"])
            p = self.pods.get(name)
            new = p is None or p.uid != uid
            if new:
                p = self.pods[name] = _Pod(name, uid, self.root / uid)
            assert p is not None
            start = not p.started and bool((pod.get("spec") or {}).get("nodeName"))
            p.started = p.started or start
        if new:
            self._submit(p, self._prepare, p, pod)
        if start:
            self._submit(p, self._start, p, pod)

    def _submit(self, p: _Pod, step, *args) -> None:
        """Run a step of pod ``p`` in its worker, after its earlier steps; a pod deleted
        meanwhile starts nothing more, and a failure is kept in ``errors``."""
        def run() -> None:
            if p.gone and step != self._kill:
                return
            try:
                step(*args)
            except Exception as e:
                self.errors.append(f"{p.name}: {step.__name__.strip('_')}: {type(e).__name__}: {e}")

        try:
            self._workers[hash(p.name) % WORKERS].submit(run)
        except RuntimeError:  # shut down: an event the watch delivered after the exit
            if not self._stop.is_set():
                raise

    # ---- the pod's containers --------------------------------------------------------------

    def _dirs(self, p: _Pod, pod: dict) -> dict[str, dict[str, Path]]:
        """Per container, the host directory of each mount path. Volumes are made as the kubelet
        makes an emptyDir: mode 0777, group fsGroup with the set-group-id bit."""
        fs_group = (pod["spec"].get("securityContext") or {}).get("fsGroup", 0)
        out: dict[str, dict[str, Path]] = {}
        p.root.mkdir(parents=True, exist_ok=True)
        p.root.chmod(0o755)
        secrets = {v["name"]: v["secret"] for v in pod["spec"].get("volumes") or [] if "secret" in v}
        for c in pod["spec"]["containers"]:
            for m in c.get("volumeMounts") or []:
                d = p.root / "volumes" / m["name"]
                if not d.exists():
                    d.mkdir(parents=True)
                    os.chown(d, 0, fs_group)
                    d.chmod(0o2777)
                    (p.root / "volumes").chmod(0o755)
                    if m["name"] in secrets:
                        self._project_secret(secrets[m["name"]], d, fs_group)
                out.setdefault(c["name"], {})[m["mountPath"]] = d
        return out

    def _secret(self, name: str) -> dict[str, str]:
        at, value = self._secrets.get(name, (0.0, {}))
        if time.monotonic() - at < SECRET_TTL_SECONDS:
            return value
        try:
            data = self.core.read_namespaced_secret(name, self.namespace).data or {}
        except client.ApiException:
            return {}
        value = {k: base64.b64decode(v).decode() for k, v in data.items()}
        self._secrets[name] = (time.monotonic(), value)
        return value

    def _project_secret(self, vol: dict, d: Path, gid: int) -> None:
        data = self._secret(vol["secretName"])
        for item in vol.get("items") or [{"key": k, "path": k} for k in data]:
            if item["key"] in data:
                f = d / item["path"]
                f.write_text(data[item["key"]])
                os.chown(f, 0, gid)
                f.chmod(0o440)

    @staticmethod
    def _reader_env(pod: dict, mounts: dict[str, dict[str, Path]]) -> dict[str, str]:
        """The reader container's environment, its paths on this host (also its exec's)."""
        reader = next(c for c in pod["spec"]["containers"] if c["name"] == "reader")
        renv = {e["name"]: _host_path(e["value"], mounts["reader"]) for e in reader.get("env") or [] if "value" in e}
        return {**renv, "PATH": "/usr/bin:/bin"}

    def _prepare(self, p: _Pod, pod: dict) -> None:
        """The pod's volumes and its KWOK Exec object, as soon as the pod exists."""
        p.mounts = self._dirs(p, pod)
        p.reader_env = exec_env = self._reader_env(pod, p.mounts)
        self.custom.create_namespaced_custom_object(KWOK_GROUP, KWOK_VERSION, self.namespace, "execs", {
            "apiVersion": f"{KWOK_GROUP}/{KWOK_VERSION}", "kind": "Exec",
            "metadata": {"name": p.name, "namespace": self.namespace},
            "spec": {"execs": [{"containers": ["reader"], "local": {
                # No securityContext: KWOK resolves its uid through /etc/passwd, which has no
                # entry for the pod's uids; the exec runs as this host's user instead.
                "workDir": str(p.root), "envs": [{"name": k, "value": v} for k, v in exec_env.items()]}}]},
        })

    def _start(self, p: _Pod, pod: dict) -> None:
        """Its containers, once it is scheduled (after ``_prepare``, in the same worker)."""
        mounts, exec_env = p.mounts, p.reader_env
        containers = {c["name"]: c for c in pod["spec"]["containers"]}
        reader = containers["reader"]
        p.pod = pod
        if isinstance(self.harness, Replay):
            p.capture = Path(exec_env["PROBE_CAPTURE_DIR"])
            with self._lock:
                self._light[p.name] = p
            return
        # The product's reader: the reader container's command, under the container's uid.
        reader_proc = subprocess.Popen(
            [*_as_user(reader), *reader["command"]], env={**exec_env, "PYTHONPATH": str(self.image)},
            cwd=p.root, start_new_session=True, stdout=subprocess.DEVNULL, stderr=open(p.root / "reader.log", "wb"))
        p.procs.append(reader_proc)
        threading.Thread(target=self._watch_reader, args=(p, pod, reader_proc), daemon=True).start()
        threading.Thread(target=self._run_harness, args=(p, pod, containers["harness"], mounts["harness"]), daemon=True).start()

    def _watch_reader(self, p: _Pod, pod: dict, proc: subprocess.Popen) -> None:
        """The reader never ends by itself; if it dies, report it as a kubelet would."""
        code = proc.wait()
        if code >= 0:  # not killed because the pod went away
            try:
                self._report_terminated(p, pod, "reader", code)
            except Exception as e:
                self.errors.append(f"{p.name}: status: {type(e).__name__}: {e}")

    def _run_harness(self, p: _Pod, pod: dict, c: dict, mounts: dict[str, Path]) -> None:
        env = {e["name"]: e["value"] for e in c.get("env") or [] if "value" in e}
        for e in c.get("env") or []:  # as the kubelet does: secretKeyRef values from the Secret
            ref = (e.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                value = self._secret(ref["name"]).get(ref["key"])
                if value is not None:
                    env[e["name"]] = value
        env.pop("HTTPS_PROXY", None)  # no egress proxy on the simulated node: the provider is on loopback
        env["PYTHONPATH"] = str(self.image)
        argv = [*c["command"], *c.get("args", [])]
        sep = argv.index("--")
        argv = [*argv[:sep + 1], *self.harness, *argv[sep + 2:]]
        # --as-pid-1: the container's first process is its command, as in a pod (no bwrap init).
        bwrap = [*_as_user(c), "bwrap", "--die-with-parent", "--unshare-pid", "--as-pid-1", "--unshare-ipc", "--unshare-uts",
                 "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
        for name in ("bin", "sbin", "lib", "lib32", "lib64"):
            h = Path("/") / name
            if h.is_symlink():
                bwrap += ["--symlink", os.readlink(h), f"/{name}"]
            elif h.is_dir():
                bwrap += ["--ro-bind", str(h), f"/{name}"]
        # As the harness image does: the ELF loader execute-only, so every process of the
        # container is non-dumpable (runner.entrypoints.pod refuses to start the CLI otherwise).
        loader = elf_loader(shutil.which(self.harness[0]) or self.harness[0])
        loader_fd = os.open(loader, os.O_RDONLY)
        if self.loader_exec_only:
            bwrap += ["--perms", "0111", "--ro-bind-data", str(loader_fd), loader]
        bwrap += ["--proc", "/proc", "--dev", "/dev"]
        # As the kubelet does: a world-writable file the container's message is read from at its end.
        termination = p.root / "termination-log"
        termination.touch()
        termination.chmod(0o666)
        bwrap += ["--bind", str(termination), "/dev/termination-log"]
        for target, src in sorted(mounts.items()):
            bwrap += ["--bind", str(src), target]
        for extra in (str(self.image), *self.harness_binds):  # after the volumes: /tmp must not hide them
            bwrap += ["--ro-bind", extra, extra]
        bwrap += ["--chdir", c.get("workingDir", "/"), "--"]
        if self.harness_delay:
            time.sleep(self.harness_delay)
        with self._lock:
            self.running_now += 1
            self.max_running = max(self.max_running, self.running_now)
        p.harness_started = time.monotonic()
        run = self._ran(p.name)
        try:
            proc = subprocess.Popen(bwrap + argv, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                                    stderr=open(p.root / "harness.log", "wb"), pass_fds=(loader_fd,))
        finally:
            os.close(loader_fd)
        p.procs.append(proc)
        code = proc.wait()
        with self._lock:
            self.running_now -= 1
            self.harness_runs[p.name][run] = (self.harness_runs[p.name][run][0], time.time())
        p.harness_ended = time.monotonic()
        if code < 0:  # killed because the pod went away: a kubelet reports nothing more
            return
        try:
            self._report_terminated(p, pod, "harness", code)
        except Exception as e:
            self.errors.append(f"{p.name}: status: {type(e).__name__}: {e}")

    def _ran(self, name: str) -> int:
        """Note a harness start of pod ``name``; the index of the run."""
        with self._lock:
            runs = self.harness_runs.setdefault(name, [])
            runs.append((time.time(), None))
            return len(runs) - 1

    # ---- the light node ------------------------------------------------------------------------

    def _light_loop(self) -> None:
        """Every pod's reader and harness, in one thread: start each harness once its workspace
        is delivered, grow its stream, end it after Replay.seconds. A failure is kept in
        ``errors``, never swallowed, and the loop goes on with the other pods."""
        assert isinstance(self.harness, Replay)
        seconds, data = self.harness.seconds, self._replay
        while not self._stop.wait(0.1):
            with self._lock:
                pods = list(self._light.values())
            for p in pods:
                try:
                    assert p.capture is not None
                    if p.harness_started is None:
                        if not (p.capture / DELIVERED_NAME).exists():
                            continue
                        with self._lock:
                            self.running_now += 1
                            self.max_running = max(self.max_running, self.running_now)
                        p.harness_started = time.monotonic()
                        p.run = (self._ran(p.name), _reader_now())
                    done = min(1.0, (time.monotonic() - p.harness_started) / seconds) if seconds else 1.0
                    upto = len(data) if done >= 1.0 else int(len(data) * done)
                    if upto > p.written:
                        with open(p.capture / STREAM_NAME, "ab") as f:
                            f.write(data[p.written:upto])
                        p.written = upto
                    if done >= 1.0:
                        self._light_end(p)
                except Exception as e:
                    with self._lock:
                        mine = self._light.pop(p.name, None) is p
                    if mine:  # not a pod deleted (its directories with it) while this ran
                        self.errors.append(f"{p.name}: light node: {type(e).__name__}: {e}")

    def _light_end(self, p: _Pod) -> None:
        """The stream has ended: the reader's record, as the reader writes it, then the harness
        reported terminated (by a pool, so one slow status patch holds up no other pod)."""
        assert p.capture is not None
        harness_uid = next(c for c in p.pod["spec"]["containers"] if c["name"] == "harness")["securityContext"]["runAsUser"]
        assert p.run is not None
        index, started_at = p.run
        record = {"bytes": len(self._replay), "sha256": self._replay_sha, "eof": True, "peer_uid": harness_uid,
                  "refused_peers": [], "started_at": started_at, "ended_at": _reader_now()}
        _write_atomic(p.capture / RECORD_NAME, json.dumps(record, sort_keys=True).encode())
        with self._lock:
            self._light.pop(p.name, None)
            self.running_now -= 1
            self.harness_runs[p.name][index] = (self.harness_runs[p.name][index][0], time.time())
        p.harness_ended = time.monotonic()

        def report() -> None:
            try:
                self._report_terminated(p, p.pod, "harness", 0)
            except Exception as e:
                self.errors.append(f"{p.name}: status: {type(e).__name__}: {e}")

        self._reports.submit(report)

    def _report_terminated(self, p: _Pod, pod: dict, container: str, code: int) -> None:
        now = _now()
        terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error", "startedAt": now, "finishedAt": now}
        message = p.root / "termination-log" if container == "harness" else None
        if message is not None and message.exists() and message.stat().st_size:
            terminated["message"] = message.read_text()[:4096]  # the kubelet's limit
        with self._lock:
            p.ended[container] = {"terminated": terminated}
            ended = dict(p.ended)
        statuses = []
        for c in pod["spec"]["containers"]:
            running = c["name"] not in ended
            statuses.append({"name": c["name"], "image": c["image"], "imageID": "", "ready": running,
                             "restartCount": 0, "started": running,
                             "state": ended.get(c["name"], {"running": {"startedAt": now}})})
        self.core.patch_namespaced_pod_status(p.name, self.namespace, {"status": {"containerStatuses": statuses}})

    def _kill(self, p: _Pod) -> None:
        with self._lock:
            if self._light.pop(p.name, None) is not None and p.harness_started is not None:
                self.running_now -= 1  # a light harness the pod's deletion ended
        for proc in p.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in p.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        try:
            self.custom.delete_namespaced_custom_object(KWOK_GROUP, KWOK_VERSION, self.namespace, "execs", p.name)
        except client.ApiException:
            pass
        logs = self.root / "logs" / p.name
        logs.mkdir(parents=True, exist_ok=True)
        for f in ("reader.log", "harness.log"):
            if (p.root / f).exists():
                shutil.copyfile(p.root / f, logs / f)
        shutil.rmtree(p.root, ignore_errors=True)

    def logs(self, pod: str = "*") -> str:
        """The reader and harness logs of every pod that went (or of ``pod``), for failure messages."""
        out = []
        for f in sorted((self.root / "logs").glob(f"{pod}/*.log")):
            text = f.read_text(errors="replace").strip()
            if text:
                out.append(f"== {f.parent.name}/{f.name}\n{text[-2000:]}")
        return "\n".join(out)


def _as_user(container: dict) -> list[str]:
    sc = container["securityContext"]
    return ["setpriv", f"--reuid={sc['runAsUser']}", f"--regid={sc['runAsGroup']}", "--clear-groups"]


def _host_path(value: str, mounts: dict[str, Path]) -> str:
    for target, src in mounts.items():
        if value == target or value.startswith(target + "/"):
            return str(src) + value[len(target):]
    return value
