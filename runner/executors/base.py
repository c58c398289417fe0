"""The one contract the campaign runs sessions through. LocalExecutor (bwrap on this host,
runner/executors/local.py) and KubernetesExecutor (a pod per session,
runner/executors/kubernetes.py) implement it side by side; the campaign calls these hooks
and nothing else, in this order: preflight, prepare, then per session run and finish (halted
between sessions), close at the end; a stop's words come from remedies. ``run`` is a coroutine
on the campaign's event loop (runner/aio.py): sessions wait without a thread each."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, Protocol, TypedDict

from runner.aio import Changed
from runner.clock import now
from runner.layout import SessionKeys
from runner.plan import Plan, Probe
from runner.seal import SealedWorkspace
from runner.share import WHOLE, Share
from runner.store import Store

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from runner.entrypoints.pod import ReaderRecord  # the types alone: the pod's entry points are not the run path's,
    from runner.k8s.confinement import CheckSummary  # nor the cluster the local executor's

# (probe, session, attempt) of a session attempt whose harness may still run (a pod a restarted
# controller adopts instead of starting the session again).
Live = tuple[str, str, int]


@dataclass(frozen=True)
class Halt:
    """Why no further session may start, and whose matter it is: ``key``, the provider refused
    the install's key (a setting to fix, exit 2, as when a session's stream shows it); else the
    platform no longer confines sessions as promised (exit 12)."""

    why: str
    key: bool = False


@dataclass(frozen=True)
class Remedies:
    """How a campaign is run again, in the words of the executor it runs on (each builds its
    own: a run on this host is `run` again; a submitted one a new controller Job or a resume Job)."""

    campaign: str
    again: str       # how the sessions not started are started
    resume_how: str  # the flag that runs `ledger resume` where the campaign runs
    fix_key: str     # what to do about a key the provider refuses
    # whether a refusal before any session ran ends on ``again``: a Job's refusal is read later,
    # by a watch, where the one who ran it must be told how to run it again
    again_after_refusal: bool = False

    def resume(self, *sessions: str) -> str:
        return f"`probe-runner ledger resume {self.campaign} {' '.join(sessions)} {self.resume_how}`"

    def refusal(self, why: str) -> str:
        """The words a refusal before any session ran (the confinement or key check) is recorded with."""
        return f"{why}, then {self.again}" if self.again_after_refusal else why


class StreamRecord(TypedDict):
    """A stored stream: where, how many bytes, their digest."""

    key: str
    bytes: int
    sha256: str


class Artifacts(TypedDict):
    """The files a session left, as collected (runner/executors/capture.py): the workspace paths
    it created or changed with their digests, those stored (also the ones asked for), its links
    by target, and the sealed paths it deleted."""

    changed: dict[str, str]
    stored: list[str]
    links: dict[str, str]
    deleted: list[str]


class WaitReason(TypedDict):
    """Why a session waits to start (the budget, the campaign's concurrency, a throttle pause,
    or its pod, in the scheduler's or the kubelet's words), since when, and the phase it waits
    in (runner/phases.py: the milestone it has yet to reach; absent in a waiting.json an
    earlier version wrote)."""

    reason: str
    since: str
    phase: NotRequired[str]


# Where one session says why it waits: (why, or None once it no longer waits; the milestone
# it waits to reach, runner/phases.py).
Note = Callable[[str | None, str | None], None]


class WaitingRecord(TypedDict):
    """``waiting.json`` (layout.waiting_key): why the sessions not started yet wait, as the
    campaign's run last wrote it (Waiting; status reads it)."""

    at: str
    sessions: dict[str, WaitReason]


class Phases(TypedDict):
    """A session's milestones (runner/phases.py: the phases between them, in this order), each
    an ISO 8601 UTC stamp with milliseconds taken by the process that saw it; one it could not
    see is absent, never guessed. The campaign's (the controller's or this host's clock):
    ``queued`` (a worker of the run took the session up), ``budget_held`` (its reservation fit;
    where a budget is set), ``slot_held`` (it holds a slot and no throttle pause holds it back).
    The Kubernetes executor's, through its pod watch (runner/k8s/podstate.py's ``reached``; the
    controller's clock, when the watch delivered the change): ``pod_created`` (the create request
    returned, for the pod that ran), ``scheduled`` (first seen with a node), ``sandbox_ready``
    (first seen with PodReadyToStartContainers true; a kubelet before 1.29 reports none),
    ``image_pulled`` (first seen with a container made: running, terminated or with its imageID;
    the pod's status has no state for a pull, and the kubelet pulls each container's image just
    before it makes the container), ``containers_started`` (first seen with the capture
    reader running: what the controller waits for; the harness's container starts after it, in
    ``harness_started``'s phase); ``workspace_delivered`` (its exec returned); from the harness's entry
    point in the pod (the node's clock, in its termination message): ``harness_started`` (the CLI
    was started, after the policy wait); from the capture reader (the node's clock): ``first_reply``
    (runner/phases.py's FirstReply), ``harness_exited`` (the stream's end: the CLI and everything
    holding its output ended); the controller's again: ``stream_collected`` (fetched, verified,
    stored), ``artifacts_collected`` (the workspace's files stored, the gateway's meter read). The
    local executor stamps the harness's own milestones with this host's clock as its driver sees
    them. ``outcome_journaled`` is not in capture.json, which is written before the outcome: it is
    the ledger's outcome entry's ``at`` (status and the report read it there; the progress event
    carries it)."""

    queued: NotRequired[str]
    budget_held: NotRequired[str]
    slot_held: NotRequired[str]
    pod_created: NotRequired[str]
    scheduled: NotRequired[str]
    sandbox_ready: NotRequired[str]
    image_pulled: NotRequired[str]
    containers_started: NotRequired[str]
    workspace_delivered: NotRequired[str]
    harness_started: NotRequired[str]
    first_reply: NotRequired[str]
    harness_exited: NotRequired[str]
    stream_collected: NotRequired[str]
    artifacts_collected: NotRequired[str]
    outcome_journaled: NotRequired[str]
    policy_wait_seconds: NotRequired[float]  # kubernetes: the entry point's wait for the pod's network policy, before harness_started


