"""The Kubernetes executor (runner/executors/base.py's contract): one pod per session attempt,
driven from a watch cache; it talks to the cluster only through runner/k8s/.

For each session: create the pod (its name is deterministic, so a second create after a
restart is a 409 and the live pod is adopted), wait on the cache until the reader runs,
journal the start, deliver the sealed workspace by exec, wait until the harness container has
terminated (following the stream meanwhile, for salvage), then bring out the reader's record,
the stream and the workspace packed as a tar in one exec (more only past a chunk: transfers
resume by offset), each verified against the reader's own byte count and sha256 or the
packing's. The pod is deleted only after the campaign has journaled the outcome (``finish``).
So a session costs the API server a create, two execs, a follow per
kube.stream_poll_seconds, the meter's Lease read (through the gateway) and a delete.

A session's run is a coroutine on the campaign's event loop (runner/aio.py): its waits (for its
pod to start, for its harness to end between follows, for the meter to settle) hold no
thread; each request and each transfer runs on the loop's bounded pool of threads.

A pod that never started (unschedulable past the start timeout, an image that does not pull)
is deleted and created again: nothing was spent. A pod lost after the start (deleted,
evicted, its node gone) may have spent: the session is journaled interrupted with what was
captured so far, and is never run again by itself.
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import shutil
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from runner import digest
from runner.aio import blocking
from runner.clock import now
from runner.entrypoints.pod import (
    OPEN_NETWORK_EXIT,
    PACKED_NAME,
    STREAM_NAME,
    TIMEOUT_EXIT,
    UNCONFINED_EXIT,
    Finish,
    Packed,
    ReaderRecord,
    deliver_argv,
    fetch_argv,
    finish_argv,
    harness_report,
    read_finish,
)
from runner.errors import NotStarted, SessionInterrupted, SessionRefused, UserError
from runner.executors.base import (
    Artifacts,
    CaptureRecord,
    Halt,
    Live,
    Phases,
    Remedies,
    Slot,
    StreamRecord,
)
from runner.executors.capture import collect_workspace
from runner.gateway import tokens
from runner.gateway.cluster import SETTLE_SECONDS, meters_of, settled, total
from runner.k8s import jobs, manifests, names, podstate
from runner.k8s.api import ExecError, ExecResult, Kube, QuotaExceeded
from runner.k8s.confinement import ConfinementMonitor, fix_key
from runner.k8s.podcache import Pod, PodCache
from runner.layout import SessionKeys
from runner.plan import Plan, Probe
from runner.sandbox import CONFIG_DIR, WORKSPACE
from runner.seal import SealedWorkspace
from runner.settings import KubeSettings, Settings
from runner.share import WHOLE, Share
from runner.store import Store

log = logging.getLogger(__name__)

CONFINEMENT_PROSE = (
    "Each session ran in its own Kubernetes pod (kubernetes executor): non-root, read-only root "
    "filesystem, all capabilities dropped, seccomp RuntimeDefault, no service-account token; its "
    "only network route was meant to be {route}. "
    "Its standard output was a Unix socket held by a reader in another container under another uid."
)
ROUTE_PROSE = {
    True: "the provider gateway, which alone held the provider key and served the session's own token while its "
          "pod ran (the session held no credential)",
    False: "the egress proxy, which allows CONNECT to the provider host alone (the session read the provider "
           "credentials)",
}
START_ATTEMPTS = 3
_RECORD_WAIT_SECONDS = 60.0
_FINISH_WAIT_SECONDS = 10.0  # how long one finishing exec waits in the pod for the reader's record


def kubernetes_remedies(campaign: str, kube: KubeSettings) -> Remedies:
    """A submitted campaign is run again by a new controller Job (its ended one deleted first:
    a Job of that name exists) or the campaign's resume Job."""
    again = (f"delete the campaign's ended controller Job (`kubectl delete job {jobs.job_name(campaign)}`) and "
             "`probe-runner submit` it again")
    return Remedies(campaign, again, "--job", fix_key(kube), again_after_refusal=True)


