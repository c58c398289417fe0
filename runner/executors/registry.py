"""The executors by name: what `--executor` offers and what the service builds."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runner.executors.base import Executor
    from runner.metrics import Metrics
    from runner.settings import Settings

NAMES = ("local", "kubernetes")  # what --executor takes; the first is the embedded default


def make_executor(name: str, settings: Settings, metrics: Metrics | None = None) -> Executor:
    """The executor called ``name`` (one of NAMES), built for ``settings``; each is imported
    only when chosen (the Kubernetes client stays unloaded on a workstation run). ``metrics``
    (default: none) counts its Kubernetes API requests, or its run gateway's calls."""
    if name == "kubernetes":
        from runner.executors.kubernetes import KubernetesExecutor
        from runner.k8s.api import Kube

        return KubernetesExecutor(settings, Kube(settings.kube, metrics=metrics.api if metrics else None))
    if name == "local":
        from runner.executors.local import LocalExecutor

        return LocalExecutor(settings, gateway_metrics=metrics.gateway if metrics else None)
    raise ValueError(f"no executor {name!r}: one of {', '.join(NAMES)}")
