"""Importing the package's settings, and reading them, needs no writable directory: the runner
image's root is read-only, and a container of it that mounts no /tmp must still start (found by
running the image built from images/runner under containerd with a read-only root, and again
by the chart's gateway pod on the real node, which crashed reading its settings)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_settings_import_without_a_temp_directory():
    code = ("import tempfile; tempfile._candidate_tempdir_list = lambda: []; "
            "import runner.settings, runner.cli; print('imported')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "imported", out.stderr


def test_the_settings_are_read_without_a_temp_directory():
    """Before, LocalSettings.workdir's default asked tempfile.gettempdir(), which raises where no
    directory is writable: `probe-runner gateway` died reading its settings in its pod."""
    code = ("import tempfile; tempfile._candidate_tempdir_list = lambda: []; tempfile.tempdir = None; "
            "import os; os.environ.pop('TMPDIR', None); "
            "from runner.settings import Settings; print(Settings(store='file:///s').local.workdir)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert out.returncode == 0 and out.stdout.strip() == "/tmp/probe-runner", out.stderr
