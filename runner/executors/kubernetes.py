"""The Kubernetes executor (runner/executors/base.py's contract): one pod per session attempt,
driven from a watch cache; it talks to the cluster only through runner/k8s/.

For each session: create the pod (its name is deterministic, so a second create after a
restart is a 409 and the live pod is adopted), wait on the cache until the reader runs,
journal the start, deliver the sealed workspace by exec, wait until the harness container has
terminated, then bring the stream out in short exec transfers that resume by offset and are
verified against the reader's own byte count and sha256, and bring back the workspace as a
tar. The pod is deleted only after the campaign has journaled the outcome (``finish``).

A pod that never started (unschedulable past the start timeout, an image that does not pull)
is deleted and created again: nothing was spent. A pod lost after the start (deleted,
evicted, its node gone) may have spent: the session is journaled interrupted with what was
captured so far, and is never run again by itself.
"""

from __future__ import annotations

import io
import json
import logging
import os
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from runner import digest
from runner.entrypoints.pod import OPEN_NETWORK_EXIT, TIMEOUT_EXIT, UNCONFINED_EXIT, deliver_argv, fetch_argv, is_delivered_argv, pack_argv, record_argv
from runner.errors import NotStarted, SessionInterrupted, SessionRefused, UserError
from runner.executors.base import CaptureRecord, Live
from runner.executors.capture import collect_workspace
from runner.k8s import manifests, names, podstate
from runner.k8s.api import ExecError, Kube
from runner.k8s.confinement import ConfinementMonitor
from runner.k8s.manifests import WORKSPACE
from runner.k8s.podcache import PodCache
from runner.layout import SessionKeys
from runner.ledger import now
from runner.plan import Plan, Probe
from runner.seal import SealedWorkspace
from runner.settings import Settings
from runner.store import Store

log = logging.getLogger(__name__)

CONFINEMENT_PROSE = (
    "Each session ran in its own Kubernetes pod (kubernetes executor): non-root, read-only root "
    "filesystem, all capabilities dropped, seccomp RuntimeDefault, no service-account token; its "
    "only network route was meant to be the egress proxy, which allows CONNECT to the provider host alone. "
    "Its standard output was a Unix socket held by a reader in another container under another uid."
)
START_ATTEMPTS = 3
_RECORD_WAIT_SECONDS = 60.0


