"""Importing the package's settings needs no writable directory: the runner image's root is
read-only, and a container of it that mounts no /tmp must still start (found by running the
image built from images/runner under containerd with a read-only root)."""

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
