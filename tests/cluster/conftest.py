"""A real Kubernetes control plane for tests/cluster/, without Docker.

``build.sh`` builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl,
kwok and kwokctl from Go modules (cached; see README.md). The session fixture
``kube_cluster`` starts them with ``kwokctl --runtime binary`` on 127.0.0.1: admission,
scheduling, watches and API errors are real; nodes are KWOK fake nodes, and pod logs and
exec are served by the kwok-controller according to KWOK ``Logs``/``Exec`` objects.

The build runs while pytest collects (a cold build takes about 11 minutes here, longer than
the per-test timeout), only when tests of this directory are selected. A failed build fails
every test here; nothing is ever skipped.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from teardown import sigterm_as_interrupt  # tests/teardown.py (tests/ is on the path: tests/conftest.py)

from tests.support.builds import CONTROL_PLANE, build_while_collecting
from tests.support.waiting import until

HERE = Path(__file__).resolve().parent

KWOK_GROUP = "kwok.x-k8s.io"
KWOK_VERSION = "v1alpha1"
# The KWOK kinds enabled as CRDs (not as static config, so each test can add and remove its
# own rules through the API while the cluster runs).
KWOK_CRDS = ("Logs", "ClusterLogs", "Exec", "ClusterExec")

# Registry of clusters started by this fixture, so that a later session can end the
# processes of a session that was killed before its teardown (by their pids, checked
# against their command lines).
REGISTRY = Path(tempfile.gettempdir()) / "probe-runner-kwok-clusters"


# --------------------------------------------------------------------------------------
# Build (during collection, outside any per-test timeout)
# --------------------------------------------------------------------------------------

def run_build() -> Path:
    """The control plane's binaries (build.sh; at once on a warm cache), or BuildFailed."""
    return CONTROL_PLANE.run()


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: list[pytest.Item]) -> None:
    build_while_collecting(config, items, HERE, [CONTROL_PLANE], note=", a cold build takes ~11 min")


# --------------------------------------------------------------------------------------
# Helpers for later tests
# --------------------------------------------------------------------------------------


def cri_log_line(content: str, stream: str = "stdout", ts: datetime | None = None,
                 partial: bool = False) -> str:
    """One line of the CRI container log format that kubelet (and KWOK) read:
    ``<RFC3339Nano timestamp> <stdout|stderr> <F|P> <content>\\n``."""
    if stream not in ("stdout", "stderr"):
        raise ValueError(f"stream must be stdout or stderr, not {stream!r}")
    if "\n" in content:
        raise ValueError("one CRI log line holds no newline; split the content first")
    ts = ts or datetime.now(UTC)
    stamp = ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return f"{stamp} {stream} {'P' if partial else 'F'} {content}\n"


