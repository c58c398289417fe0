"""`probe-runner doctor`: whether this host (and, with a cluster, the install) can run a
campaign, before one is run. Each check is one line: what holds, or what is wrong and what to
do. Nothing is journaled or spent: the provider is asked a token count, which costs nothing.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import SecretStr

from runner import harnesses
from runner.errors import UserError
from runner.k8s import images
from runner.plan import Plan
from runner.settings import KubeSettings, Settings, price_of

PROVIDER_TIMEOUT = 20.0  # seconds for the provider's answer to the token count
NAMED_NODES = 10  # nodes a line names; the rest it counts


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    says: str  # what holds, or what is wrong and what to do
    warn: bool = False  # it holds, but something will cost time (the first pods' image pulls): not a failure


class Caveat(Exception):
    """What a check raises where the install works but something will cost time, or could not
    be checked from here: a WARN line, not a failure."""


def _run(name: str, fn: Callable[[], str]) -> Check:
    """A check passes when ``fn`` returns what holds; a UserError (or an OSError) is the
    failure, its message what to do; a Caveat holds, with what to know."""
    try:
        return Check(name, True, fn())
    except Caveat as e:
        return Check(name, True, str(e), warn=True)
    except (UserError, OSError) as e:
        return Check(name, False, str(e))


def local_checks(settings: Settings, plan: Plan | None = None) -> list[Check]:
    """This host's checks; with ``plan``, also whether its model may run on this host's harness."""
    checks = [
        _run("confinement", lambda: _confinement(settings)),
        _run("harness", lambda: _harness_version(settings)),
        _run("store", lambda: _store(settings)),
        _run("provider", lambda: _provider(settings)),
    ]
    if plan is not None:
        checks.append(_run("model", lambda: _model(settings, plan, _reported(settings))))
    return checks


def _reported(settings: Settings) -> str | None:
    found = shutil.which(settings.harness.command)
    if not found:
        return None
    out = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=60)
    return out.stdout.strip() or None


def _confinement(settings: Settings) -> str:
    """What a local run's preflight does: bwrap creates its namespaces around the harness."""
    from runner.executors.local import LocalExecutor

    if settings.provider.api_key is None and settings.provider.credentials_file is None:  # the provider check says so
        settings = settings.model_copy(update={"provider": settings.provider.model_copy(update={"api_key": SecretStr("-")})})
    executor = LocalExecutor(settings)
    executor.preflight()
    return f"bubblewrap confines the harness ({executor.harness_version})"


def _harness_version(settings: Settings) -> str:
    harness = harnesses.HARNESS
    found = shutil.which(settings.harness.command)
    if not found:
        raise UserError(f"the harness {settings.harness.command!r} is not on PATH: "
                        f"{harness.install}")
    out = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=60)
    version = out.stdout.split()[0] if out.stdout.split() else ""
    qualified = ", ".join(sorted(harness.qualified))
    if out.returncode != 0 or version not in harness.qualified:
        raise UserError(f"the harness {found} is version {version or '(none: ' + out.stderr.strip()[:80] + ')'}; the "
                        f"recorder is qualified with {qualified} (pinned {harness.version}): {harness.install}, or qualify "
                        f"it: probe-runner harness qualify --cli {found}")
    pinned = "the pinned version" if version == harness.version else f"qualified (the pin is {harness.version})"
    return f"{found} is {version}, {pinned}"


def _model(settings: Settings, plan: Plan, version: str | None) -> str:
    """What `run` and `submit` check of the plan's model before anything is spent (runner/admission.py)."""
    from runner.admission import refusals, version_of

    if why := refusals(plan.model, version, settings):
        raise UserError("; ".join(why))
    v = version_of(version)
    sends = harnesses.HARNESS.qualification(v, plan.model)
    assert sends is not None
    priced = price_of(settings.gateway.prices, sends.model)
    price = f"metered at ${priced.input}/${priced.output} per million input/output tokens" if priced else "not priced (no budget)"
    alias = f", whose requests name {sends.model}" if sends.model != plan.model else ""
    return f"{plan.model} is qualified with {harnesses.HARNESS.name} {v}{alias}; {price}"


