"""The quick start (.ci/quickstart) and the test set-up (.ci/setup) install the CLI version the
recorder was verified against: one pin, .ci/versions, which must be runner/harnesses/claude_code's."""

from __future__ import annotations

import subprocess
from pathlib import Path

from runner import harnesses

REPO = Path(__file__).resolve().parents[2]


def test_both_set_ups_install_the_cli_version_the_recorder_was_verified_against():
    pinned = subprocess.run(["bash", "-c", "source .ci/versions && echo $CLAUDE_CODE_VERSION"], cwd=REPO,
                            capture_output=True, text=True, timeout=30).stdout.strip()
    assert pinned == harnesses.HARNESS.version
    others = subprocess.run(["bash", "-c", "source .ci/versions && echo $CLAUDE_CODE_ALSO_QUALIFIED"], cwd=REPO,
                            capture_output=True, text=True, timeout=30).stdout.split()
    assert sorted([pinned, *others]) == sorted(harnesses.HARNESS.qualified)  # the suites run on every qualified version
    for script in (".ci/setup", ".ci/quickstart"):
        text = (REPO / script).read_text()
        assert "source .ci/versions" in text and "2.1." not in text, script  # no second pin


def test_the_quick_start_never_installs_into_the_system_interpreter():
    """Issue 16, item 4: "the package in a virtual environment, not the system interpreter"."""
    text = (REPO / ".ci/quickstart").read_text()
    pips = [line for line in text.splitlines() if "pip install" in line and not line.lstrip().startswith("#")]
    assert pips and all(line.strip().startswith(".venv/bin/python -m pip install") for line in pips), pips
    code = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in code if line.lstrip().startswith("npm ")]  # the CLI's native binary alone: no Node.js
