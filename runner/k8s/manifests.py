"""The session pod, as a pure function of the settings and the session (a plain dict; no I/O).

Layout, and why each part is there:

- Two containers. ``harness`` runs the Claude Code CLI as ``harness_uid``; every process of
  the session runs there. ``reader`` runs as ``reader_uid`` and holds the far end of the
  harness's standard output: a Unix socket on the ``socket`` volume, accepted once (a socket
  cannot be reopened through ``/proc/PID/fd``), written to the ``capture`` volume that only the
  reader mounts. Containers do not share a PID namespace, so the session cannot see, signal or
  trace the reader; the uids differ, so it could not even if it could see it.
- The workspace comes in and the changed files go out through the API (exec into ``reader``),
  never through a network path of the pod: the pod's only route out is the provider gateway
  (``Route``), or the egress proxy where the gateway is off.
- When the harness container's first process exits, the runtime kills every other process of
  that container (its PID namespace ends), so nothing the session left behind is running when
  the controller reads the artifacts.
- Hardened as the guide demands: non-root, read-only root filesystem, all capabilities dropped,
  no privilege escalation, seccomp RuntimeDefault, no service-account token, no service links,
  an environment that holds only what the harness needs, credentials from a Secret that the
  entry point copies into the configuration directory and removes at the end.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from runner import harnesses
from runner.gateway import tokens
from runner.harnesses.contract import Reach
from runner.k8s import names
from runner.plan import Plan
from runner.sandbox import CONFIG_DIR, WORKSPACE
from runner.settings import KubeSettings, Settings

SOCKET_DIR = "/run/probe/socket"
CAPTURE_DIR = "/run/probe/capture"
SECRET_DIR = "/run/probe/secret"
PROVIDER_CA_DIR = "/run/probe/provider-ca"
POD_MODULE = ["python3", "-m", "runner.entrypoints.pod"]

READER_RESOURCES = {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "256Mi"}}


# A session cannot move: evicting its pod ends it and may lose what it spent. Cluster
# autoscalers and Karpenter consolidate nodes by evicting pods, and respect these.
NOT_EVICTABLE = {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false", "karpenter.sh/do-not-disrupt": "true"}


def pod_name(instance: str, campaign: str, probe: str, session: str, attempt: int) -> str:
    """The install is part of the name: two installs in one namespace never share a pod."""
    return names.object_name(instance, campaign, probe, session, attempt)


def session_deadline(settings: Settings) -> int:
    """activeDeadlineSeconds of a session pod, and when its reader gives up: start, the
    session's time limit, then collection. Past it no controller can still be collecting, so a
    pod whose controller is gone does not run on with the credentials mounted."""
    k = settings.kube
    return math.ceil(k.start_timeout_seconds + settings.harness.timeout_seconds + k.collect_margin_seconds)


def _owned(k: KubeSettings) -> dict[str, Any]:
    """ownerReferences to the campaign's controller Job where it is known, so deleting the Job
    (by hand, or its TTL) deletes its pods. Not the controller reference: the Job controller
    must not count session pods as its own."""
    if not (k.owner_job and k.owner_uid):
        return {}
    return {"ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": k.owner_job, "uid": k.owner_uid}]}


def container_security(uid: int | None = None) -> dict[str, Any]:
    """The securityContext of every container we run (session pods, campaign and transform Jobs);
    ``uid`` where the container's user is not the pod's."""
    return {
        **({"runAsUser": uid, "runAsGroup": uid} if uid is not None else {}),
        "runAsNonRoot": True,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _env(pairs: dict[str, str]) -> list[dict[str, Any]]:
    return [{"name": k, "value": v} for k, v in pairs.items()]


def _provider_ca_volumes(k: KubeSettings) -> list[dict[str, Any]]:
    """The chart's provider.caBundle ConfigMap as a volume, where there is one (harness and canary)."""
    if not k.provider_ca_configmap:
        return []
    return [{"name": "provider-ca", "configMap": {
        "name": k.provider_ca_configmap, "defaultMode": 0o444, "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]


def _provider_ca_mounts(k: KubeSettings) -> list[dict[str, Any]]:
    return [{"name": "provider-ca", "mountPath": PROVIDER_CA_DIR, "readOnly": True}] if k.provider_ca_configmap else []


def _placement(k: KubeSettings) -> dict[str, Any]:
    """Where a session's pod may run (runtime class, node selector, tolerations, pull secrets):
    the session pod and its canary, so the canary measures the nodes sessions run on."""
    spec: dict[str, Any] = {}
    if k.runtime_class:
        spec["runtimeClassName"] = k.runtime_class
    if k.node_selector:
        spec["nodeSelector"] = dict(k.node_selector)
    if k.tolerations:
        spec["tolerations"] = [dict(t) for t in k.tolerations]
    if k.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": n} for n in k.image_pull_secrets]
    if k.priority_class:
        spec["priorityClassName"] = k.priority_class
    return spec


def harness_args(plan: Plan, settings: Settings) -> list[str]:
    """The harness's flags (docs/design.md; the task goes in on stdin, never as an argument)."""
    return [harnesses.HARNESS.executable, *harnesses.HARNESS.flags(plan, settings)]


@dataclass(frozen=True)
class Route:
    """How a session pod reaches the provider. Through the gateway: ``base_url`` is the
    gateway by address and ``token`` the attempt's own (runner/gateway/tokens.py); the pod gets
    no credential. Through the egress proxy (gateway.enabled false): ``base_url`` is the
    provider's, ``proxy`` the proxy by address, and the pod reads the credentials Secret.
    Addresses, because the pod may send no DNS query (runner.k8s.policy.session_route_url)."""

    base_url: str
    proxy: str | None = None
    token: str | None = None

    @property
    def gateway(self) -> str | None:
        """host:port of the gateway (the canary's target), or None through the proxy."""
        return None if self.proxy else urlsplit(self.base_url).netloc


def harness_env(settings: Settings, task: str, route: Route) -> list[dict[str, Any]]:
    k = settings.kube
    harness = harnesses.HARNESS
    variables = {**harness.environment(Reach(CONFIG_DIR, route.base_url, route.token, route.proxy)), **settings.harness.env}
    env = _env({
        **variables,
        # Read and removed from the environment by the entry point before the CLI starts.
        "PROBE_TASK": task,
        "PROBE_SOCKET_DIR": SOCKET_DIR,
        "PROBE_TIMEOUT_SECONDS": f"{settings.harness.timeout_seconds:g}",
    })
    if route.token is None:  # the egress proxy: the session reads the credentials, and TLS is its own
        env += _env({"PROBE_CREDENTIALS_FILE": f"{SECRET_DIR}/credentials.json",
                     "PROBE_CREDENTIALS_TARGET": harness.credentials_path(variables)})
        if k.provider_ca_configmap:
            env.append({"name": harness.ca_variable, "value": f"{PROVIDER_CA_DIR}/ca.crt"})
        if k.credentials_secret:
            env.append({"name": harness.credential_variable, "valueFrom": {"secretKeyRef": {
                "name": k.credentials_secret, "key": "api-key", "optional": True}}})
    return env


# gVisor's mount hints, which every other runtime ignores: the reader binds the socket the
# harness's entry point connects to, in the other container, and in gVisor's sandbox a Unix
# socket is found only through the mount it was bound in; as one mount of the pod's, shared by
# both containers (a tmpfs inside the sandbox), the volume holds one socket both reach. gVisor's
# containerd shim finds the volume under /var/lib/kubelet/pods (the kubelet's default root).
GVISOR_SOCKET_SHARED = {f"dev.gvisor.spec.mount.socket.{field}": value
                        for field, value in (("share", "pod"), ("type", "tmpfs"), ("options", "rw"))}


def session_pod(settings: Settings, plan: Plan, probe: str, session: str, attempt: int, task: str,
                route: Route, share: str | None = None) -> dict[str, Any]:
    """The pod of one session attempt, reaching the provider by ``route``; labelled with
    ``share``, the name of the split campaign's share that owns it (runner/share.py)."""
    k = settings.kube
    r = k.resources
    labels = {**names.session_labels(k.instance, plan.campaign, probe, session, attempt),
              **({names.SHARE: share} if share is not None else {})}
    volumes = [
        {"name": "workspace", "emptyDir": {"sizeLimit": r.ephemeral_storage_limit}},
        {"name": "config", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
        {"name": "tmp", "emptyDir": {"sizeLimit": r.ephemeral_storage_limit}},
        {"name": "socket", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
        {"name": "capture", "emptyDir": {"sizeLimit": k.capture_size_limit}},
    ]
    harness_mounts: list[dict[str, Any]] = [
        {"name": "workspace", "mountPath": WORKSPACE},
        {"name": "config", "mountPath": CONFIG_DIR},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "socket", "mountPath": SOCKET_DIR},
    ]
    if route.token is None:
        volumes += _provider_ca_volumes(k)
        harness_mounts += _provider_ca_mounts(k)
    if k.credentials_secret and route.token is None:
        volumes.append({"name": "credentials", "secret": {
            "secretName": k.credentials_secret, "optional": True, "defaultMode": 0o400,
            "items": [{"key": "credentials.json", "path": "credentials.json"}]}})
        harness_mounts.append({"name": "credentials", "mountPath": SECRET_DIR, "readOnly": True})
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "activeDeadlineSeconds": session_deadline(settings),
        "serviceAccountName": names.session_service_account(k.instance),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "shareProcessNamespace": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "terminationGracePeriodSeconds": 5,
        "securityContext": {
            "runAsNonRoot": True,
            "fsGroup": k.harness_uid,  # the workspace the reader unpacks is writable by the harness
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": "reader",
                "image": k.reader_image,
                "imagePullPolicy": k.image_pull_policy,
                "command": [*POD_MODULE, "reader"],
                "env": _env({
                    "PROBE_CAPTURE_DIR": CAPTURE_DIR,
                    "PROBE_SOCKET_DIR": SOCKET_DIR,
                    "PROBE_WORKSPACE": WORKSPACE,
                    "PROBE_HARNESS_UID": str(k.harness_uid),
                    "PROBE_DEADLINE_SECONDS": str(session_deadline(settings)),
                }),
                "resources": READER_RESOURCES,
                "securityContext": container_security(k.reader_uid),
                "volumeMounts": [
                    {"name": "capture", "mountPath": CAPTURE_DIR},
                    {"name": "socket", "mountPath": SOCKET_DIR},
                    {"name": "workspace", "mountPath": WORKSPACE},
                ],
            },
            {
                "name": "harness",
                "image": k.harness_image,
                "imagePullPolicy": k.image_pull_policy,
                "command": [*POD_MODULE, "harness", "--"],
                "args": harness_args(plan, settings),
                "workingDir": WORKSPACE,
                "env": harness_env(settings, task, route),
                "resources": {
                    "requests": {"cpu": r.cpu_request, "memory": r.memory_request},
                    "limits": {"cpu": r.cpu_limit, "memory": r.memory_limit, "ephemeral-storage": r.ephemeral_storage_limit},
                },
                "securityContext": container_security(k.harness_uid),
                "volumeMounts": harness_mounts,
            },
        ],
        "volumes": volumes,
    }
    spec.update(_placement(k))
    if k.spread_max_skew is not None:
        spec["topologySpreadConstraints"] = [{
            "maxSkew": k.spread_max_skew,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": names.selector(k.instance, names.SESSION_COMPONENT, plan.campaign)},
        }]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(k.instance, plan.campaign, probe, session, attempt),
            "namespace": k.namespace,
            **_owned(k),
            "labels": labels,
            "annotations": {
                names.CAMPAIGN: plan.campaign,
                names.PROBE: probe,
                names.SESSION: session,
                names.ATTEMPT: str(attempt),
                **NOT_EVICTABLE,
                **GVISOR_SOCKET_SHARED,
            },
        },
        "spec": spec,
    }