@dataclass
class KubernetesExecutor:
    settings: Settings
    kube: Kube
    name: str = "kubernetes"
    confinement: str = CONFINEMENT_PROSE
    harness_version: str | None = None
    cache: PodCache | None = None
    proxy_url: str | None = None  # HTTPS_PROXY of session pods, by address (set by preflight)
    monitor: ConfinementMonitor | None = None  # the canary checks (started by prepare)

    def __post_init__(self) -> None:
        k = self.settings.kube
        self._create_slots = threading.BoundedSemaphore(k.create_concurrency)
        self._delete_slots = threading.BoundedSemaphore(k.delete_concurrency)

    # ---- campaign hooks --------------------------------------------------------------------

    def preflight(self) -> None:
        """Refuse to start where session pods would not be confined as promised."""
        from runner.k8s.policy import foreign_policies_selecting, own_policy_names, proxy_service_name, session_proxy_url

        k = self.settings.kube
        probe_labels = names.session_labels(k.instance, "preflight", "preflight", "preflight", 1)
        own = own_policy_names(self.settings)
        self._foreign = lambda: foreign_policies_selecting(self.kube.network_policies(), probe_labels, own)
        foreign = self._foreign()
        if foreign:
            raise UserError(
                f"namespace {k.namespace}: NetworkPolicy {', '.join(sorted(foreign))} also selects session pods; "
                "allow rules add up, so a session could reach more than the egress proxy. Remove it or narrow its podSelector.")
        service = proxy_service_name(self.settings)
        self.proxy_url = session_proxy_url(self.settings, self.kube.service_address(service)[0] if service else None)

    def prepare(self, plan: Plan, final: set[Live]) -> set[Live]:
        """Start the watch; delete leftover pods of attempts that are already final; return the
        (probe, session, attempt) of live pods, which ``run`` adopts."""
        k = self.settings.kube
        sel = names.selector_string(names.selector(k.instance, names.SESSION_COMPONENT, plan.campaign))
        self.cache = PodCache(self.kube, sel)
        self.cache.start()
        live = set()
        for name in self.cache.names():
            pod = self.cache.get(name)
            if pod is None:
                continue
            key = _session_of(pod)
            if key in final or key is None:
                self._delete(name)
            else:
                live.add(key)
        if k.canary_enabled:
            assert self.proxy_url is not None, "preflight() first"
            self.monitor = ConfinementMonitor(self.settings, self.kube, plan.campaign, self.proxy_url, self._foreign)
            self.monitor.start()
        return live

    def halted(self) -> str | None:
        """Why no further session may start (a failed confinement check), or None."""
        return self.monitor.halted if self.monitor is not None else None

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()
        if self.cache is not None:
            self.cache.stop()

    # ---- one session -----------------------------------------------------------------------

    def run(self, plan: Plan, probe: Probe, sealed: SealedWorkspace, scratch: Path, store: Store, keys: SessionKeys,
            also_collect: Callable[[SessionKeys, str], set[str]], started: Callable[[], None]) -> CaptureRecord:
        assert self.cache is not None and self.proxy_url is not None, "preflight() and prepare() first"
        manifest = manifests.session_pod(self.settings, plan, probe.id, keys.session, keys.attempt, probe.task,
                                         self.proxy_url)
        name = manifest["metadata"]["name"]
        checks_before = self.monitor.count() if self.monitor is not None else 0
        self._start_pod(name, manifest)
        if self._exec(name, is_delivered_argv(), check=False).code != 0:
            started()
            self._exec(name, deliver_argv(), stdin=_workspace_tar(sealed.path, self.settings.kube.harness_uid))
        started_at = now()
        limit = self.settings.harness.timeout_seconds + self.settings.kube.start_timeout_seconds
        end = self.cache.wait(name, lambda p: _harness_end(p), timeout=limit)
        spool = scratch / "stream.spool"
        if not end or end[0] == "lost":
            reason = end[1] if end else f"the harness did not end within {limit:g} s"
            detail = self._salvage(name, spool, store, keys)
            raise SessionInterrupted(reason, {"reason": reason, **detail})
        term = end[1]
        if term.get("exitCode") == OPEN_NETWORK_EXIT:
            raise SessionRefused("the session pod's network policy was not in force: the API server was still "
                                 "reachable from it when the harness was to start; the CLI did not run")
        if term.get("exitCode") == UNCONFINED_EXIT:
            raise SessionRefused("the harness container could not be confined: the CLI's ELF loader is readable, so the "
                                 "session could have written into its stream (the harness image must make it execute-only); "
                                 "the CLI did not run")
        record = self._reader_record(name)
        if record is None:
            reason = f"the capture reader recorded no end of the stream within {_RECORD_WAIT_SECONDS:g} s of the harness's end"
            raise SessionInterrupted(reason, {"reason": reason, **self._salvage(name, spool, store, keys)})
        self._fetch(name, spool, 0, record["bytes"])
        stream = _upload_verified(spool, store, keys.stream, record)
        ended_at = now()
        collected = self._collect(name, scratch, sealed, store, keys, also_collect)
        exit_code = term.get("exitCode")
        pod = self.cache.get(name) or {}
        return {
            "executor": self.name,
            "confinement": self.confinement,
            "network_confined": True,
            # The canary checks from the one in force when this session started to its end;
            # empty where kube.canary_enabled is false (the transcript then says so).
            "confinement_checks": self.monitor.since(checks_before) if self.monitor is not None else [],
            "pod": {"name": name, "namespace": self.settings.kube.namespace, "node": pod.get("spec", {}).get("nodeName")},
            "harness": {"image": self.settings.kube.harness_image, "image_id": podstate.image_id(pod, "harness"),
                        "version": self.harness_version,
                        "argv": manifests.harness_args(plan, self.settings),
                        "allowed_tools": self.settings.harness.allowed_tools,
                        "disallowed_tools": self.settings.harness.disallowed_tools},
            "started_at": started_at,
            "ended_at": ended_at,
            "exit_code": exit_code,
            "timed_out": exit_code == TIMEOUT_EXIT,
            "stream": stream,
            "reader": record,
            "workspace": WORKSPACE,
            "config_dir": manifests.CONFIG_DIR,
            "host_skills": [],
            "artifacts": collected,
        }

    def finish(self, keys: SessionKeys) -> None:
        """The outcome is journaled: the pod may go."""
        self._delete(manifests.pod_name(keys.campaign, keys.probe, keys.session, keys.attempt))

    # ---- steps -------------------------------------------------------------------------------

    def _start_pod(self, name: str, manifest: dict) -> None:
        assert self.cache is not None
        timeout = self.settings.kube.start_timeout_seconds
        why = "no attempt made"
        for _ in range(START_ATTEMPTS):
            with self._create_slots:
                self.kube.create_pod(manifest)
            self.cache.wait(name, lambda p: p is not None, timeout=60)
            start = self.cache.wait(name, _startup, timeout=timeout) or Startup(
                "failed", podstate.unschedulable(self.cache.get(name) or {}) or f"not running after {timeout:g} s")
            if start.kind == "running":
                return
            if start.kind == "gone":
                raise NotStarted(start.why)
            why = start.why
            self._delete(name, grace=0)
            self.cache.wait(name, lambda p: p is None, timeout=120)
        raise NotStarted(f"pod {name} did not start: {why}")

    def _exec(self, pod: str, argv: list[str], stdin: bytes | None = None, check: bool = True):
        k = self.settings.kube
        for attempt in self.kube.retry.retrying():  # the API's policy: an exec is an API call
            with attempt:
                res = self.kube.exec(pod, "reader", argv, stdin=stdin, timeout=k.transfer_timeout_seconds)
        if check and res.code != 0:
            raise ExecError(f"exec in {pod}: {argv[-1] if argv else ''} exited {res.code}: {res.stderr.decode(errors='replace')[-300:]}")
        return res

    def _reader_record(self, pod: str) -> dict | None:
        deadline = time.monotonic() + _RECORD_WAIT_SECONDS
        while time.monotonic() < deadline:
            out = self._exec(pod, record_argv()).stdout
            if out.strip():
                return json.loads(out)
            time.sleep(0.2)
        return None

    def _fetch(self, pod: str, spool: Path, offset: int, total: int | None) -> int:
        """Append the stream from ``offset`` to the spool; every chunk is its own short exec, so a
        broken transfer is repeated from where the spool ends. Returns the spool's size."""
        chunk = self.settings.kube.transfer_chunk_bytes
        with open(spool, "ab") as f:
            f.truncate(offset)
            while total is None or offset < total:
                want = chunk if total is None else min(chunk, total - offset)
                data = self._exec(pod, fetch_argv(offset, want)).stdout
                if len(data) > want:
                    raise ExecError(f"exec in {pod}: fetch returned {len(data)} bytes for {want}")
                if not data:
                    if total is None:
                        break
                    raise ExecError(f"exec in {pod}: the stream ends at {offset} bytes, the reader recorded {total}")
                f.write(data)
                offset += len(data)
            f.flush()
            os.fsync(f.fileno())
        return offset

    def _salvage(self, pod: str, spool: Path, store: Store, keys: SessionKeys) -> dict:
        """Keep what can still be read of a stream that cannot be proven complete."""
        got = 0
        try:
            got = self._fetch(pod, spool, 0, None)
        except Exception as e:  # the pod is gone or going: keep what arrived
            got = spool.stat().st_size if spool.exists() else 0
            log.warning("%s: salvage of the stream stopped after %d bytes: %s", pod, got, e)
        if not got:
            return {"stream": None}
        kept = _upload(spool, store, keys.partial_stream)
        return {"stream": None, "partial_stream": kept}

    def _collect(self, pod: str, scratch: Path, sealed: SealedWorkspace, store: Store, keys: SessionKeys,
                 also_collect) -> dict:
        tar_bytes = self._exec(pod, pack_argv()).stdout
        out = scratch / "collected"
        skipped = _extract_safely(tar_bytes, out)
        if skipped:
            log.warning("%s: %d workspace member(s) not unpacked (outside the workspace or through a link): %s",
                        pod, len(skipped), ", ".join(skipped[:10]))
        return collect_workspace(out, sealed.manifest, also_collect(keys, WORKSPACE), store, keys)

    def _delete(self, name: str, grace: int | None = None) -> None:
        with self._delete_slots:
            self.kube.delete_pod(name, grace)