class CaptureRecord(TypedDict):
    """What an executor observed of one session, beside its stream: stored as the session's
    capture.json, read by the transform. Paths are as the session saw them."""

    executor: str                   # "local" or "kubernetes"
    confinement: str                # the executor's confinement prose for the transcript
    network_confined: bool          # whether the session's network was limited to the provider
    harness: dict[str, Any]         # the CLI: path or image (and image_id), version, argv, tool lists
    started_at: str                 # ISO 8601, UTC, milliseconds
    ended_at: str
    exit_code: int | None           # the CLI's exit status (None: it never reported one)
    timed_out: bool                 # the driver ended it at its time limit
    oom_killed: NotRequired[bool]   # kubernetes: the harness container was killed at its memory limit
    stream: StreamRecord            # the stored stream
    workspace: str                  # the workspace path as the session saw it
    config_dir: str                 # the CLI's configuration directory as the session saw it
    host_skills: list[str]          # skills the host's CLI configuration would have loaded
    artifacts: Artifacts | None     # the files the session changed, as stored (None: not collected)
    artifacts_not_collected: NotRequired[str]              # why artifacts is None
    artifacts_warnings: NotRequired[list[str]]             # kubernetes: what the pod's tar could not read
    confinement_checks: NotRequired[list[CheckSummary]]    # kubernetes: the canary checks over the session
    pod: NotRequired[dict[str, Any]]                       # kubernetes: name, namespace, node, owner, runtime_class
    reader: NotRequired[ReaderRecord]                      # kubernetes: the capture reader's record
    driver_produced: NotRequired[list[str]]                # added by the campaign: paths it may write unnamed
    gateway: NotRequired[dict[str, Any]]                   # the provider gateway's meter of the attempt's calls
    phases: Phases                                         # where its time went: the executor's milestones, the campaign's added


class Waiting:
    """Why a campaign's sessions wait (for the budget, a slot, a throttle pause, their pod),
    written to the store (layout.waiting_key) at most once a second by its own thread, so
    ``status`` can say it: the campaign and the executor (the pod watch's callbacks among
    them) only note it in memory. A store error is logged and retried at the next change,
    never swallowed."""

    def __init__(self, store: Store, key: str) -> None:
        """``key``: layout.waiting_key, the campaign's or its share's (one writer each)."""
        self._lock = threading.Lock()
        self._why: dict[str, WaitReason] = {}
        self._dirty = threading.Event()
        self._stop = threading.Event()
        self._store, self._key = store, key
        self._thread = threading.Thread(target=self._run, name="waiting", daemon=True)
        self._thread.start()

    def of(self, session: str) -> Note:
        """``note`` for one session."""
        def note(why: str | None, phase: str | None) -> None:
            self.note(session, why, phase)
        return note

    def note(self, session: str, why: str | None, phase: str | None = None) -> None:
        """``session`` waits because ``why`` (None: it no longer waits), in ``phase`` (the
        milestone it has yet to reach; None for a start that ended)."""
        with self._lock:
            if why is None:
                changed = self._why.pop(session, None) is not None
            else:
                changed = session not in self._why or self._why[session]["reason"] != why
                if changed:
                    self._why[session] = {"reason": why, "since": now()}
                    if phase is not None:
                        self._why[session]["phase"] = phase
        if changed:
            self._dirty.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._dirty.wait(timeout=1.0):
                self._flush()
                self._stop.wait(1.0)

    def _flush(self) -> None:
        self._dirty.clear()
        with self._lock:
            record: WaitingRecord = {"at": now(), "sessions": dict(sorted(self._why.items()))}
            body = json.dumps(record, indent=1).encode()
        try:
            self._store.put(self._key, body)
        except Exception as e:  # noqa: BLE001 - a status aid: logged, written again at the next change
            log.warning("could not record why sessions wait (%s): %s", self._key, e)
            self._dirty.set()

    def stop(self) -> None:
        """Stop the writer; what changed since its last write is written (nothing where no
        session of the run ever waited)."""
        self._stop.set()
        self._thread.join(timeout=10)
        if self._dirty.is_set():
            self._flush()