CANARY_PROBE = tokens.CANARY_PROBE  # the probe label of canary pods (they carry no probe annotation: never taken for a session)
CANARY_DEADLINE_SECONDS = 120


def canary_pod_name(instance: str, campaign: str, check: int) -> str:
    return names.object_name(instance, campaign, CANARY_PROBE, check)


def canary_session(check: int) -> str:
    """The session label (and token claim) of check number ``check``'s canary."""
    return f"check-{check}"


def canary_pod(settings: Settings, campaign: str, check: int, routes_b64: str, route: Route,
               share: str | None = None) -> dict[str, Any]:
    """The confinement canary of check number ``check`` (runner/k8s/canary.py; of the split
    campaign's ``share``, labelled so, as its session pods are): a session pod's
    labels, image, uid, security context and route (through the gateway, the check's own token,
    limited to $0, where ``route`` has one),
    running the canary instead of the harness, bounded by ``activeDeadlineSeconds``;
    ``routes_b64`` is ``runner.k8s.canary.encode`` of its routes. Its report is its termination
    message."""
    k = settings.kube
    reach = {"HTTPS_PROXY": route.proxy} if route.proxy else {"PROBE_GATEWAY": route.gateway or "",
                                                              **({"PROBE_TOKEN": route.token} if route.token else {})}
    # The provider's CA only where the canary speaks TLS to the provider itself (through the proxy).
    ca = bool(k.provider_ca_configmap and route.proxy)
    volumes, mounts = (_provider_ca_volumes(k), _provider_ca_mounts(k)) if ca else ([], [])
    args = [routes_b64, *([f"{PROVIDER_CA_DIR}/ca.crt"] if ca else [])]
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "activeDeadlineSeconds": CANARY_DEADLINE_SECONDS,
        "serviceAccountName": names.session_service_account(k.instance),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 0,
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{
            "name": "canary",
            "image": k.harness_image,
            "imagePullPolicy": k.image_pull_policy,
            "command": ["python3", "-m", "runner.entrypoints.canary"],
            "args": args,
            "env": [*_env({"PATH": "/usr/local/bin:/usr/bin:/bin", **reach}),
                    {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}}],
            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "128Mi"}},
            "securityContext": container_security(k.harness_uid),
            "terminationMessagePolicy": "FallbackToLogsOnError",  # a crash reports its last lines
            "volumeMounts": mounts,
        }],
        "volumes": volumes,
        **_placement(k),
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": canary_pod_name(k.instance, campaign, check),
            "namespace": k.namespace,
            **_owned(k),
            "labels": {**names.session_labels(k.instance, campaign, CANARY_PROBE, canary_session(check), 1),
                       **({names.SHARE: share} if share is not None else {})},
            "annotations": {names.CAMPAIGN: campaign, names.CANARY: str(check)},
        },
        "spec": spec,
    }
