"""Every bench script still starts (the guide: "a bench that no longer runs is a defect").
bench/scale.py and bench/realnode.py each stopped at their first line once, importing
``timestamp`` from runner.ledger after it moved to runner.clock, and nothing noticed until a
run was wanted: each script's ``--help`` (its imports, its arguments) runs here, in seconds,
without the clusters and nodes the benches themselves start."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# bench/naive_controller.py is bench/controller.py's baseline, run by it with positional arguments
SCRIPTS = sorted(p.name for p in (REPO / "bench").glob("*.py") if p.name != "naive_controller.py")


def test_every_bench_script_is_covered():
    assert len(SCRIPTS) >= 14 and "scale.py" in SCRIPTS and "realnode.py" in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_bench_script_starts(script):
    done = subprocess.run([sys.executable, str(REPO / "bench" / script), "--help"], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    assert done.returncode == 0 and "usage" in done.stdout.lower(), done.stderr[-2000:]


def test_the_baseline_controller_imports():
    done = subprocess.run([sys.executable, "-c", "import naive_controller"], capture_output=True, text=True, timeout=120,
                          cwd=REPO / "bench", env={**os.environ, "PYTHONPATH": str(REPO)}, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
