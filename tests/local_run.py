"""One local run as `probe-runner run` makes it, for the tests that drive run_sessions
directly: the local executor, closed afterwards (its provider gateway with it)."""

from __future__ import annotations

import os
from pathlib import Path

from runner.campaign import RunReport, run_sessions
from runner.executors.local import LocalExecutor
from runner.plan import Plan
from runner.settings import Settings
from runner.store import Store
from runner.store.file import FileStore


def run_local(plan: Plan, corpus: Path, store: Store, settings: Settings, concurrency: int,
              produced: list[str] | None = None) -> RunReport:
    executor = LocalExecutor(settings)
    try:
        return run_sessions(plan, corpus, store, executor, settings.local.workdir, concurrency, produced or [])
    finally:
        executor.close()


class DyingInPool(FileStore):
    """A file store that kills the process it is unpickled in: a transform pool's process
    dying as the kernel's OOM killer would end it."""

    def __reduce__(self):
        return os._exit, (137,)
