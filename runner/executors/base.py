"""The one contract the campaign runs sessions through. LocalExecutor (bwrap on this host,
runner/executors/local.py) and KubernetesExecutor (a pod per session,
runner/executors/kubernetes.py) implement it side by side; the campaign calls these six hooks
and nothing else, in this order: preflight, prepare, then per session run and finish (halted
between sessions), close at the end."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NotRequired, Protocol, TypedDict

from runner.layout import SessionKeys
from runner.plan import Plan, Probe
from runner.seal import SealedWorkspace
from runner.store import Store

# (probe, session, attempt) of a session attempt whose harness may still run (a pod a restarted
# controller adopts instead of starting the session again).
Live = tuple[str, str, int]


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
    stream: dict[str, Any]          # the stored stream: key, bytes, sha256
    workspace: str                  # the workspace path as the session saw it
    config_dir: str                 # the CLI's configuration directory as the session saw it
    host_skills: list[str]          # skills the host's CLI configuration would have loaded
    artifacts: dict[str, Any] | None  # the files the session changed, as stored (None: not collected)
    artifacts_not_collected: NotRequired[str]              # why artifacts is None
    artifacts_warnings: NotRequired[list[str]]             # kubernetes: what the pod's tar could not read
    confinement_checks: NotRequired[list[dict[str, Any]]]  # kubernetes: the canary checks over the session
    pod: NotRequired[dict[str, Any]]                       # kubernetes: name, namespace, node
    reader: NotRequired[dict[str, Any]]                    # kubernetes: the capture reader's record
    driver_produced: NotRequired[list[str]]                # added by the campaign: paths it may write unnamed


class Executor(Protocol):
    name: str          # "local" or "kubernetes": the capture record's ``executor``
    confinement: str   # the transcript's confinement prose for sessions it ran

    def preflight(self) -> None:
        """Refuse, before anything is journaled or spent, a place where a session cannot be
        confined as the contract requires (ConfinementError, exit 12) or cannot run (UserError)."""

    def prepare(self, plan: Plan, final: set[Live]) -> set[Live]:
        """Take up what an earlier run of this campaign left: release what belongs to attempts
        already final, and return the attempts whose harness may still run (``run`` adopts them)."""

    def run(self, plan: Plan, probe: Probe, sealed: SealedWorkspace, scratch: Path, store: Store,
            keys: SessionKeys, also_collect: Callable[[SessionKeys, str], set[str]],
            started: Callable[[], None]) -> CaptureRecord:
        """Run one session attempt to its end: call ``started()`` just before the harness can
        spend, store its stream under ``keys.stream`` (verified), collect the files it changed
        (and those ``also_collect`` names), and return its capture record. Raises NotStarted
        (nothing ran), SessionRefused (the harness never ran) or SessionInterrupted."""

    def finish(self, keys: SessionKeys) -> None:
        """The attempt's outcome is journaled: release what it held (its pod)."""

    def halted(self) -> str | None:
        """Why no further session may start (a confinement check failed), or None."""

    def close(self) -> None:
        """The campaign's run is over: stop background work (watches, checks)."""
