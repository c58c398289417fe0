"""The README's first command on a fresh machine (issue 16, item 4): bench/quickstart.sh makes a
Debian 12 root with debootstrap (no Python, no bubblewrap, no CA certificates), copies this
repository into it and runs `bash .ci/quickstart` there as a machine of its own. The demo must
finish, with the package in the virtual environment and nothing in the system interpreter."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(900)

REPO = Path(__file__).resolve().parents[2]


def test_the_readmes_first_command_runs_the_demo_on_a_fresh_debian(tmp_path):
    first = next(line for line in (REPO / "README.md").read_text().splitlines() if line.startswith("bash "))
    assert first.split("#")[0].strip() == "bash .ci/quickstart", first
    work = tmp_path / "quickstart"
    try:
        done = subprocess.run(["bash", str(REPO / "bench" / "quickstart.sh"), str(work)], capture_output=True,
                              text=True, timeout=840)
        print(done.stdout[-2000:])  # the time it took is the last line (the README quotes it)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "transcript campaign-present:" in done.stdout and "(4 events)" in done.stdout
        assert done.stdout.rstrip().splitlines()[-1].endswith(" s on a fresh Debian 12")
        home = work / "root" / "root" / "probe-runner"
        assert (home / ".venv" / "bin" / "probe-runner").is_file() and (home / ".venv" / "bin" / "claude").is_file()
        system = work / "root" / "usr" / "lib" / "python3" / "dist-packages"
        assert not [p for p in system.iterdir() if p.name.startswith(("runner", "probe_runner"))]
        assert not (work / "root" / "usr" / "bin" / "node").exists()  # the CLI's native binary alone
    finally:
        shutil.rmtree(work, ignore_errors=True)
