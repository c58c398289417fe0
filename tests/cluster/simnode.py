"""The node half of a session pod on KWOK's simulated nodes.

KWOK schedules pods, reports their containers running and serves exec, but runs no container.
``SimNode`` plays the kubelet and container runtime for session pods, with the product's own
code: for every session pod bound to a node it makes host directories for the pod's volumes,
points KWOK's exec for the pod at them (so the controller's exec transfers run the real shell
commands against real files through the real API server), runs the pod's ``reader`` command
(``python3 -m runner.entrypoints.pod reader``) as a host process, and runs the ``harness`` container's
command under bubblewrap with the volumes bound at the pod's mount paths. When the harness
process exits, it reports the container terminated in the pod's status, as a kubelet would.
Deleting the pod kills both processes.

``harness`` overrides the CLI executable: the real Claude Code CLI for recorder tests, or a
replay of a stream the real CLI produced for tests of scale and transport.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from kubernetes import client, watch

from runner.executors.elf import elf_loader

REPO = Path(__file__).resolve().parents[2]
KWOK_GROUP, KWOK_VERSION = "kwok.x-k8s.io", "v1alpha1"


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Pod:
    name: str
    uid: str
    root: Path
    procs: list[subprocess.Popen] = field(default_factory=list)
    harness_started: float | None = None
    harness_ended: float | None = None
    ended: dict[str, dict] = field(default_factory=dict)  # container -> its terminated state


class SimNode:
    def __init__(self, api: client.ApiClient, namespace: str, root: Path, harness: list[str],
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
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        # The "image": the package copied where the pod's uids can read it, run by the system
        # python3 (the pod's command names python3, resolved on the container's PATH).
        self.image = root / "image"
        shutil.copytree(REPO / "runner", self.image / "runner", ignore=shutil.ignore_patterns("__pycache__"))
        for d in (root, self.image):
            d.chmod(0o755)

    # ---- lifecycle ----------------------------------------------------------------------

    def __enter__(self) -> SimNode:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
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
                self._kill(p)
            return
        with self._lock:
            self.created.setdefault(name, set()).add(uid)
            self.specs.setdefault(name, pod["spec"])
            known = self.pods.get(name)
            if known is not None and known.uid == uid:
                return
            if not (pod.get("spec") or {}).get("nodeName"):
                return
            p = _Pod(name, uid, self.root / uid)
            self.pods[name] = p
        try:
            self._start(p, pod)
        except Exception as e:
            self.errors.append(f"{name}: start: {type(e).__name__}: {e}")

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
        try:
            data = self.core.read_namespaced_secret(name, self.namespace).data or {}
        except client.ApiException:
            return {}
        return {k: base64.b64decode(v).decode() for k, v in data.items()}

    def _project_secret(self, vol: dict, d: Path, gid: int) -> None:
        data = self._secret(vol["secretName"])
        for item in vol.get("items") or [{"key": k, "path": k} for k in data]:
            if item["key"] in data:
                f = d / item["path"]
                f.write_text(data[item["key"]])
                os.chown(f, 0, gid)
                f.chmod(0o440)

    def _start(self, p: _Pod, pod: dict) -> None:
        mounts = self._dirs(p, pod)
        containers = {c["name"]: c for c in pod["spec"]["containers"]}
        reader = containers["reader"]
        renv = {e["name"]: _host_path(e["value"], mounts["reader"]) for e in reader.get("env") or [] if "value" in e}
        exec_env = {**renv, "PATH": "/usr/bin:/bin"}
        self.custom.create_namespaced_custom_object(KWOK_GROUP, KWOK_VERSION, self.namespace, "execs", {
            "apiVersion": f"{KWOK_GROUP}/{KWOK_VERSION}", "kind": "Exec",
            "metadata": {"name": p.name, "namespace": self.namespace},
            "spec": {"execs": [{"containers": ["reader"], "local": {
                # No securityContext: KWOK resolves its uid through /etc/passwd, which has no
                # entry for the pod's uids; the exec runs as this host's user instead.
                "workDir": str(p.root), "envs": [{"name": k, "value": v} for k, v in exec_env.items()]}}]},
        })
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
        try:
            proc = subprocess.Popen(bwrap + argv, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                                    stderr=open(p.root / "harness.log", "wb"), pass_fds=(loader_fd,))
        finally:
            os.close(loader_fd)
        p.procs.append(proc)
        code = proc.wait()
        with self._lock:
            self.running_now -= 1
        p.harness_ended = time.monotonic()
        if code < 0:  # killed because the pod went away: a kubelet reports nothing more
            return
        try:
            self._report_terminated(p, pod, "harness", code)
        except Exception as e:
            self.errors.append(f"{p.name}: status: {type(e).__name__}: {e}")

    def _report_terminated(self, p: _Pod, pod: dict, container: str, code: int) -> None:
        now = _now()
        with self._lock:
            p.ended[container] = {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                                 "startedAt": now, "finishedAt": now}}
            ended = dict(p.ended)
        statuses = []
        for c in pod["spec"]["containers"]:
            running = c["name"] not in ended
            statuses.append({"name": c["name"], "image": c["image"], "imageID": "", "ready": running,
                             "restartCount": 0, "started": running,
                             "state": ended.get(c["name"], {"running": {"startedAt": now}})})
        self.core.patch_namespaced_pod_status(p.name, self.namespace, {"status": {"containerStatuses": statuses}})

    def _kill(self, p: _Pod) -> None:
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
