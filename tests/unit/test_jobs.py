"""The controller Job builder, against complete expected dicts."""

from __future__ import annotations

from runner.k8s import jobs, names
from runner.settings import Settings

HARDENED = {"runAsNonRoot": True, "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
            "privileged": False, "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


def test_controller_job_complete():
    settings = Settings(store="s3://b/p", kube={
        "namespace": "probes", "instance": "team-a", "reader_image": "registry.example/runner:1.2.3",
        "image_pull_policy": "Always", "image_pull_secrets": ["pull"], "store_secret": "bucket",
        "controller_resources": {"cpu_request": "250m", "memory_request": "512Mi", "cpu_limit": "1",
                                 "memory_limit": "2Gi", "ephemeral_storage_limit": "5Gi"}})
    campaign = "status-2026-12-02"
    job = jobs.controller_job(settings, campaign)
    labels = {"app.kubernetes.io/name": "probe-runner", "app.kubernetes.io/instance": "team-a",
              "app.kubernetes.io/component": "controller", "app.kubernetes.io/part-of": "probe-runner",
              "app.kubernetes.io/managed-by": "probe-runner", "probe-runner.io/campaign": campaign}
    assert job == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": names.object_name("controller", campaign), "namespace": "probes", "labels": labels,
                     "annotations": {"probe-runner.io/campaign": campaign}},
        "spec": {
            "backoffLimit": 3,
            "ttlSecondsAfterFinished": 604800,
            "podFailurePolicy": {"rules": [
                {"action": "FailJob", "onExitCodes": {"containerName": "controller", "operator": "In",
                                                      "values": [2, 3, 12]}},
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
            ]},
            "template": {
                "metadata": {"labels": labels, "annotations": {"probe-runner.io/campaign": campaign}},
                "spec": {
                    "serviceAccountName": "team-a-controller",
                    "automountServiceAccountToken": True,
                    "enableServiceLinks": False,
                    "restartPolicy": "Never",
                    "securityContext": {"runAsNonRoot": True, "runAsUser": 10002, "runAsGroup": 10002,
                                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{
                        "name": "controller",
                        "image": "registry.example/runner:1.2.3",
                        "imagePullPolicy": "Always",
                        "command": ["probe-runner", "controller", "--campaign", campaign],
                        "envFrom": [{"configMapRef": {"name": "team-a-settings"}}, {"secretRef": {"name": "bucket"}}],
                        "env": [{"name": "TMPDIR", "value": "/tmp"}, {"name": "RUNNER_LOG__FORMAT", "value": "json"},
                                {"name": "RUNNER_LOG__LEVEL", "value": "info"},
                                # the owner of the session pods it creates: the Job itself, from its pod's labels
                                {"name": "RUNNER_KUBE__OWNER_JOB", "valueFrom": {"fieldRef": {
                                    "fieldPath": "metadata.labels['batch.kubernetes.io/job-name']"}}},
                                {"name": "RUNNER_KUBE__OWNER_UID", "valueFrom": {"fieldRef": {
                                    "fieldPath": "metadata.labels['batch.kubernetes.io/controller-uid']"}}}],
                        "resources": {"requests": {"cpu": "250m", "memory": "512Mi"},
                                      "limits": {"cpu": "1", "memory": "2Gi", "ephemeral-storage": "5Gi"}},
                        "securityContext": HARDENED,
                        "volumeMounts": [{"name": "scratch", "mountPath": "/tmp"}],
                    }],
                    "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "5Gi"}}],
                    "imagePullSecrets": [{"name": "pull"}],
                },
            },
        },
    }


def test_controller_job_without_bucket_secret_or_pull_secrets():
    """With IRSA-style access there is no Secret to name, and none is invented."""
    job = jobs.controller_job(Settings(store="s3://b/p"), "c")
    spec = job["spec"]["template"]["spec"]
    assert spec["containers"][0]["envFrom"] == [{"configMapRef": {"name": "probe-runner-settings"}}]
    assert "imagePullSecrets" not in spec
    assert spec["serviceAccountName"] == "probe-runner-controller"
    assert job["metadata"]["namespace"] == "probe-runner"
    # One Job per campaign: the same campaign always names the same Job, another never does.
    assert job["metadata"]["name"] == jobs.controller_job(Settings(store="s3://x/y"), "c")["metadata"]["name"]
    assert job["metadata"]["name"] != jobs.controller_job(Settings(store="s3://b/p"), "C")["metadata"]["name"]