def write_cri_log(path: Path | str, lines: Iterable[str | tuple[str, str]], append: bool = False) -> Path:
    """Write (or append) plain text lines as a CRI-format log file. An item is either the
    text (stdout) or ``(stream, text)``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a" if append else "w", encoding="utf-8") as fh:
        for item in lines:
            stream, text = ("stdout", item) if isinstance(item, str) else item
            fh.write(cri_log_line(text, stream))
        fh.flush()
        os.fsync(fh.fileno())
    return path


@dataclass
class KubeCluster:
    """A running kwokctl cluster. All processes listen on 127.0.0.1 only."""

    name: str
    bin_dir: Path
    workdir: Path
    kubeconfig: Path
    env: dict[str, str] = field(repr=False)
    _api_client: Any = field(default=None, repr=False)

    # Also reachable from tests without importing conftest.
    write_cri_log = staticmethod(write_cri_log)
    cri_log_line = staticmethod(cri_log_line)

    # ---- plumbing ---------------------------------------------------------------------

    @property
    def cluster_dir(self) -> Path:
        return self.workdir / "clusters" / self.name

    @property
    def server(self) -> str:
        return self.kubectl("config", "view", "--minify", "-o",
                            "jsonpath={.clusters[0].cluster.server}").stdout.strip()

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl against this cluster; raise on failure when ``check``."""
        cmd = [str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args]
        proc = subprocess.run(cmd, input=input, capture_output=True, text=True,
                              env=self.env, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}{proc.stdout}"
            )
        return proc

    def apply(self, obj: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> None:
        """kubectl apply of one object or a list of objects (as dicts)."""
        items = [obj] if isinstance(obj, Mapping) else list(obj)
        doc = {"apiVersion": "v1", "kind": "List", "items": items}
        self.kubectl("apply", "-f", "-", input=json.dumps(doc))

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` for this cluster (one per cluster)."""
        if self._api_client is None:
            from kubernetes import config as k8s_config

            self._api_client = k8s_config.new_client_from_config(config_file=str(self.kubeconfig))
        return self._api_client

    def audit_events(self, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
        """The API server's audit events (one per request, at its completion; see AUDIT_POLICY)
        logged from byte ``offset`` of its log on, and the offset to read on from. The log is
        rotated at 100 MB into audit-TIME.log files, never changed after: ``offset`` counts
        their bytes, oldest first, then the current log's."""
        logs = self.cluster_dir / "logs"
        data, base = b"", 0
        for path in [*sorted(logs.glob("audit-*.log")), logs / "audit.log"]:
            size = path.stat().st_size
            if base + size > offset:
                with open(path, "rb") as f:
                    f.seek(max(0, offset - base))
                    data += f.read()
            base += size
        end = data.rfind(b"\n") + 1  # a line still being written is read next time
        return [json.loads(line) for line in data[:end].splitlines() if line.strip()], offset + end

    def audit_offset(self) -> int:
        """Where the audit events logged from now on begin (for ``audit_events``)."""
        logs = self.cluster_dir / "logs"
        done = sum(p.stat().st_size for p in logs.glob("audit-*.log"))
        with open(logs / "audit.log", "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - (1 << 16)))
            tail = f.read()
        return done + size - len(tail) + tail.rfind(b"\n") + 1

    def component_logs(self, lines: int = 40) -> str:
        out = []
        for f in sorted((self.cluster_dir / "logs").glob("*.log")):
            tail = f.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"==> {f.name} <==\n" + "\n".join(tail))
        return "\n".join(out)

    # ---- namespaces, nodes --------------------------------------------------------------

    def create_namespace(self, name: str, timeout: float = 30) -> str:
        """Create a namespace and wait for its ``default`` ServiceAccount (created by the
        real controller-manager; pods cannot be admitted before it exists)."""
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        until(lambda: self.kubectl("-n", name, "get", "serviceaccount", "default", check=False).returncode == 0,
              timeout, f"namespace {name}'s default ServiceAccount", interval=0.2)
        return name

    def add_nodes(self, n: int, prefix: str = "kwok-node", labels: Mapping[str, str] | None = None,
                  taints: Sequence[Mapping[str, str]] = (), cpu: str = "32",
                  memory: str = "256Gi", pods: str = "110", ephemeral_storage: str = "500Gi", wait: bool = True,
                  timeout: float = 60) -> list[str]:
        """Create ``n`` KWOK fake nodes ``<prefix>-0 .. <prefix>-(n-1)`` and (by default)
        wait until they are Ready. They carry no taint unless given, so ordinary pods
        schedule onto them."""
        names = [f"{prefix}-{i}" for i in range(n)]
        resources = {"cpu": cpu, "memory": memory, "pods": pods, "ephemeral-storage": ephemeral_storage}
        self.apply([
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {"kwok.x-k8s.io/node": "fake"},
                    "labels": {"type": "kwok", "kubernetes.io/hostname": name,
                               "kubernetes.io/os": "linux", **(labels or {})},
                },
                "spec": {"taints": list(taints)} if taints else {},
                "status": {"allocatable": resources, "capacity": resources},
            }
            for name in names
        ])
        if wait:
            self.kubectl("wait", "--for=condition=Ready", f"--timeout={int(timeout)}s",
                         *[f"node/{n}" for n in names], timeout=timeout + 10)
        return names

    # ---- KWOK: logs and exec --------------------------------------------------------------

    def _kwok_object(self, kind: str, name: str, namespace: str | None, spec: dict) -> dict:
        meta = {"name": name}
        if namespace is not None:
            meta["namespace"] = namespace
        return {"apiVersion": f"{KWOK_GROUP}/{KWOK_VERSION}", "kind": kind, "metadata": meta, "spec": spec}

    def serve_logs(self, pod: str, namespace: str, logs_file: Path | str,
                   containers: Sequence[str] | None = None,
                   previous_logs_file: Path | str | None = None, wait: bool = True,
                   timeout: float = 30) -> None:
        """Make the log of ``pod`` (its ``containers``, or all when None) be served from
        ``logs_file``, which must be in CRI log format (see ``write_cri_log``). A KWOK
        ``Logs`` object is named after its pod. ``follow`` works: lines appended to the file
        are streamed. With ``wait`` and a Running pod, returns once the kwok-controller
        serves it."""
        entry: dict[str, Any] = {"logsFile": str(logs_file)}
        if containers:
            entry["containers"] = list(containers)
        if previous_logs_file is not None:
            entry["previousLogsFile"] = str(previous_logs_file)
        self.apply(self._kwok_object("Logs", pod, namespace, {"logs": [entry]}))
        if wait:
            args = ["-n", namespace, "logs", pod, "--limit-bytes=1"]
            if containers:
                args += ["-c", containers[0]]
            self._wait_served(args, timeout, f"logs of {namespace}/{pod}")

    def serve_exec(self, pod: str, namespace: str, work_dir: Path | str,
                   env: Mapping[str, str] | None = None, containers: Sequence[str] | None = None,
                   run_as_user: int | None = None, run_as_group: int | None = None,
                   wait: bool = True, timeout: float = 30) -> None:
        """Make ``exec`` into ``pod`` run the command ON THIS HOST, in ``work_dir``, with the
        kwok-controller's environment (that of the pytest process that started the cluster)
        plus ``env``. With ``wait`` and a Running pod, returns once it is served (probing
        with ``true``)."""
        local: dict[str, Any] = {"workDir": str(work_dir)}
        if env:
            local["envs"] = [{"name": k, "value": v} for k, v in env.items()]
        if run_as_user is not None or run_as_group is not None:
            local["securityContext"] = {
                k: v for k, v in (("runAsUser", run_as_user), ("runAsGroup", run_as_group)) if v is not None
            }
        target: dict[str, Any] = {"local": local}
        if containers:
            target["containers"] = list(containers)
        self.apply(self._kwok_object("Exec", pod, namespace, {"execs": [target]}))
        if wait:
            args = ["-n", namespace, "exec", pod]
            if containers:
                args += ["-c", containers[0]]
            self._wait_served([*args, "--", "true"], timeout, f"exec in {namespace}/{pod}")

    def serve_cluster_logs(self, name: str, logs_file: Path | str, *,
                           match_namespaces: Sequence[str] = (), match_names: Sequence[str] = (),
                           containers: Sequence[str] | None = None) -> None:
        """A ``ClusterLogs`` rule: pods selected by namespace and/or name (empty: all pods)
        serve ``logs_file``. A per-pod ``Logs`` object wins over it."""
        entry: dict[str, Any] = {"logsFile": str(logs_file)}
        if containers:
            entry["containers"] = list(containers)
        self.apply(self._kwok_object("ClusterLogs", name, None, {
            "selector": self._selector(match_namespaces, match_names), "logs": [entry]}))

    def serve_cluster_exec(self, name: str, work_dir: Path | str, *,
                           env: Mapping[str, str] | None = None,
                           match_namespaces: Sequence[str] = (), match_names: Sequence[str] = (),
                           containers: Sequence[str] | None = None) -> None:
        """A ``ClusterExec`` rule: exec into the selected pods runs on this host in ``work_dir``."""
        local: dict[str, Any] = {"workDir": str(work_dir)}
        if env:
            local["envs"] = [{"name": k, "value": v} for k, v in env.items()]
        target: dict[str, Any] = {"local": local}
        if containers:
            target["containers"] = list(containers)
        self.apply(self._kwok_object("ClusterExec", name, None, {
            "selector": self._selector(match_namespaces, match_names), "execs": [target]}))

    @staticmethod
    def _selector(namespaces: Sequence[str], names: Sequence[str]) -> dict[str, Any]:
        sel: dict[str, Any] = {}
        if namespaces:
            sel["matchNamespaces"] = list(namespaces)
        if names:
            sel["matchNames"] = list(names)
        return sel

    def _wait_served(self, args: list[str], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            proc = self.kubectl(*args, check=False, timeout=timeout)
            if proc.returncode == 0:
                return
            last = proc.stderr.strip()
            # Nothing to wait for on a pod that does not run (yet): the caller checks.
            if "is waiting to start" in last or ("not found" in last and "pods" in last):
                return
            time.sleep(0.3)
        raise AssertionError(f"{what} not served after {timeout}s: {last}")


# --------------------------------------------------------------------------------------
# Start / stop
# --------------------------------------------------------------------------------------


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has ended already
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _cluster_pids(cluster_dir: Path) -> list[int]:
    """The component pids recorded in ``cluster_dir/pids`` whose command line still names
    ``cluster_dir`` (so a reused pid is never hit)."""
    pids = []
    for pid_file in (cluster_dir / "pids").glob("*.pid"):
        try:
            pid = int(pid_file.read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except (OSError, ValueError):
            continue
        if str(cluster_dir) in cmdline:
            pids.append(pid)
    return pids


def _end_pids(pids: Sequence[int], grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds, each pid given (ours only)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_pid_alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if _pid_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _process_start(pid: int) -> str | None:
    """When ``pid`` started (clock ticks since boot), which tells a process from a later one
    given the same pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _reap_orphans() -> None:
    """End clusters whose owning pytest process is gone (killed before its teardown). A
    cluster this process runs is kept: a module may start one of its own beside the session's."""
    if not REGISTRY.is_dir():
        return
    for entry in REGISTRY.glob("*.json"):
        try:
            info = json.loads(entry.read_text())
            owner = int(info["owner_pid"])
            cluster_dir = Path(info["cluster_dir"])
        except (OSError, ValueError, KeyError):
            entry.unlink(missing_ok=True)
            continue
        started = info.get("owner_start")
        if _pid_alive(owner) and (started == _process_start(owner) if started else owner != os.getpid()):
            continue
        _end_pids(_cluster_pids(cluster_dir), grace=2.0)
        entry.unlink(missing_ok=True)


# Every request, once, at its completion, with who sent it (user, user agent), what it did
# (verb, resource, subresource, object) and the answer's code: what the tests and the scale
# bench attribute API load by. No bodies.
AUDIT_POLICY = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy",
                "omitStages": ["RequestReceived", "ResponseStarted"], "rules": [{"level": "Metadata"}]}


def _kwokctl_config(bin_dir: Path, audit_policy: Path,
                    apiserver_args: Mapping[str, str] | None = None) -> dict[str, Any]:
    config: dict[str, Any] = {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokctlConfiguration",
        "options": {
            "runtime": "binary",
            # Every component listens on loopback only (kwokctl's default is 0.0.0.0).
            "bindAddress": "127.0.0.1",
            "etcdBinary": str(bin_dir / "etcd"),
            "kubeApiserverBinary": str(bin_dir / "kube-apiserver"),
            "kubeControllerManagerBinary": str(bin_dir / "kube-controller-manager"),
            "kubeSchedulerBinary": str(bin_dir / "kube-scheduler"),
            "kwokControllerBinary": str(bin_dir / "kwok"),
            "kubectlBinary": str(bin_dir / "kubectl"),
            "enableCRDs": list(KWOK_CRDS),
            "quietPull": True,
            "kubeAuditPolicy": str(audit_policy),
        },
    }
    if apiserver_args:  # more kube-apiserver flags, after kwokctl's (the last value of a flag wins)
        config["componentsPatches"] = [{"name": "kube-apiserver", "extraArgs": [
            {"key": k, "value": v, "override": False} for k, v in apiserver_args.items()]}]
    return config


def _kwokctl(bin_dir: Path, env: dict[str, str], config: Path, *args: str,
             timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(bin_dir / "kwokctl"), "-c", str(config), *args],
                          capture_output=True, text=True, env=env, timeout=timeout, check=False)


@pytest.fixture(scope="session")
def kube_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeCluster]:
    bin_dir = CONTROL_PLANE.built()
    with start_cluster(bin_dir, tmp_path_factory.mktemp("kwok")) as cluster:
        yield cluster


@contextmanager
def start_cluster(bin_dir: Path, base: Path,
                  apiserver_args: Mapping[str, str] | None = None) -> Iterator[KubeCluster]:
    """Start a kwokctl cluster from the built binaries, in ``base``; delete it on exit.
    A plain context manager, so bench/ starts the same control plane as the tests.
    ``apiserver_args``: more kube-apiserver flags, e.g. {"max-requests-inflight": "30"}."""
    _reap_orphans()
    base.mkdir(parents=True, exist_ok=True)
    name = f"pr-{os.getpid()}-{secrets.token_hex(3)}"
    workdir = base / "work"
    kubeconfig = base / "kubeconfig"
    config = base / "kwokctl.yaml"
    audit_policy = base / "audit-policy.json"
    audit_policy.write_text(json.dumps(AUDIT_POLICY))
    config.write_text(json.dumps(_kwokctl_config(bin_dir, audit_policy, apiserver_args), indent=2))
    env = dict(os.environ)
    env.update({
        "KWOK_WORKDIR": str(workdir),
        # kwokctl looks kubectl up on PATH before kubectlBinary: make it find ours.
        "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        "KUBECONFIG": str(kubeconfig),
    })
    cluster = KubeCluster(name=name, bin_dir=bin_dir, workdir=workdir,
                          kubeconfig=kubeconfig, env=env)

    REGISTRY.mkdir(parents=True, exist_ok=True)
    reg_entry = REGISTRY / f"{name}.json"
    reg_entry.write_text(json.dumps({"owner_pid": os.getpid(), "owner_start": _process_start(os.getpid()),
                                     "cluster_dir": str(cluster.cluster_dir)}))

    # A SIGTERM (a CI timeout, `kill`) still deletes the cluster (tests/teardown.py).
    on_term = contextlib.ExitStack()
    on_term.enter_context(sigterm_as_interrupt())

    try:
        started = time.monotonic()
        proc = _kwokctl(bin_dir, env, config, "create", "cluster", "--name", name,
                        "--kubeconfig", str(kubeconfig), "--wait", "90s", "--timeout", "150s")
        if proc.returncode != 0:
            raise AssertionError(
                f"kwokctl create cluster failed ({proc.returncode}):\n{proc.stderr[-4000:]}\n"
                f"{cluster.component_logs() if cluster.cluster_dir.exists() else ''}"
            )
        # kwokctl's --wait covers /readyz and the nodes it creates; also make sure the API
        # answers the kubeconfig we hand out and that the KWOK kinds are served.
        deadline = time.monotonic() + 60
        while True:
            ready = cluster.kubectl("get", "--raw", "/readyz", check=False)
            kinds = cluster.kubectl("api-resources", f"--api-group={KWOK_GROUP}", "-o", "name",
                                    check=False)
            if ready.returncode == 0 and all(
                f"{k.lower()}" in kinds.stdout for k in ("logs", "clusterlogs", "execs", "clusterexecs")
            ):
                break
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"cluster {name} not ready: {ready.stderr}{kinds.stderr}\n{cluster.component_logs()}")
            time.sleep(0.3)
        cluster.startup_seconds = time.monotonic() - started  # type: ignore[attr-defined]
        yield cluster
    finally:
        try:
            if cluster._api_client is not None:
                cluster._api_client.close()
        except Exception:  # noqa: BLE001 - teardown must go on
            pass
        pids = _cluster_pids(cluster.cluster_dir)  # read before kwokctl removes the dir
        try:
            _kwokctl(bin_dir, env, config, "delete", "cluster", "--name", name,
                     "--kubeconfig", str(kubeconfig), timeout=60)
        finally:
            # Whatever kwokctl did, no component of this cluster outlives the session.
            _end_pids([p for p in pids if _pid_alive(p)])
            reg_entry.unlink(missing_ok=True)
            on_term.close()
