"""The cluster and node tiers' builds (issue 30, item 6: "the build plugins of the cluster and node
tiers"): each a bash script that prints the directory of what it built on its last line, cached
outside the repository by its pins (instant when warm). Run while pytest collects, outside any
test's timeout; a failed build is remembered and fails every test that needs it with the tail of
its log, never a skip."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest


def cache_root() -> Path:
    """Where every tier's builds are cached: $PROBE_RUNNER_CACHE, else ~/.cache/probe-runner."""
    return Path(os.environ.get("PROBE_RUNNER_CACHE") or Path.home() / ".cache" / "probe-runner")


class BuildFailed(RuntimeError):
    """The script failed, or built less than it must; the message holds the tail of its log."""


@dataclass
class Build:
    """One build script: ``run()`` runs it once per test session and returns its output
    directory, which must hold ``expect``."""

    name: str
    script: Path
    log: Path
    expect: tuple[str, ...] = ()  # executables the output directory must hold
    seconds: float = 0.0
    _out: Path | None = field(default=None, repr=False)
    _error: str | None = field(default=None, repr=False)

    def run(self) -> Path:
        if self._out is not None:
            return self._out
        if self._error is not None:
            raise BuildFailed(self._error)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with open(self.log, "wb") as log:
            # Its own process group, so an interrupted session also stops the builds it started
            # (the script then removes its temp dir: nothing half-built is ever cached).
            proc = subprocess.Popen(["bash", str(self.script)], stdout=subprocess.PIPE, stderr=log, start_new_session=True)
            try:
                out, _ = proc.communicate()
            except BaseException:
                _end_group(proc)
                raise
        self.seconds = time.monotonic() - started
        lines = out.decode(errors="replace").strip().splitlines()
        if proc.returncode != 0 or not lines:
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-60:])
            self._error = f"{self.script} failed (exit {proc.returncode}, {self.seconds:.0f}s); full log: {self.log}\n{tail}"
            raise BuildFailed(self._error)
        built = Path(lines[-1])
        if missing := [b for b in self.expect if not os.access(built / b, os.X_OK)]:
            self._error = f"{self.script} printed {built} but it lacks {missing}"
            raise BuildFailed(self._error)
        self._out = built
        return built

    def built(self) -> Path:
        """In a fixture: the output directory, or the test fails with why."""
        try:
            return self.run()
        except BuildFailed as exc:
            pytest.fail(f"cannot build {self.name}:\n{exc}", pytrace=False)


def _end_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group led by ``proc`` (started by us), then SIGKILL."""
    for sig, wait in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def build_while_collecting(config: pytest.Config, items: list[pytest.Item], tier: Path, builds: Iterable[Build],
                           note: str = "") -> None:
    """For a conftest's pytest_collection_modifyitems: run the tier's builds, saying so, when a
    collected test lies in ``tier``; a failure is said here and reported by each test's fixture."""
    if config.option.collectonly or not any(Path(i.path).resolve().is_relative_to(tier) for i in items):
        return
    capman = config.pluginmanager.getplugin("capturemanager")
    reporter = config.pluginmanager.getplugin("terminalreporter")

    def say(msg: str) -> None:
        if reporter is not None:
            reporter.write_line(msg)

    with capman.global_and_fixture_disabled() if capman is not None else contextlib.nullcontext():  # -p no:capture
        for b in builds:
            say(f"tests/{tier.name}: ensuring {b.name} ({b.script.name}; cache {cache_root()}{note}; log in {b.log})")
            try:
                out = b.run()
            except BuildFailed as exc:
                say(f"tests/{tier.name}: {b.name} BUILD FAILED: {str(exc).splitlines()[0]}")
            else:
                say(f"tests/{tier.name}: {b.name} in {out} ({b.seconds:.1f}s)")


REPO = Path(__file__).resolve().parents[2]
# The test control plane (tests/cluster/build.sh: etcd, the Kubernetes control plane, kwok), one
# build for the cluster and node tiers alike.
CONTROL_PLANE = Build("the control plane", REPO / "tests" / "cluster" / "build.sh", cache_root() / "cluster" / "last-build.log",
                      expect=("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok", "kwokctl"))
# gVisor (tests/node/build-gvisor.sh: runsc and its containerd shim), for the node tier's second
# runtime and for the integration tier's `runsc do` (tests/integration/test_gvisor_probe.py).
GVISOR = Build("gVisor (runsc and its containerd shim)", REPO / "tests" / "node" / "build-gvisor.sh",
               cache_root() / "last-gvisor-build.log", expect=("runsc", "containerd-shim-runsc-v1"))
