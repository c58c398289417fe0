"""What a session pod's status says, read off the plain dict the watch delivers (pure).

The distinction that matters is whether the harness can have spent: a pod that was never
scheduled, or whose image never pulled, ran nothing and may be retried; a pod that was evicted,
lost with its node or deleted by someone else after its harness started may have spent, and
is recorded as interrupted, never retried by itself.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

NEVER_STARTED_REASONS = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
                         "CreateContainerConfigError", "CreateContainerError", "RunContainerError"}


def _status(pod: dict[str, Any], container: str) -> dict[str, Any] | None:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == container:
            found: dict[str, Any] = cs
            return found
    return None


def running(pod: dict[str, Any], container: str) -> bool:
    cs = _status(pod, container)
    return bool(cs and (cs.get("state") or {}).get("running") is not None)


def terminated(pod: dict[str, Any], container: str) -> dict[str, Any] | None:
    cs = _status(pod, container)
    return (cs.get("state") or {}).get("terminated") if cs else None


def image_id(pod: dict[str, Any], container: str) -> str | None:
    """The digest the runtime ran ``container`` from (status ``imageID``, e.g.
    ``docker.io/x@sha256:...`` or ``sha256:...``): the tag in the spec can move, this cannot."""
    cs = _status(pod, container)
    return (cs or {}).get("imageID") or None


def never_started(pod: dict[str, Any]) -> str | None:
    """Why the pod cannot start (an image or configuration error), or None."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in NEVER_STARTED_REASONS:
            return f"{cs.get('name')}: {waiting['reason']}: {waiting.get('message', '')}".rstrip(": ")
    return None


def waiting(pod: dict[str, Any] | None) -> str:
    """Why a pod that is not running yet waits, as the scheduler and the kubelet say it."""
    if pod is None:
        return "creating the pod"
    said = unschedulable(pod) or never_started(pod)
    if said:
        return said
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        w = (cs.get("state") or {}).get("waiting") or {}
        if w.get("reason"):
            return f"{cs.get('name')}: {w['reason']}: {w.get('message', '')}".rstrip(": ")
    return "scheduled, starting" if (pod.get("spec") or {}).get("nodeName") else "waiting to be scheduled"


def unschedulable(pod: dict[str, Any]) -> str | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return f"unschedulable: {cond.get('message') or cond.get('reason')}"
    return None


def lost(pod: dict[str, Any] | None) -> str | None:
    """Why a pod whose harness may have started can no longer finish, or None."""
    if pod is None:
        return "the pod was deleted"
    status = pod.get("status") or {}
    if pod["metadata"].get("deletionTimestamp"):
        return "the pod is being deleted"
    if status.get("phase") in ("Failed", "Unknown") or status.get("reason") == "Evicted":
        return f"the pod {status.get('phase', '').lower() or 'failed'}: {status.get('reason', '')} {status.get('message', '')}".strip()
    for cond in status.get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            return f"the pod is disrupted: {cond.get('reason')} {cond.get('message', '')}".strip()
    reader = terminated(pod, "reader")
    if reader is not None:
        return f"the capture reader ended ({reader.get('reason', 'exit ' + str(reader.get('exitCode')))})"
    return None


# The milestones a session pod's status shows (runner/phases.py's ORDER, executors.base.Phases),
# in their order.
POD_MILESTONES = ("pod_created", "scheduled", "sandbox_ready", "image_pulled", "containers_started")


def _condition(pod: dict[str, Any], kind: str) -> str | None:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return str(cond.get("status"))
    return None


def reached(pod: dict[str, Any]) -> list[str]:
    """The POD_MILESTONES this state of the pod shows: it exists; it has a node; its
    PodReadyToStartContainers condition is true (its sandbox and network are made; kubelets
    since 1.29); a container of it was made (running, ended, or with its imageID: the status has
    no state for an image pull, and the kubelet pulls a container's image just before it makes
    the container); the capture reader runs (what the controller waits for before it delivers
    the workspace: the harness's container starts after it, and that start is in the harness's
    own phase)."""
    containers = (pod.get("status") or {}).get("containerStatuses") or []
    shown = {
        "pod_created": True,
        "scheduled": bool((pod.get("spec") or {}).get("nodeName")),
        "sandbox_ready": _condition(pod, "PodReadyToStartContainers") == "True",
        "image_pulled": any(cs.get("imageID") or {"running", "terminated"} & set(cs.get("state") or {}) for cs in containers),
        "containers_started": running(pod, "reader"),
    }
    return [m for m in POD_MILESTONES if shown[m]]


def unstamped(stamped: Collection[str], shown: list[str]) -> list[str]:
    """Of the POD_MILESTONES ``shown`` (``reached``), those to stamp now, beside the ``stamped``
    ones: not stamped yet, and after every one that is (one seen only after a later one was not
    seen when it happened: it stays absent rather than out of order)."""
    last = max((POD_MILESTONES.index(m) for m in stamped), default=-1)
    return [m for m in shown if POD_MILESTONES.index(m) > last]


def waiting_phase(pod: dict[str, Any] | None) -> str:
    """The phase a pod that is not running yet waits in: the next of POD_MILESTONES it has not
    reached (sandbox_ready only where the kubelet reports that condition)."""
    if pod is None:
        return "pod_created"
    shown = reached(pod)
    for m in POD_MILESTONES:
        if m not in shown and (m != "sandbox_ready" or _condition(pod, "PodReadyToStartContainers") is not None):
            return m
    return "containers_started"
