"""The Jobs of one campaign, the controller's and the transform's, as pure functions of the
settings (plain dicts; no I/O).

Why a Job per campaign, created by ``probe-runner submit``, and not a Deployment that watches
for campaigns: the controller is already a run-to-the-end program (``probe-runner controller
--campaign C``) that is safe to restart, so the Job controller's retry is all the supervision
it needs; a campaign's whole life is one object an operator can list, read and delete; and no
second source of "which campaigns exist" (a CRD, a queue) has to be kept in step with the
bucket.

What the Job refers to is installed by the Helm chart (helm/probe-runner) under names derived
from the install name (``kube.instance``, the Helm release), so a user needs only the namespace
and the install name to submit:

- the ServiceAccount ``<instance>-controller``, whose Role allows exactly what the controller
  does to session pods (see the chart's role.yaml);
- the ConfigMap ``<instance>-settings``: the ``RUNNER_*`` settings of the install, taken whole
  as the container's environment, so the controller runs with the operator's settings and not
  with whatever the submitting workstation has;
- ``kube.store_secret``, when set: the bucket credentials.

Exit statuses 2 (bad input) and 12 (refused or not confinable) are outcomes a second run
cannot change, so they fail the Job at once. Anything else is retried up to ``BACKOFF_LIMIT``
times: a crash, an OOM kill, a lost node, and exit 1, which says some sessions never started
(a pod that could not be scheduled: the next run starts them) or were interrupted (reported
again, never re-run). A retry is safe because a restarted controller adopts live pods and never
repeats a session. A disruption (eviction, preemption) is not counted against the limit.
"""

from __future__ import annotations

from typing import Any

from runner.errors import EXIT_BUDGET, EXIT_CONFINEMENT, EXIT_USAGE
from runner.k8s import names
from runner.k8s.manifests import container_security
from runner.settings import BudgetSettings, Settings, settings_over

TRANSFORM_COMPONENT = "transform"
BACKOFF_LIMIT = 3
TTL_SECONDS = 7 * 24 * 3600  # finished Jobs stay a week for `kubectl logs`; the record is in the bucket
FINAL_EXIT_CODES = [EXIT_USAGE, EXIT_BUDGET, EXIT_CONFINEMENT]  # bad input, over budget, unconfined: a retry meets the same
SCRATCH = "/tmp"
# The Job's own name and uid, from the labels the Job controller puts on its pods: the owner of
# the session pods the controller creates (settings kube.owner_job, kube.owner_uid).
OWNER_ENV = [{"name": "RUNNER_KUBE__OWNER_JOB", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['batch.kubernetes.io/job-name']"}}},
             {"name": "RUNNER_KUBE__OWNER_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['batch.kubernetes.io/controller-uid']"}}}]
JOB_LOG_ENV = [{"name": "RUNNER_LOG__FORMAT", "value": "json"}, {"name": "RUNNER_LOG__LEVEL", "value": "info"}]


def controller_service_account(instance: str) -> str:
    return f"{instance}-controller"


def settings_config_map(instance: str) -> str:
    return f"{instance}-settings"


def install_settings(config_map: dict[str, str], local: Settings, where: str = "the settings ConfigMap") -> Settings:
    """The settings an install's Jobs run with: the ``RUNNER_*`` entries of its settings
    ConfigMap (what the Job's environment will hold) laid over ``local``, read as the Job's
    environment will be. ``submit`` builds the Job from these, so the chart's values (image,
    resources, bucket) are what runs, whatever the submitting workstation has set."""
    return settings_over(local, config_map, where)


def job_name(campaign: str, action: str = "controller") -> str:
    return names.object_name(action, campaign)


def controller_job(settings: Settings, campaign: str, budget: BudgetSettings | None = None,
                   resume: list[str] | None = None) -> dict[str, Any]:
    """The Job that runs every session of ``campaign`` as pods, then the transform; ``budget``:
    the submitter's limits, as flags over the install's (its ConfigMap's) where set. With
    ``resume`` (sessions, each interrupted or failed), the campaign's resume Job instead: a new
    attempt of each, beside whatever has not run (``ledger resume --job``)."""
    flags = []
    if budget is not None and budget.campaign_usd is not None:
        flags += ["--budget-usd", str(budget.campaign_usd)]
    if budget is not None and budget.session_usd is not None:
        flags += ["--session-budget-usd", str(budget.session_usd)]
    for session in resume or []:
        flags += ["--resume", session]
    shares = 1 if resume else settings.kube.controllers  # a resume Job runs its few sessions in one pod
    if shares > 1:  # each pod's index (JOB_COMPLETION_INDEX, from the Job controller) is its share
        flags += ["--shares", str(shares)]
    job = _runner_job(settings, campaign, "resume" if resume else "controller", names.CONTROLLER_COMPONENT,
                      ["probe-runner", "controller", "--campaign", campaign, *flags], api_access=True)
    return job if shares == 1 else indexed(job, shares)


