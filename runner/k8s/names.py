"""One naming function for every Kubernetes object, and the label constants selectors are
built from.

Names must be DNS-1123 labels (lowercase alphanumerics and '-', at most 63 characters) and
deterministic, so that creating a session pod twice is the same request (409 AlreadyExists,
not a second session). Sanitising can map two inputs to one string and truncation can cut off
what tells them apart, so every name ends in a hash of the exact inputs.
"""

from __future__ import annotations

import hashlib
import re

MAX_NAME = 63
HASH_LEN = 10

APP = "probe-runner"
GROUP = "probe-runner.io"

NAME = "app.kubernetes.io/name"
INSTANCE = "app.kubernetes.io/instance"
COMPONENT = "app.kubernetes.io/component"
PART_OF = "app.kubernetes.io/part-of"
MANAGED_BY = "app.kubernetes.io/managed-by"
# Our keys, each used twice on an object: as a label holding label_value(x), which selects,
# and as an annotation holding x exactly, which is read back.
CAMPAIGN = f"{GROUP}/campaign"
PROBE = f"{GROUP}/probe"
SESSION = f"{GROUP}/session"
ATTEMPT = f"{GROUP}/attempt"
SHARE = f"{GROUP}/share"  # a split campaign's share that owns the pod (runner/share.py); absent where whole
CANARY = f"{GROUP}/canary"  # annotation only: the number of the confinement check a canary pod runs
METER_PREFIX = f"meter.{GROUP}"  # <this>/<gateway pod>: an annotation of an attempt's Lease, that gateway's meter

SESSION_COMPONENT = "session"
PROXY_COMPONENT = "egress-proxy"
GATEWAY_COMPONENT = "gateway"
CONTROLLER_COMPONENT = "controller"


def object_name(*parts: str | int, max_len: int = MAX_NAME) -> str:
    """A DNS-1123 label from ``parts``: readable prefix, then a hash of the exact parts."""
    exact = "\0".join(str(p) for p in parts)
    suffix = hashlib.sha256(exact.encode()).hexdigest()[:HASH_LEN]
    readable = re.sub(r"[^a-z0-9]+", "-", "-".join(str(p) for p in parts).lower()).strip("-")
    readable = readable[: max_len - HASH_LEN - 1].rstrip("-")
    return f"{readable}-{suffix}" if readable else suffix


def label_value(value: str | int) -> str:
    """A label value (<= 63 of [A-Za-z0-9_.-], alphanumeric at both ends); the exact value
    goes in an annotation, labels only select."""
    v = re.sub(r"[^A-Za-z0-9_.-]+", "-", str(value))
    if len(v) > MAX_NAME:
        v = object_name(value)
    return v.strip("-_.") or object_name(value)


def session_service_account(instance: str) -> str:
    """The session pods' own ServiceAccount: nothing is bound to it and it mounts no token."""
    return f"{instance}-session"


def gateway_name(instance: str) -> str:
    """The chart's gateway Deployment and Service (helm: probe-runner.gatewayName)."""
    return f"{instance}-gateway"


def session_labels(instance: str, campaign: str, probe: str, session: str, attempt: int) -> dict[str, str]:
    return {
        **component_labels(instance, SESSION_COMPONENT),
        CAMPAIGN: label_value(campaign),
        PROBE: label_value(probe),
        SESSION: label_value(session),
        ATTEMPT: str(attempt),
    }


def component_labels(instance: str, component: str) -> dict[str, str]:
    return {NAME: APP, INSTANCE: instance, COMPONENT: component, PART_OF: APP, MANAGED_BY: APP}


def selector(instance: str, component: str, campaign: str | None = None, share: str | None = None) -> dict[str, str]:
    """The matchLabels every watch, list and NetworkPolicy uses for one component (of one
    campaign's share: its controller watches its own pods alone)."""
    sel = {NAME: APP, INSTANCE: instance, COMPONENT: component}
    if campaign is not None:
        sel[CAMPAIGN] = label_value(campaign)
    if share is not None:
        sel[SHARE] = share
    return sel


def selector_string(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