class Slots:
    """The campaign's ``concurrency``: at most ``running`` sessions hold a slot (their harness
    may spend); beside them, up to ``waiting`` sessions whose start is still waiting on the
    platform (a pod the scheduler cannot place, an image pull, a quota) may step aside and
    give their slot to a session that can start. A session coming back from the side is
    served before a new one, so a session that waited is not overtaken for ever. Used from
    the campaign's event loop alone (runner/aio.py)."""

    def __init__(self, running: int, waiting: int = 0) -> None:
        self.running_limit, self.waiting_limit = running, waiting
        self.running = 0   # sessions holding a slot
        self.waiting = 0   # sessions stepped aside
        self.returning = 0  # stepped-aside sessions waiting to take a slot back
        self.changed = Changed()

    @asynccontextmanager
    async def take(self, force: bool = False, note: Note | None = None) -> AsyncIterator[Slot]:
        """Hold a slot for one session attempt; ``force``: at once, past the limit (a session
        whose harness already runs, adopted after a restart, must be followed now). ``note``:
        where the session says why it waits (``status`` shows it), here and through the slot."""
        slot = Slot(self, note)

        def free() -> bool:
            return force or (self.running < self.running_limit and not self.returning)
        if waited := not free():
            slot.note(f"the campaign's concurrency: {self.running} of {self.running_limit} sessions running", "slot_held")
            await self.changed.wait_for(free)
        self.running += 1
        if waited:
            slot.note(None)
        try:
            yield slot
        finally:
            if slot.held:
                self.running -= 1
            else:
                self.waiting -= 1
            self.changed.notify()


class Slot:
    """One session's place in ``Slots``: held, or stepped aside while its start waits."""

    def __init__(self, slots: Slots, note: Note | None = None) -> None:
        self.slots = slots
        self.held = True
        self._note = note

    def note(self, why: str | None, phase: str | None = None) -> None:
        """The session waits because ``why`` (None: it no longer waits), for the milestone
        ``phase`` (runner/phases.py); ``status`` shows it (Waiting)."""
        if self._note is not None:
            self._note(why, phase)

    def aside(self) -> bool:
        """Give the slot up while this session waits to start, if the waiting room has space;
        returns whether this session is (now) aside."""
        s = self.slots
        if self.held and s.waiting < s.waiting_limit:
            self.held = False
            s.running -= 1
            s.waiting += 1
            s.changed.notify()
        return not self.held

    async def back(self, timeout: float | None) -> bool:
        """Take a slot again before the harness can start; False if none was free within
        ``timeout`` seconds (None: as long as it takes; the session is then still aside)."""
        s = self.slots
        if self.held:
            return True
        s.returning += 1
        try:
            if not await s.changed.wait_for(lambda: s.running < s.running_limit, timeout):
                return False
        finally:
            s.returning -= 1
            s.changed.notify()
        self.held = True
        s.running += 1
        s.waiting -= 1
        return True


class Executor(Protocol):
    name: str          # "local" or "kubernetes": the capture record's ``executor``
    confinement: str   # the transcript's confinement prose for sessions it ran
    waiting_room: int  # sessions that may wait to start beside the running ones, holding no slot (Slots)
    harness_version: str | None  # what its sessions' harness reports (``--version``), once preflight passed; None: the pinned one

    def remedies(self, campaign: str) -> Remedies:
        """How ``campaign``, run here, is run again: the words of every stop's remedy."""

    def preflight(self) -> None:
        """Refuse, before anything is journaled or spent, a place where a session cannot be
        confined as the contract requires (ConfinementError, exit 12) or cannot run (UserError)."""

    def prepare(self, plan: Plan, final: set[Live], share: Share = WHOLE) -> set[Live]:
        """Take up what an earlier run of this campaign (of this ``share`` of it: runner/share.py)
        left: release what belongs to attempts already final, and return the attempts whose
        harness may still run (``run`` adopts them). What belongs to another share is not this
        run's to touch."""

    async def run(self, plan: Plan, probe: Probe, sealed: SealedWorkspace, scratch: Path, store: Store,
                  keys: SessionKeys, also_collect: Callable[[SessionKeys, str], set[str]],
                  started: Callable[[], None], slot: Slot) -> CaptureRecord:
        """Run one session attempt to its end, on the campaign's event loop (runner/aio.py:
        what blocks goes to a thread, and a session's waits hold none). ``started`` and
        ``also_collect`` block (the ledger, the stream): call them off the loop. Call ``started()`` just before the harness can
        spend (holding ``slot``: a session whose start waits on the platform may step it aside
        and must take it back first), store its stream under ``keys.stream`` (verified), collect the files it changed
        (and those ``also_collect`` names), and return its capture record. Raises NotStarted
        (nothing ran), SessionRefused (the harness never ran) or SessionInterrupted."""

    def finish(self, keys: SessionKeys) -> None:
        """The attempt's outcome is journaled: release what it held (its pod)."""

    def halted(self) -> Halt | None:
        """Why no further session may start (a confinement check failed), or None."""

    def close(self) -> None:
        """The campaign's run is over: stop background work (watches, checks)."""