@dataclass
class KubernetesExecutor:
    settings: Settings
    kube: Kube
    name: str = "kubernetes"
    confinement: str = CONFINEMENT_PROSE
    harness_version: str | None = None
    cache: PodCache | None = None
    route: manifests.Route | None = None  # the session pods' one route, by address, without a token (set by preflight)
    token_secret: bytes | None = None  # what the gateway checks session tokens with (set by preflight)
    monitor: ConfinementMonitor | None = None  # the canary checks (started by prepare)
    waiting_room: int = 0  # kube.waiting_pods
    share: str | None = None  # the name of the split campaign's share this run owns (set by prepare; None: whole)
    # Names of other NetworkPolicies that also select session pods (set by preflight).
    foreign_policies: Callable[[], list[str]] = lambda: []

    def __post_init__(self) -> None:
        k = self.settings.kube
        self.waiting_room = k.waiting_pods
        self._create_slots = asyncio.Semaphore(k.create_concurrency)  # the campaign's event loop's (runner/aio.py)
        self._follows = asyncio.Semaphore(max(1, self.settings.io_threads // 2))  # follows in flight (_follow)
        self._delete_slots = threading.BoundedSemaphore(k.delete_concurrency)
        self.observed = PodMilestones()
        self.confinement = CONFINEMENT_PROSE.format(route=ROUTE_PROSE[self.settings.gateway.enabled])

    # ---- campaign hooks --------------------------------------------------------------------

    def preflight(self) -> None:
        """Refuse to start where session pods would not be confined as promised."""
        from runner.k8s.policy import foreign_policies_selecting, own_policy_names, route_service_name, session_route_url

        k = self.settings.kube
        probe_labels = names.session_labels(k.instance, "preflight", "preflight", "preflight", 1)
        own = own_policy_names(self.settings)
        self.foreign_policies = lambda: foreign_policies_selecting(self.kube.network_policies(), probe_labels, own)
        foreign = self.foreign_policies()
        if foreign:
            raise UserError(
                f"namespace {k.namespace}: NetworkPolicy {', '.join(sorted(foreign))} also selects session pods; "
                "allow rules add up, so a session could reach more than its one route. Remove it or narrow its podSelector.")
        service = route_service_name(self.settings)
        url = session_route_url(self.settings, self.kube.service_address(service)[0] if service else None)
        if self.settings.gateway.enabled:
            secret = self.settings.gateway.token_secret
            self.token_secret = (secret.get_secret_value().encode() if secret is not None
                                 else self.kube.secret_value(k.gateway_secret, "token-secret"))
            self.route = manifests.Route(url)
        else:
            self.route = manifests.Route(self.settings.provider.base_url, proxy=url)

    def prepare(self, plan: Plan, final: set[Live], share: Share = WHOLE) -> set[Live]:
        """Start the watch (of this share's pods alone, where the campaign is split); delete
        leftover pods of attempts that are already final; return the (probe, session, attempt)
        of live pods, which ``run`` adopts."""
        k = self.settings.kube
        self.share = None if share.whole else share.name
        sel = names.selector_string(names.selector(k.instance, names.SESSION_COMPONENT, plan.campaign, self.share))
        self.cache = PodCache(self.kube, sel, self.observed.saw)
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
            assert self.route is not None, "preflight() first"
            self.monitor = ConfinementMonitor(self.settings, self.kube, plan.campaign, self.route, self.foreign_policies,
                                              self.token_secret, share)
            self.monitor.start()
        return live

    def remedies(self, campaign: str) -> Remedies:
        return kubernetes_remedies(campaign, self.settings.kube)

    def halted(self) -> Halt | None:
        """Why no further session may start (a failed confinement check, or its key check), or None."""
        return None if self.monitor is None else self.monitor.halted

    def close(self) -> None:
        log.info("kubernetes: %s", self.kube.tally.summary() or "no requests")
        if self.monitor is not None:
            self.monitor.stop()
        if self.cache is not None:
            self.cache.stop()

    # ---- one session -----------------------------------------------------------------------

    async def run(self, plan: Plan, probe: Probe, sealed: SealedWorkspace, scratch: Path, store: Store, keys: SessionKeys,
                  also_collect: Callable[[SessionKeys, str], set[str]], started: Callable[[], None],
                  slot: Slot) -> CaptureRecord:
        """Run one session in its pod. Its phases: the pod watch's observations of the pod this
        run created (none of a pod adopted after a restart: the watch did not see it start),
        the delivery's end, the entry point's and the reader's own stamps, and the collection's."""
        assert self.cache is not None and self.route is not None, "preflight() and prepare() first"
        manifest = manifests.session_pod(self.settings, plan, probe.id, keys.session, keys.attempt, probe.task,
                                         self._route_of(keys, plan.model), self.share)
        name = manifest["metadata"]["name"]
        try:
            return await self._run(name, manifest, plan, sealed, scratch, store, keys, also_collect, started, slot)
        finally:
            self.observed.forget(name)

    async def _run(self, name: str, manifest: dict[str, Any], plan: Plan, sealed: SealedWorkspace, scratch: Path,
                   store: Store, keys: SessionKeys, also_collect: Callable[[SessionKeys, str], set[str]],
                   started: Callable[[], None], slot: Slot) -> CaptureRecord:
        assert self.cache is not None
        checks_before = self.monitor.count() if self.monitor is not None else 0
        created = await self._start_pod(name, manifest, slot)
        del manifest  # about 30 KB as Python objects, no longer needed: held to the session's end, 15 MB at 500 at once
        await blocking(started)  # journaled before the delivery, which lets the CLI start (a no-op for an adopted attempt)
        answer = (await blocking(self._deliver, name, sealed.path)).stdout
        # A pod this run created was delivered now, though a retried exec may answer "already";
        # one it adopted, only if this exec did it (else an earlier run did: no stamp).
        delivered = now() if created or answer.strip() == b"delivered" else None
        started_at = now()
        limit = self.settings.harness.timeout_seconds + self.settings.kube.start_timeout_seconds
        spool = scratch / "stream.spool"
        spool.unlink(missing_ok=True)
        end, fetched = await self._follow(name, spool, limit)
        if end is None or end.lost is not None:
            reason = end.lost if end is not None and end.lost is not None else f"the harness did not end within {limit:g} s"
            detail = await blocking(self._salvage, name, spool, store, keys)
            raise SessionInterrupted(reason, {"reason": reason, **detail})
        term = end.terminated
        if term.get("exitCode") == OPEN_NETWORK_EXIT:
            raise SessionRefused("the session pod's network policy was not in force: the API server was still "
                                 "reachable from it when the harness was to start; the CLI did not run")
        if term.get("exitCode") == UNCONFINED_EXIT:
            said = (term.get("message") or "").strip().splitlines()  # the entry point's refusal (FallbackToLogsOnError)
            raise SessionRefused("the harness container could not be confined: the CLI's ELF loader is readable, so the CLI "
                                 "would run dumpable, and no Yama ptrace_scope was shown to keep the session out of its "
                                 "memory and stream, so the session could have written into its stream (the harness image "
                                 "must make the loader execute-only, or the pod run under gVisor); the CLI did not run"
                                 + (f"; the entry point said: {said[-1][:500]}" if said else ""))
        done = await blocking(self._finish, name, fetched)
        if done is None:
            reason = f"the capture reader recorded no end of the stream within {_RECORD_WAIT_SECONDS:g} s of the harness's end"
            raise SessionInterrupted(reason, {"reason": reason, **await blocking(self._salvage, name, spool, store, keys)})
        finish, pack_messages = done
        record = finish.record
        stream = await blocking(self._store_stream, name, spool, finish, store, keys)
        ended_at = now()
        phases: Phases = {**self.observed.take(name)}  # type: ignore[typeddict-item]  # POD_MILESTONES are Phases' keys
        if delivered is not None:
            phases["workspace_delivered"] = delivered
        if (report := harness_report(term.get("message"))) is not None:
            phases["harness_started"], phases["policy_wait_seconds"] = report["harness_started"], report["policy_wait_seconds"]
        if "first_reply_at" in record:
            phases["first_reply"] = record["first_reply_at"]
        phases["harness_exited"], phases["stream_collected"] = record["ended_at"], ended_at
        artifacts = await blocking(self._collect, name, scratch, sealed, store, keys, also_collect, finish.packed, pack_messages)
        metered = await self._meter(name) if self.token_secret is not None else None
        phases["artifacts_collected"] = now()
        exit_code = term.get("exitCode")
        pod = self.cache.get(name) or {}
        capture: CaptureRecord = {
            "executor": self.name,
            "confinement": self.confinement,
            "network_confined": True,
            # The canary checks from the one in force when this session started to its end;
            # empty where kube.canary_enabled is false (the transcript then says so).
            "confinement_checks": self.monitor.since(checks_before) if self.monitor is not None else [],
            "pod": {"name": name, "namespace": self.settings.kube.namespace, "node": pod.get("spec", {}).get("nodeName"),
                    "owner": self.settings.kube.owner_job,
                    # the RuntimeClass it ran under, as its manifest named it (None: the node's default)
                    "runtime_class": self.settings.kube.runtime_class},
            "harness": {"image": self.settings.kube.harness_image, "image_id": podstate.image_id(pod, "harness"),
                        "version": self.harness_version,
                        "argv": manifests.harness_args(plan, self.settings),
                        "allowed_tools": self.settings.harness.allowed_tools,
                        "disallowed_tools": self.settings.harness.disallowed_tools},
            "started_at": started_at,
            "ended_at": ended_at,
            "exit_code": exit_code,
            "timed_out": exit_code == TIMEOUT_EXIT,
            "oom_killed": term.get("reason") == "OOMKilled",
            "stream": stream,
            "reader": record,
            "workspace": WORKSPACE,
            "config_dir": CONFIG_DIR,
            "host_skills": [],
            "artifacts": artifacts.artifacts,
            "phases": phases,
        }
        if artifacts.not_collected is not None:
            capture["artifacts_not_collected"] = artifacts.not_collected
        if artifacts.warnings:
            capture["artifacts_warnings"] = artifacts.warnings
        if metered is not None:
            capture["gateway"] = metered
        return capture

    def _route_of(self, keys: SessionKeys, model: str) -> manifests.Route:
        """The route of one attempt's pod: through the gateway, with a token of this attempt that
        expires with the pod's deadline (the gateway serves it only while the pod runs, and
        its harness has not ended)."""
        assert self.route is not None
        if self.token_secret is None:
            return self.route
        b = self.settings.budget
        claims = tokens.Claims(keys.campaign, keys.probe, keys.session, keys.attempt,
                               int(time.time()) + manifests.session_deadline(self.settings),
                               None if b.session_usd is None else str(b.session_usd), str(b.call_usd), model)
        return manifests.Route(self.route.base_url, token=tokens.mint(self.token_secret, claims))

    async def _meter(self, pod: str) -> dict[str, Any]:
        """The gateways' meter of the attempt (its Lease, runner/gateway/cluster.py), once each
        gateway has settled it (given back what it held beyond the spend of the ended
        harness); past SETTLE_SECONDS one that has not counts at what it holds."""
        deadline = time.monotonic() + SETTLE_SECONDS
        pause = 0.05  # doubling to 0.5 s: a gateway settles within a moment of the harness's end, as its watch shows it
        while True:
            annotations = await blocking(self.kube.lease_annotations, pod)
            meters = meters_of(annotations or {})
            if settled(meters) or time.monotonic() > deadline:
                return total(meters)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.5)

    def finish(self, keys: SessionKeys) -> None:
        """The outcome is journaled: the pod may go (and with it the attempt's token and Lease)."""
        self._delete(manifests.pod_name(self.settings.kube.instance, keys.campaign, keys.probe, keys.session, keys.attempt))

    # ---- steps -------------------------------------------------------------------------------

    async def _start_pod(self, name: str, manifest: dict[str, Any], slot: Slot) -> bool:
        """Create the pod and wait for its reader to run; what it waits for meanwhile (the
        scheduler's message, an image pull, a quota) is noted on ``slot`` for ``status``.
        A pod that waits past kube.waiting_grace_seconds steps aside (``slot.aside()``) so
        another session can start, and takes a slot back once it runs, before anything can
        spend; one that gets none within its start timeout is deleted, and the session waits
        for a slot without a pod before it creates another (its deadline counts from creation).
        True where this run created the pod, False where it found it (adopted)."""
        assert self.cache is not None
        k = self.settings.kube
        timeout = k.start_timeout_seconds
        why = "no attempt made"

        def started(pod: Pod | None) -> Startup | None:
            start = _startup(pod)
            if start is None:
                slot.note(podstate.waiting(pod), podstate.waiting_phase(pod))
            return start

        attempts = 0
        while attempts < START_ATTEMPTS:
            attempts += 1
            asked = time.monotonic()
            self.observed.track(name)  # before the create: the watch may tell of the pod before the request returns
            made = await self._create(manifest, timeout, slot)
            self.observed.stamp(name, "pod_created")
            await self.cache.wait(name, lambda p: p is not None, timeout=60)
            start = await self.cache.wait(name, started, timeout=max(0.0, asked + k.waiting_grace_seconds - time.monotonic()))
            if start is None and slot.aside():
                log.info("pod %s waits to start; its slot goes to another session meanwhile", name)
            start = start or await self.cache.wait(name, started, timeout=max(0.0, asked + timeout - time.monotonic())) or Startup(
                "failed", f"not running after {timeout:g} s: {podstate.waiting(self.cache.get(name))}")
            if start.kind == "running":
                if not slot.held:
                    slot.note("running, waiting for a running session to end (concurrency)", "workspace_delivered")
                if await slot.back(asked + timeout - time.monotonic()):
                    slot.note(None)
                    return made
                log.info("pod %s ran but no slot came free within its start timeout: deleted, a new one when a slot is free", name)
                await blocking(self._delete, name, grace=0)
                await self.cache.wait(name, lambda p: p is None, timeout=120)
                slot.note("waiting for a slot", "pod_created")
                await slot.back(None)
                attempts -= 1  # the pod did start: not a failed attempt
                continue
            if start.kind == "gone":
                slot.note(f"did not start: {start.why}")
                raise NotStarted(start.why)
            why = start.why
            await blocking(self._delete, name, grace=0)
            await self.cache.wait(name, lambda p: p is None, timeout=120)
        slot.note(f"did not start: {why}")
        raise NotStarted(f"pod {name} did not start: {why}")

    async def _create(self, manifest: dict[str, Any], timeout: float, slot: Slot) -> bool:
        """Create the pod (False: it exists already); a namespace quota that refuses it now may admit it once other
        sessions end, so that refusal is waited out (up to ``timeout``, aside after the
        grace), not a failure."""
        first = time.monotonic()
        deadline = first + timeout
        while True:
            try:
                async with self._create_slots:
                    return await blocking(self.kube.create_pod, manifest)
            except QuotaExceeded as e:
                if time.monotonic() > deadline:
                    why = f"the namespace's quota refused the pod for {timeout:g} s: {e}"
                    slot.note(f"did not start: {why}")
                    raise NotStarted(why) from None
                if time.monotonic() > first + self.settings.kube.waiting_grace_seconds:
                    slot.aside()
                slot.note(f"quota: {e}", "pod_created")
                await asyncio.sleep(5)

    def _deliver(self, pod: str, workspace: Path) -> ExecResult:
        """Hand the sealed workspace to the pod's reader, which lets the harness start."""
        return self._exec(pod, deliver_argv(), stdin=_workspace_tar(workspace, self.settings.kube.harness_uid))

    def _store_stream(self, pod: str, spool: Path, finish: Finish, store: Store, keys: SessionKeys) -> StreamRecord:
        """The ended session's stream: the rest past what the follow spooled and the finishing
        exec brought, fetched, verified against the reader's record, stored."""
        self._fetch(pod, spool, finish.offset, finish.record["bytes"], head=finish.stream)
        return _upload_verified(spool, store, keys.stream, finish.record)

    def _exec(self, pod: str, argv: list[str], stdin: bytes | None = None) -> ExecResult:
        k = self.settings.kube
        for attempt in self.kube.retry.retrying():  # the API's policy: an exec is an API call
            with attempt:
                self.kube.tally.add("exec transfers", "exec", attempt.retry_state.attempt_number)
                res = self.kube.exec(pod, "reader", argv, stdin=stdin, timeout=k.transfer_timeout_seconds)
        if res.code != 0:
            raise ExecError(f"exec in {pod}: {argv[-1] if argv else ''} exited {res.code}: {res.stderr.decode(errors='replace')[-300:]}")
        return res

    def _finish(self, pod: str, fetched: int) -> tuple[Finish, str] | None:
        """The ended session's record, its stream from ``fetched`` (what the follow spooled)
        and its packed workspace, by finish_argv (the packing's messages with them), each
        exec waiting in the pod for the record; None where the reader wrote none within
        _RECORD_WAIT_SECONDS."""
        k = self.settings.kube
        deadline = time.monotonic() + _RECORD_WAIT_SECONDS
        wait = min(_FINISH_WAIT_SECONDS, k.transfer_timeout_seconds / 2)  # an exec's wait within its limit
        while True:
            res = self._exec(pod, finish_argv(fetched, k.transfer_chunk_bytes, k.collect_max_bytes, wait))
            try:
                done = read_finish(res.stdout)
            except ValueError as e:
                raise ExecError(f"exec in {pod}: finishing the session said {res.stdout[:200]!r}: {e}") from None
            if done is not None:
                return done, res.stderr.decode(errors="replace")
            if time.monotonic() >= deadline:
                return None

    def _fetch(self, pod: str, spool: Path, offset: int, total: int | None, name: str = STREAM_NAME,
               head: bytes = b"") -> int:
        """Append the capture volume's file ``name`` (the stream, or the packed workspace) from
        ``offset`` to the spool, starting with ``head`` where its first bytes came already
        (finish_argv's); every chunk is its own short exec, so a broken transfer is
        repeated from where the spool ends. Returns the spool's size.

        With ``total`` None (the stream of a running session) it reads to the file's end as it
        is then: a chunk shorter than asked is the end. Chasing a stream that grows while it is
        read cost an exec per few bytes the CLI wrote, 54 per session at 100 sessions at once
        (bench/scale.py); the next poll reads on from there."""
        chunk = self.settings.kube.transfer_chunk_bytes
        with open(spool, "ab") as f:
            f.truncate(offset)
            f.write(head)
            offset += len(head)
            while total is None or offset < total:
                want = chunk if total is None else min(chunk, total - offset)
                data = self._exec(pod, fetch_argv(offset, want, name)).stdout
                if len(data) > want:
                    raise ExecError(f"exec in {pod}: fetch returned {len(data)} bytes for {want}")
                if not data:
                    if total is None:
                        break
                    raise ExecError(f"exec in {pod}: the stream ends at {offset} bytes, the reader recorded {total}")
                f.write(data)
                offset += len(data)
                if total is None and len(data) < want:
                    break
            f.flush()
            os.fsync(f.fileno())
        return offset

    async def _follow(self, pod: str, spool: Path, limit: float) -> tuple[HarnessEnd | None, int]:
        """Wait for the harness's end (at most ``limit`` seconds), fetching the stream into the
        spool every kube.stream_poll_seconds meanwhile: a pod evicted or deleted mid-session
        (its volumes go with it) then loses at most that much of the stream, not all of it.
        Returns the end (None on timeout) and the bytes spooled so far. Follows in flight take
        at most half the run's io_threads: a lost node's pods stall theirs up to the exec's
        deadlines, and the other half stays for every session's start, end and journal. A
        follow waits its turn (sessions started together poll together), looking for the
        harness's end each second meanwhile, so a turn never delays the session's end."""
        assert self.cache is not None
        deadline = time.monotonic() + limit
        fetched = 0
        while True:
            end = await self.cache.wait(pod, _harness_end, timeout=max(0.0, min(self.settings.kube.stream_poll_seconds,
                                                                                deadline - time.monotonic())))
            if end or time.monotonic() >= deadline:
                return end, fetched
            while True:  # a follow slot (the rest of the threads are the starts', ends' and journal's), looking each second for the end
                try:
                    async with asyncio.timeout(1.0):
                        await self._follows.acquire()
                    break
                except TimeoutError:
                    end = _harness_end(self.cache.get(pod))
                    if end or time.monotonic() >= deadline:
                        return end, fetched
            try:
                fetched = await blocking(self._fetch, pod, spool, fetched, None)
            except ExecError as e:  # no stream yet, or a transfer that broke: the next poll goes on from here
                log.debug("%s: following the stream: %s", pod, e)
            finally:
                self._follows.release()

    def _salvage(self, pod: str, spool: Path, store: Store, keys: SessionKeys) -> dict[str, Any]:
        """Keep what can still be read of a stream that cannot be proven complete: what was
        fetched while the session ran, and what the pod still has past it."""
        got = spool.stat().st_size if spool.exists() else 0
        try:
            got = self._fetch(pod, spool, got, None)
        except Exception as e:  # the pod is gone or going: keep what arrived
            got = spool.stat().st_size if spool.exists() else 0
            log.warning("%s: salvage of the stream stopped after %d bytes: %s", pod, got, e)
        if not got:
            return {"stream": None}
        kept = _upload(spool, store, keys.partial_stream)
        return {"stream": None, "partial_stream": kept}

    def _collect(self, pod: str, scratch: Path, sealed: SealedWorkspace, store: Store, keys: SessionKeys,
                 also_collect: Callable[[SessionKeys, str], set[str]], packed: Packed, messages: str) -> Collected:
        """The files the session left: packed in the pod (finish_argv), the rest past what came
        with the packing fetched in verified chunks as the stream is (memory bounded by one
        chunk), unpacked safely, stored. Past kube.collect_max_bytes nothing is collected and
        the capture record says why."""
        limit = self.settings.kube.collect_max_bytes
        if packed.size > limit:
            return Collected(None, f"the workspace packs to more than kube.collect_max_bytes ({limit} bytes); "
                                   "its files were not collected")
        if packed.status != "0":
            raise ExecError(f"exec in {pod}: packing the workspace failed (tar {packed.status}): {messages[-300:]}")
        warnings = [line for line in messages.splitlines() if line.strip()]
        spool = scratch / "workspace.tar"
        spool.unlink(missing_ok=True)
        self._fetch(pod, spool, 0, packed.size, PACKED_NAME, head=packed.head)
        if digest.of_file(spool) != "sha256:" + packed.sha256:
            raise ExecError(f"exec in {pod}: the fetched workspace is not what the pod packed "
                            f"({packed.size} bytes sha256:{packed.sha256})")
        out = scratch / "collected"
        try:
            skipped = _extract_safely(spool, out, limit)
        except WorkspaceTooLarge as e:
            shutil.rmtree(out, ignore_errors=True)
            return Collected(None, str(e))
        if skipped:
            log.warning("%s: %d workspace member(s) not unpacked (outside the workspace or through a link): %s",
                        pod, len(skipped), ", ".join(skipped[:10]))
        collected = collect_workspace(out, sealed.manifest, also_collect(keys, WORKSPACE), store, keys)
        return Collected(collected, warnings=warnings[-20:])

    def _delete(self, name: str, grace: int | None = None) -> None:
        with self._delete_slots:
            self.kube.delete_pod(name, grace)


class PodMilestones:
    """The POD_MILESTONES (runner/k8s/podstate.py) of the pods this executor creates, stamped
    with the controller's clock as the pod watch delivers each state (``saw``, called by the
    cache under its lock: quick, never blocking). Only pods tracked from before their create
    are stamped, so a pod adopted after a restart, first seen long after it started, has none."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stamps: dict[str, dict[str, str]] = {}

    def track(self, pod: str) -> None:
        """Stamp ``pod`` from now on, from nothing (a pod created again starts over)."""
        with self._lock:
            self._stamps[pod] = {}

    def saw(self, pod: str, state: Pod) -> None:
        self._stamp(pod, lambda: podstate.reached(state))

    def stamp(self, pod: str, milestone: str) -> None:
        """``milestone`` reached now, as the executor saw it (unless the watch saw it, or a later one, first)."""
        self._stamp(pod, lambda: [milestone])

    def _stamp(self, pod: str, shown: Callable[[], list[str]]) -> None:
        with self._lock:
            stamps = self._stamps.get(pod)
            if stamps is not None and (new := podstate.unstamped(stamps, shown())):
                stamps.update(dict.fromkeys(new, now()))

    def take(self, pod: str) -> dict[str, str]:
        with self._lock:
            return dict(self._stamps.get(pod) or {})

    def forget(self, pod: str) -> None:
        with self._lock:
            self._stamps.pop(pod, None)


@dataclass(frozen=True)
class Collected:
    """The files a session left, or why they were not collected, and what the pod's tar could not read."""

    artifacts: Artifacts | None
    not_collected: str | None = None
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Startup:
    """How a new pod's start ended: ``running`` (its reader runs), ``failed`` (it cannot start:
    an image or configuration error; it is deleted and created again) or ``gone`` (deleted
    before it started: the session is not started, nothing was spent)."""

    kind: Literal["running", "failed", "gone"]
    why: str = ""


def _startup(pod: Pod | None) -> Startup | None:
    """A pod's start as far as it went, or None while it may still start."""
    if pod is None:
        return Startup("gone", "the pod was deleted before it started")
    if podstate.running(pod, "reader"):
        return Startup("running")
    why = podstate.never_started(pod)
    return Startup("failed", why) if why else None


@dataclass(frozen=True)
class HarnessEnd:
    """How a harness's wait ended: its container terminated (its state), or the pod was lost (why)."""

    terminated: dict[str, Any]
    lost: str | None = None


def _harness_end(pod: Pod | None) -> HarnessEnd | None:
    if pod is not None:
        term = podstate.terminated(pod, "harness")
        if term is not None:
            return HarnessEnd(term)
    why = podstate.lost(pod)
    return HarnessEnd({}, why) if why else None


def _session_of(pod: Pod) -> tuple[str, str, int] | None:
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


# What one file, directory or link costs on disk at least, whatever its size (a block, an inode).
_DISK_COST = 4096


class WorkspaceTooLarge(Exception):
    """Unpacking the workspace would take more disk than the collection allows: the message says so."""


def _extract_safely(tar_path: Path, dest: Path, max_disk: int | None = None) -> list[str]:
    """Directories, regular files and links inside ``dest``, from a tar the session pod made
    (untrusted). A hard link is a copy of the file it names, where that is a file already unpacked
    inside (a session's ``ln a b`` leaves two files, and dropping one would record it deleted).
    A symbolic link is recreated as a link and never followed: a member whose path runs
    through a link an earlier member made (``a -> /outside``, then ``a/x``) is skipped, and a
    member that replaces a link replaces the link, not what it points at. Returns the names
    skipped. (tarfile's extraction filters do the same from Python 3.11.4 on; the runner image's
    Debian python3 is 3.11.2, so one check here serves every interpreter.)

    ``max_disk``: the most the unpacked workspace may take on disk, each member counted at its size
    rounded up to a block and at least a block: a tar of many small files takes a few hundred
    bytes a file, and would take the controller's scratch (and get it evicted) when unpacked.
    WorkspaceTooLarge where it would take more."""
    dest.mkdir(parents=True, exist_ok=True)
    root = Path(os.path.realpath(dest))
    skipped: list[str] = []
    used = 0
    with tarfile.open(tar_path, mode="r:") as tar:
        for m in tar:
            used += max(_DISK_COST, -(-m.size // _DISK_COST) * _DISK_COST)
            if max_disk is not None and used > max_disk:
                raise WorkspaceTooLarge(f"the workspace would take more than kube.collect_max_bytes ({max_disk} bytes) on disk "
                                        "unpacked (many small files); its files were not collected")
            rel = Path(os.path.normpath(m.name))
            if str(rel) == ".":  # the workspace itself
                continue
            if rel.is_absolute() or rel.parts[:1] == ("..",):
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
            if not (m.isfile() or m.issym() or m.islnk()):
                continue
            source = None
            if m.islnk():  # a hard link: the session's file under a second name, its bytes the first's
                linked = root / os.path.normpath(m.linkname)
                if os.path.islink(linked) or not Path(os.path.realpath(linked)).is_relative_to(root) or not linked.is_file():
                    skipped.append(m.name)
                    continue
                source = open(linked, "rb")  # closed once copied, below
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_symlink() or target.is_file():
                target.unlink()
            if m.issym():
                os.symlink(m.linkname, target)
                continue
            src = source or tar.extractfile(m)
            assert src is not None
            try:
                with open(target, "xb") as f:  # O_EXCL: never through a link
                    while chunk := src.read(1 << 20):
                        f.write(chunk)
            finally:
                src.close()
    return skipped


def _upload(spool: Path, store: Store, key: str) -> StreamRecord:
    with open(spool, "rb") as f, store.writer(key) as w:
        while chunk := f.read(1 << 20):
            w.write(chunk)
        w.commit()
    return {"key": key, "bytes": w.size, "sha256": w.sha256}


def _upload_verified(spool: Path, store: Store, key: str, record: ReaderRecord) -> StreamRecord:
    size, sha = spool.stat().st_size, digest.of_file(spool)
    if size != record["bytes"] or sha != record["sha256"]:
        raise ExecError(f"stream {key}: fetched {size} bytes {sha}, the reader recorded {record['bytes']} bytes {record['sha256']}")
    if store.exists(key):  # a restart after the upload: the same bytes are there already
        return {"key": key, "bytes": size, "sha256": sha}
    return _upload(spool, store, key)