def _store(settings: Settings) -> str:
    from runner.store import StoreError, open_store

    key = f"doctor/{secrets.token_hex(8)}"
    try:
        store = open_store(settings.store, settings)
        data = secrets.token_bytes(32)
        store.put(key, data, create_only=True)
        if store.get(key) != data:
            raise UserError(f"store {settings.store}: what was written did not read back")
        store.delete(key)
    except (StoreError, OSError) as e:
        raise UserError(f"store {settings.store} is not writable ({e}): check RUNNER_STORE and its credentials") from None
    return f"{settings.store} is reachable and writable"


def _provider(settings: Settings) -> str:
    p = settings.provider
    if p.api_key is None:
        if p.credentials_file is not None and p.credentials_file.is_file():
            return f"a credentials.json login ({p.credentials_file}): it cannot be checked without a session"
        raise UserError("no credentials: set RUNNER_PROVIDER__API_KEY (or RUNNER_PROVIDER__CREDENTIALS_FILE)")
    body = json.dumps({"model": harnesses.HARNESS.calls.key_check_model, "messages": [{"role": "user", "content": "doctor"}]}).encode()
    url = p.base_url.rstrip("/") + "/v1/messages/count_tokens"
    req = urllib.request.Request(url, data=body, method="POST", headers={
        "x-api-key": p.api_key.get_secret_value(), "anthropic-version": "2023-06-01", "content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=PROVIDER_TIMEOUT) as resp:
            status = resp.status
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            raise UserError(f"the provider at {p.base_url} refused the key (HTTP {e.code}): check RUNNER_PROVIDER__API_KEY") from None
        raise UserError(f"the provider at {p.base_url} answered a token count with HTTP {e.code}: "
                        f"{e.read()[:200].decode(errors='replace')}") from None
    except (urllib.error.URLError, TimeoutError) as e:
        reason = getattr(e, "reason", e)
        raise UserError(f"the provider at {p.base_url} cannot be reached ({reason}): check RUNNER_PROVIDER__BASE_URL "
                        "and this host's network") from None
    return f"{p.base_url} accepts the key (a token count, HTTP {status}; nothing spent)"


def cluster_checks(settings: Settings, plan: Plan | None = None) -> list[Check]:
    """The install this host's kubeconfig reaches, not this host: the chart's settings, its
    bucket (written and read from here, as submit and pull do), a ready provider gateway (or
    egress proxy, where the gateway is off), which session nodes lack the session images (a
    warning: their first pods wait for the pull), and one confinement check by a canary pod (where
    kube.canary_enabled), whose routes include the provider's answer to the gateway's key."""
    from runner.k8s.api import Kube

    kube = Kube(settings.kube)
    k = settings.kube
    found: dict[str, Settings] = {}

    def chart() -> str:
        from runner.k8s import jobs

        name = jobs.settings_config_map(k.instance)
        found["install"] = jobs.install_settings(kube.config_map_data(name), settings, f"ConfigMap {k.namespace}/{name}")
        return f"the chart is installed as {k.instance} in {k.namespace} (ConfigMap {name})"

    def route() -> str:
        from runner.k8s import names, policy

        install = found.get("install", settings)
        component, _, _ = policy.route(install)
        what = "provider gateway" if component == names.GATEWAY_COMPONENT else "egress proxy"
        pods, _ = kube.list_pods(names.selector_string(names.selector(k.instance, component)))
        ready = [p["metadata"]["name"] for p in pods if any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in (p.get("status") or {}).get("conditions") or [])]
        if not ready:
            raise UserError(f"no {what} pod of {k.instance} is ready in {k.namespace} ({len(pods)} found): "
                            f"kubectl -n {k.namespace} describe deployment {k.instance}-{component}")
        return f"{len(ready)} {what} pod(s) ready"

    def confinement() -> str:
        install = found.get("install")
        if install is None:
            raise UserError("not measured: the chart's settings were not found (above)")
        if not install.kube.canary_enabled:
            return "not measured: the install sets kube.canary_enabled false (its transcripts say so)"
        from runner.executors.kubernetes import KubernetesExecutor
        from runner.k8s.confinement import ConfinementMonitor

        executor = KubernetesExecutor(install, kube)
        executor.preflight()
        assert executor.route is not None
        check = ConfinementMonitor(install, kube, "doctor", executor.route, executor.foreign_policies).check()
        if not check.passed:
            raise UserError(f"the confinement check failed: {check.problem}")
        opened = "; ".join(r.name for r in check.results if r.must_open)
        return f"a canary found every route closed but {opened} ({len(check.results)} routes)"

    def store() -> str:
        return _store(found.get("install", settings))

    def node_images() -> str:
        install = found.get("install")
        if install is None:
            raise UserError("not checked: the chart's settings were not found (above)")
        try:
            nodes = kube.list_nodes()
        except UserError as e:
            raise Caveat(f"not checked: {e}; a ClusterRole with list on nodes lets doctor say which session nodes "
                         "lack the images") from None
        return images_on_nodes(install.kube, nodes)

    def runtime() -> str:
        install = found.get("install")
        if install is None:
            raise UserError("not checked: the chart's settings were not found (above)")
        name = install.kube.runtime_class
        if not name:
            return session_runtime(None, None)
        try:
            return session_runtime(name, kube.runtime_class(name))
        except UserError as e:
            if "may not read" not in str(e):
                raise
            raise Caveat(f"RuntimeClass {name}, not checked: {e}") from None

    def model() -> str:
        assert plan is not None
        install = found.get("install")
        if install is None:
            raise UserError("not checked: the chart's settings were not found (above)")
        return _model(install.model_copy(update={"budget": settings.budget}), plan, None)  # the harness image's pinned CLI

    checks = [_run("chart", chart), _run("store", store), _run("route", route), _run("runtime", runtime),
              _run("images", node_images), _run("cluster confinement", confinement)]
    return checks + ([_run("model", model)] if plan is not None else [])


GVISOR_HANDLERS = ("runsc", "gvisor")  # the handler names gVisor's installs give it (containerd runtimes.runsc)


def session_runtime(name: str | None, runtime_class: dict[str, Any] | None) -> str:
    """Which runtime session pods run under: the nodes' default (no RuntimeClass), or the
    RuntimeClass ``name`` (as read: None where it does not exist, so every session pod would be
    refused at admission) with its handler, and what gVisor asks of the harness image."""
    if name is None:
        return ("session pods run under each node's default runtime (kube.runtime_class unset: runc where "
                "containerd's default is); session.runtimeClassName: gvisor runs them in gVisor's sandbox")
    if runtime_class is None:
        raise UserError(f"RuntimeClass {name} does not exist: the API server refuses every session pod naming it "
                        f"(create it, or set session.runtimeClassName to one that exists: kubectl get runtimeclass)")
    handler = str(runtime_class.get("handler", ""))
    says = f"session pods run under RuntimeClass {name} (handler {handler})"
    if any(handler.startswith(g) for g in GVISOR_HANDLERS):
        says += (": gVisor's sandbox; the harness image must be its gVisor variant (images.harness "
                 "ghcr.io/probe-runner/harness:<version>-gvisor: gVisor loads only readable executables)")
    return says


def _named(nodes: list[str]) -> str:
    more = len(nodes) - NAMED_NODES
    return ", ".join(nodes[:NAMED_NODES]) + (f" and {more} more" if more > 0 else "")


def images_on_nodes(k: KubeSettings, nodes: list[dict[str, Any]]) -> str:
    """Whether the nodes session pods may land on (by the install's nodeSelector and tolerations)
    report the harness and the runner image (every session pod runs both): where one is missing,
    the first session pods there wait for its pull."""
    where = images.session_nodes(nodes, k.node_selector, k.tolerations)
    if not where:
        raise Caveat(f"none of the {len(nodes)} nodes admits session pods (nodeSelector {json.dumps(k.node_selector)}, "
                     f"{len(k.tolerations)} tolerations, cordoned nodes left out): session pods wait until one does")
    wanted = {"harness": k.harness_image, "runner": k.reader_image}
    missing = {what: images.lacking(where, ref) for what, ref in wanted.items()}
    if not any(missing.values()):
        return f"all {len(where)} session nodes report the harness image {k.harness_image} and the runner image {k.reader_image}"
    lack = [f"{len(m)} {'lacks' if len(m) == 1 else 'lack'} the {what} image {wanted[what]} ({_named(m)})"
            for what, m in missing.items() if m]
    raise Caveat(f"of {len(where)} session nodes, {' and '.join(lack)}: the first session pods there wait for the pull "
                 "(images.prePull.enabled pulls them ahead); a node reports at most 50 images, its largest (the "
                 "kubelet's nodeStatusMaxImages), so one it does not report may still be there")