@dataclass(frozen=True)
class Startup:
    """How a new pod's start ended: ``running`` (its reader runs), ``failed`` (it cannot start:
    an image or configuration error; it is deleted and created again) or ``gone`` (deleted
    before it started: the session is not started, nothing was spent)."""

    kind: Literal["running", "failed", "gone"]
    why: str = ""


def _startup(pod: dict | None) -> Startup | None:
    """A pod's start as far as it went, or None while it may still start."""
    if pod is None:
        return Startup("gone", "the pod was deleted before it started")
    if podstate.running(pod, "reader"):
        return Startup("running")
    why = podstate.never_started(pod)
    return Startup("failed", why) if why else None


def _harness_end(pod: dict | None):
    if pod is not None:
        term = podstate.terminated(pod, "harness")
        if term is not None:
            return ("done", term)
    why = podstate.lost(pod)
    return ("lost", why) if why else None


def _session_of(pod: dict) -> tuple[str, str, int] | None:
    ann = pod["metadata"].get("annotations") or {}
    try:
        return ann[names.PROBE], ann[names.SESSION], int(ann[names.ATTEMPT])
    except (KeyError, ValueError):
        return None


def _workspace_tar(root: Path, gid: int) -> bytes:
    """The sealed workspace as a tar, group-writable for the harness (fsGroup ``gid``)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for p in sorted(root.rglob("*")):
            info = tar.gettarinfo(str(p), arcname=p.relative_to(root).as_posix())
            info.uid, info.gid, info.uname, info.gname = 0, gid, "", ""
            if info.isdir():
                info.mode = 0o2775
                tar.addfile(info)
            elif info.isfile():
                info.mode = 0o664
                with open(p, "rb") as f:
                    tar.addfile(info, f)
            elif info.issym():
                tar.addfile(info)
    return buf.getvalue()


def _extract_safely(data: bytes, dest: Path) -> list[str]:
    """Directories, regular files and links inside ``dest``, from a tar the session pod made
    (untrusted). A link is recreated as a link and never followed: a member whose path runs
    through a link an earlier member made (``a -> /outside``, then ``a/x``) is skipped, and a
    member that replaces a link replaces the link, not what it points at. Returns the names
    skipped. (tarfile's extraction filters do the same from Python 3.11.4 on; the runner image's
    Debian python3 is 3.11.2, so one check here serves every interpreter.)"""
    dest.mkdir(parents=True, exist_ok=True)
    root = Path(os.path.realpath(dest))
    skipped: list[str] = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for m in tar:
            rel = Path(os.path.normpath(m.name))
            if rel.is_absolute() or rel.parts[:1] == ("..",) or str(rel) == ".":
                skipped.append(m.name)
                continue
            target = root / rel
            # realpath resolves the links already unpacked: the member's directory must stay inside.
            if not Path(os.path.realpath(target.parent)).is_relative_to(root):
                skipped.append(m.name)
                continue
            if m.isdir():
                if not target.is_symlink():
                    target.mkdir(parents=True, exist_ok=True)
                continue
            if not (m.isfile() or m.issym()):
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_symlink() or target.is_file():
                target.unlink()
            if m.issym():
                os.symlink(m.linkname, target)
                continue
            src = tar.extractfile(m)
            assert src is not None
            with open(target, "xb") as f:  # O_EXCL: never through a link
                while chunk := src.read(1 << 20):
                    f.write(chunk)
    return skipped


def _upload(spool: Path, store: Store, key: str) -> dict:
    with open(spool, "rb") as f, store.writer(key) as w:
        while chunk := f.read(1 << 20):
            w.write(chunk)
        w.commit()
    return {"key": key, "bytes": w.size, "sha256": w.sha256}


def _upload_verified(spool: Path, store: Store, key: str, record: dict) -> dict:
    size, sha = spool.stat().st_size, digest.of_file(spool)
    if size != record["bytes"] or sha != record["sha256"]:
        raise ExecError(f"stream {key}: fetched {size} bytes {sha}, the reader recorded {record['bytes']} bytes {record['sha256']}")
    if store.exists(key):  # a restart after the upload: the same bytes are there already
        return {"key": key, "bytes": size, "sha256": sha}
    return _upload(spool, store, key)
