"""The CLI as every tier runs it: a real process (``python -m runner``), or, with ``kill_at``,
tests/faults.py (the CLI SIGKILLed at one stage); and the settings a campaign on this host needs
(``local_settings``), which each tier's environment fixture starts from."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

FAULTS = Path(__file__).parents[1] / "faults.py"


def probe_runner(*args: str, env: Mapping[str, str] | None = None, cwd: Path | None = None, timeout: float = 300,
                 kill_at: str | None = None) -> subprocess.CompletedProcess[str]:
    """``probe-runner ARGS`` in a process of its own, over this process's environment and ``env``."""
    head = [sys.executable, "-m", "runner"] if kill_at is None else [sys.executable, str(FAULTS), kill_at]
    return subprocess.run([*head, *args], capture_output=True, text=True, env={**os.environ, **(env or {})}, cwd=cwd,
                          timeout=timeout)


def local_settings(tmp_path: Path, harness: str, api_key: str = "k") -> dict[str, str]:
    """A file store and a work directory under ``tmp_path``, the harness's command and a key."""
    return {"RUNNER_STORE": (tmp_path / "store").as_uri(), "RUNNER_LOCAL__WORKDIR": str(tmp_path / "work"),
            "RUNNER_HARNESS__COMMAND": harness, "RUNNER_PROVIDER__API_KEY": api_key}
