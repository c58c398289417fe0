"""Which nodes session pods may land on, and which of them already hold an image: pure
functions over Node objects as the API sends them (``doctor --cluster`` lists the Nodes once).

A node's ``status.images[].names`` are what its container runtime reports: fully qualified
references by tag (``docker.io/library/python:3.12``) and by digest (``repo@sha256:...``). An
image reference from the settings may be short (``python:3.12``, ``team/harness``) and may name
a digest; both sides are normalised as the runtime does (Docker Hub's domain and ``library/``
namespace, the ``latest`` tag) before they are compared. A reference by digest is present only
where that digest is listed: the same tag may hold another image. The kubelet lists at most
``nodeStatusMaxImages`` (50 by default) images per node, largest first, so an image missing from
the list may still be there.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

DOCKER_HUB = "docker.io"
# Taint effects that keep a pod off a node it does not tolerate (PreferNoSchedule only discourages).
REPELLING = ("NoSchedule", "NoExecute")


@dataclass(frozen=True)
class Reference:
    """An image reference, normalised: ``repository`` with its registry domain, and the ``tag``
    or ``digest`` (or both: the runtime then pulls by the digest) it names."""

    repository: str
    tag: str | None
    digest: str | None


def parse(ref: str) -> Reference:
    """``ref`` as the container runtime reads it: a first path component with a dot or a colon,
    or ``localhost``, is a registry; any other reference is Docker Hub's (``library/`` for a
    name without a path); no tag and no digest means ``latest``."""
    name, _, digest = ref.partition("@")
    slash = name.rfind("/")
    colon = name.rfind(":")
    tag = name[colon + 1:] if colon > slash else None
    if tag is not None:
        name = name[:colon]
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        domain, path = ("docker.io" if first == "index.docker.io" else first), rest
    else:
        domain, path = DOCKER_HUB, name
    if domain == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    return Reference(f"{domain}/{path}", tag or (None if digest else "latest"), digest or None)


def present(ref: str, names: Iterable[str]) -> bool:
    """Whether an image listed under ``names`` (a node's ``status.images[].names``) is ``ref``:
    by its digest where ``ref`` names one, else by its tag."""
    want = parse(ref)
    for listed in map(parse, names):
        if listed.repository != want.repository:
            continue
        if want.digest is not None:
            if listed.digest == want.digest:
                return True
        elif listed.tag == want.tag:
            return True
    return False


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Kubernetes' rule: the effect matches (an empty one matches all), the key matches (an
    empty key with Exists matches every taint), and with Equal (the default) the value too."""
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    operator = toleration.get("operator") or "Equal"
    key = toleration.get("key") or ""
    if not key:
        return operator == "Exists"
    if key != taint.get("key"):
        return False
    return operator == "Exists" or (toleration.get("value") or "") == (taint.get("value") or "")


def admits(node: Mapping[str, Any], node_selector: Mapping[str, str], tolerations: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a session pod with ``node_selector`` and ``tolerations`` may be scheduled on
    ``node``: it carries every selected label, is not cordoned, and every taint that repels is
    tolerated."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    spec = node.get("spec") or {}
    if any(labels.get(k) != v for k, v in node_selector.items()) or spec.get("unschedulable"):
        return False
    return all(any(tolerates(t, taint) for t in tolerations)
               for taint in spec.get("taints") or [] if taint.get("effect") in REPELLING)


def session_nodes(nodes: Iterable[Mapping[str, Any]], node_selector: Mapping[str, str],
                  tolerations: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The nodes session pods may land on, by name."""
    return sorted((n for n in nodes if admits(n, node_selector, tolerations)), key=lambda n: str(n["metadata"]["name"]))


def lacking(nodes: Iterable[Mapping[str, Any]], ref: str) -> list[str]:
    """Names of the ``nodes`` whose reported images do not include ``ref``."""
    return [str(n["metadata"]["name"]) for n in nodes
            if not present(ref, (name for image in (n.get("status") or {}).get("images") or []
                                 for name in image.get("names") or []))]