def test_transform_job_is_the_controller_job_without_api_access():
    """The transform reads and writes only the bucket: same pod, its own command and name, no token."""
    settings = Settings(store="s3://b/p", kube={"store_secret": "bucket"})
    ctl, tr = jobs.controller_job(settings, "c1"), jobs.transform_job(settings, "c1")
    assert tr["metadata"]["name"] == names.object_name("transform", "c1") != ctl["metadata"]["name"]
    assert tr["metadata"]["labels"]["app.kubernetes.io/component"] == "transform"
    pod, ctl_pod = tr["spec"]["template"]["spec"], ctl["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and ctl_pod["automountServiceAccountToken"] is True
    assert pod["containers"][0]["name"] == "transform"
    assert pod["containers"][0]["command"] == ["probe-runner", "transform", "c1"]
    assert tr["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"]["containerName"] == "transform"
    # and without the owner's name and uid: it creates no pods
    assert {e["name"] for e in ctl_pod["containers"][0]["env"]} - {e["name"] for e in pod["containers"][0]["env"]} == {
        "RUNNER_KUBE__OWNER_JOB", "RUNNER_KUBE__OWNER_UID"}
    same = lambda p: {**p, "automountServiceAccountToken": None,  # noqa: E731
                      "containers": [{**p["containers"][0], "name": None, "command": None,
                                      "env": [e for e in p["containers"][0]["env"] if "OWNER" not in e["name"]]}]}
    assert same(pod) == same(ctl_pod)


def test_install_settings_lay_the_config_map_over_the_local_settings():
    local = Settings(store="s3://mine/x", concurrency=7, kube={"namespace": "probes", "reader_image": "local:1"})
    data = {
        "RUNNER_STORE": "s3://install",
        "RUNNER_KUBE__READER_IMAGE": "registry.example/runner:2.0.0",
        "RUNNER_KUBE__IMAGE_PULL_SECRETS": '["pull"]',
        "RUNNER_KUBE__NODE_SELECTOR": '{"pool": "probes"}',
        "RUNNER_KUBE__SPREAD_MAX_SKEW": "0",
        "RUNNER_KUBE__CONTROLLER_RESOURCES__CPU_LIMIT": "3",
        "RUNNER_S3__ENDPOINT_URL": "http://minio:9000",
        "NOT_OURS": "ignored",
    }
    s = jobs.install_settings(data, local)
    assert s.store == "s3://install" and s.s3.endpoint_url == "http://minio:9000"
    assert s.kube.reader_image == "registry.example/runner:2.0.0" and s.kube.image_pull_secrets == ["pull"]
    assert s.kube.node_selector == {"pool": "probes"} and s.kube.spread_max_skew is None
    assert s.kube.controller_resources.cpu_limit == "3" and s.kube.controller_resources.memory_limit == "4Gi"
    assert s.concurrency == 7 and s.kube.namespace == "probes"  # not in the ConfigMap: the local value
    job = jobs.controller_job(s, "c")["spec"]["template"]["spec"]
    assert job["containers"][0]["image"] == "registry.example/runner:2.0.0" and job["imagePullSecrets"] == [{"name": "pull"}]


def test_install_settings_name_a_bad_config_map_in_one_line():
    import pytest

    from runner.errors import UserError

    with pytest.raises(UserError, match=r"^ConfigMap p/x: concurrency: Input should be a valid integer"):
        jobs.install_settings({"RUNNER_CONCURRENCY": "many"}, Settings(store="s3://b/p"), "ConfigMap p/x")
    with pytest.raises(UserError, match=r"^ConfigMap p/x: RUNNER_KUBE__NODE_SELECTOR is not JSON: \{pool: probes$"):
        jobs.install_settings({"RUNNER_KUBE__NODE_SELECTOR": "{pool: probes"}, Settings(store="s3://b/p"), "ConfigMap p/x")
    # an empty entry is an empty string, as in the environment, not a JSON document
    assert jobs.install_settings({"RUNNER_KUBE__STORE_SECRET": ""}, Settings(store="s3://b/p")).kube.store_secret == ""


def test_a_submitted_budget_is_the_controller_jobs_flags_and_the_controller_takes_them():
    """`submit --budget-usd/--session-budget-usd` reach the campaign's controller as flags,
    over the install's ConfigMap; without them the Job's command names no budget."""
    from decimal import Decimal

    from click.testing import CliRunner

    from runner.cli import cli
    from runner.settings import BudgetSettings

    s = Settings(store="s3://b/p")
    plain = jobs.controller_job(s, "c")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert plain == ["probe-runner", "controller", "--campaign", "c"]
    job = jobs.controller_job(s, "c", BudgetSettings(campaign_usd=Decimal("250"), session_usd=Decimal("2.5")))
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command == ["probe-runner", "controller", "--campaign", "c", "--budget-usd", "250", "--session-budget-usd", "2.5"]
    helped = CliRunner().invoke(cli, ["controller", "--help"])
    assert "--budget-usd" in helped.output and "--session-budget-usd" in helped.output
    refused = CliRunner().invoke(cli, ["run", "plan.json", "--corpus", ".", "--budget-usd", "-1"])
    assert refused.exit_code == 2 and "--budget-usd" in refused.output


def test_the_examples_of_a_store_do_not_name_the_campaigns_folder_again():
    """Issue 29: "the README's and the values' example s3://…/campaigns puts objects under
    campaigns/campaigns/<campaign>/". Every campaign lives under <store>/campaigns/<campaign>/,
    so no example store the README and docs/, the chart's values or the plain manifests give ends in
    /campaigns."""
    import re
    from pathlib import Path

    from runner import layout

    repo = Path(__file__).resolve().parents[2]
    assert layout.plan_key("c").startswith("campaigns/c/")
    texts = {p: p.read_text() for p in [repo / "README.md", *(repo / "docs").glob("*.md"), repo / "k8s" / "probe-runner.yaml",
                                        *(repo / "helm" / "probe-runner").rglob("*.yaml")]}
    stores = [(p.name, m) for p, t in texts.items() for m in re.findall(r"s3://[A-Za-z0-9.…/_-]+", t)]
    assert stores and not [s for s in stores if s[1].rstrip("/").endswith("/campaigns")], stores