def indexed(job: dict[str, Any], shares: int) -> dict[str, Any]:
    """``job`` as an Indexed Job of ``shares`` pods at once, one per share of the campaign
    (runner/share.py). Each index is retried on its own (backoffLimitPerIndex), so a lost
    controller delays its share alone; exit 3 (over its part of the budget) fails its index
    alone, where bad input and an unconfined cluster, which every share meets, fail the Job."""
    spec = {k: v for k, v in job["spec"].items() if k != "backoffLimit"}
    action = job["spec"]["template"]["spec"]["containers"][0]["name"]
    spec["podFailurePolicy"] = {"rules": [
        {"action": "FailJob", "onExitCodes": {"containerName": action, "operator": "In",
                                              "values": [c for c in FINAL_EXIT_CODES if c != EXIT_BUDGET]}},
        {"action": "FailIndex", "onExitCodes": {"containerName": action, "operator": "In", "values": [EXIT_BUDGET]}},
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
    ]}
    return {**job, "spec": {"completionMode": "Indexed", "completions": shares, "parallelism": shares,
                            "backoffLimitPerIndex": BACKOFF_LIMIT, **spec}}


def job_command(job: dict[str, Any]) -> list[str]:
    """The command a Job's one container runs: what a submit's settings change (its flags)."""
    return list(job["spec"]["template"]["spec"]["containers"][0]["command"])


def transform_job(settings: Settings, campaign: str) -> dict[str, Any]:
    """The transform Job alone (``probe-runner transform C``), for a campaign whose
    sessions changed after its controller ended (``ledger cancel``, ``ledger resume``). It
    reads and writes only the bucket, so it mounts no API token; it keeps the controller's
    ServiceAccount for bucket access granted to it (IRSA)."""
    return _runner_job(settings, campaign, "transform", TRANSFORM_COMPONENT, ["probe-runner", "transform", campaign],
                       api_access=False)


def _runner_job(settings: Settings, campaign: str, action: str, component: str, command: list[str],
                api_access: bool) -> dict[str, Any]:
    k = settings.kube
    r = k.controller_resources
    labels = {**names.component_labels(k.instance, component), names.CAMPAIGN: names.label_value(campaign)}
    env_from: list[dict[str, Any]] = [{"configMapRef": {"name": settings_config_map(k.instance)}}]
    if k.store_secret:
        env_from.append({"secretRef": {"name": k.store_secret}})
    pod_spec: dict[str, Any] = {
        "serviceAccountName": controller_service_account(k.instance),
        "automountServiceAccountToken": api_access,  # only the controller talks to the API server
        "enableServiceLinks": False,
        "restartPolicy": "Never",
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": k.reader_uid,
            "runAsGroup": k.reader_uid,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [{
            "name": action,
            "image": k.reader_image,  # the runner image: reader and controller are one package
            "imagePullPolicy": k.image_pull_policy,
            "command": command,
            "envFrom": env_from,
            # Scratch (sealed workspaces, the corpus, stream spools) on the one writable volume;
            # diagnostics as JSON lines naming each session, for the cluster's log collector.
            "env": [{"name": "TMPDIR", "value": SCRATCH}, *JOB_LOG_ENV, *(OWNER_ENV if api_access else [])],
            "resources": {
                "requests": {"cpu": r.cpu_request, "memory": r.memory_request},
                "limits": {"cpu": r.cpu_limit, "memory": r.memory_limit, "ephemeral-storage": r.ephemeral_storage_limit},
            },
            "securityContext": container_security(),
            "volumeMounts": [{"name": "scratch", "mountPath": SCRATCH}],
            # the run's metrics listener (metrics.port), which the chart's controller-metrics Service names
            **({"ports": [{"name": "metrics", "containerPort": settings.metrics.port, "protocol": "TCP"}]}
               if component == names.CONTROLLER_COMPONENT and settings.metrics.port else {}),
        }],
        "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": r.ephemeral_storage_limit}}],
    }
    if k.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in k.image_pull_secrets]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(campaign, action),
            "namespace": k.namespace,
            "labels": labels,
            "annotations": {names.CAMPAIGN: campaign},
        },
        "spec": {
            "backoffLimit": BACKOFF_LIMIT,
            "ttlSecondsAfterFinished": TTL_SECONDS,
            "podFailurePolicy": {"rules": [
                {"action": "FailJob", "onExitCodes": {"containerName": action, "operator": "In",
                                                      "values": FINAL_EXIT_CODES}},
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
            ]},
            "template": {"metadata": {"labels": labels, "annotations": {names.CAMPAIGN: campaign}},
                         "spec": pod_spec},
        },
    }
