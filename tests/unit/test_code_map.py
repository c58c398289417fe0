"""The code map checks itself (issue 30, item 3: "the layers as import-linter contracts ... in
.ci/run; fix today's violations"): `lint-imports` holds pyproject.toml's contracts over the
package, and each contract bites. Every import this test adds to a copy of the package is one
the code had, or one a change would most likely bring back."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"]


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}  # the copy's runner, before the installed one
    return subprocess.run([*LINT, "--config", str(root / "pyproject.toml"), "--no-cache"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_package_keeps_every_contract():
    done = _lint(REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    assert " broken" in done.stdout and "0 broken" in done.stdout


@pytest.mark.parametrize(("module", "line", "contract"), [
    # the transform read the corpus's identifiers and the realized cost from the campaign
    ("transform/run.py", "from runner import campaign", "The run path"),
    # the local executor took its sandbox paths from the pod builder
    ("executors/local.py", "from runner.k8s import manifests", "The local executor and the run's own gateway"),
    # executors stamped their records with the ledger's clock
    ("executors/kubernetes.py", "from runner import ledger", "only the campaign journals"),
    # the campaign named the controller Job itself
    ("campaign.py", "from runner.k8s import jobs", "only through the executor contract"),
    # a pod's entry point reading the settings (pydantic) could not start in the harness image
    ("entrypoints/pod.py", "from runner import settings", "What runs inside the pods"),
    ("status.py", "import kubernetes", "Only runner.k8s.api talks to the Kubernetes API"),
    ("ledger.py", "import boto3", "Only runner.store talks to object storage"),
    ("executors/local.py", "import aiohttp", "Only the gateway's server speaks HTTP"),
    ("k8s/manifests.py", "from runner.k8s import api", "The pure modules"),
    # the metrics reading the cluster themselves, instead of being told by the client that talks to it
    ("metrics.py", "from runner.k8s import api", "The metrics are a shared module"),
    # the harness's knowledge spread again: the transform reading the CLI's stream module, doctor its version
    ("transform/events.py", "from runner.harnesses.claude_code import stream", "reads the harness through its contract"),
    ("doctor.py", "from runner.harnesses.claude_code.command import VERSION", "reads the harness through its contract"),
])
def test_each_contract_refuses_the_import_it_is_there_for(tmp_path, module, line, contract):
    shutil.copytree(REPO / "runner", tmp_path / "runner", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "runner" / module
    text = target.read_text()
    head, _, rest = text.partition("\nfrom __future__ import annotations\n")
    target.write_text(f"{head}\nfrom __future__ import annotations\n{line}  # noqa\n{rest}")
    done = _lint(tmp_path)
    assert done.returncode == 1, done.stdout[-2000:]
    broken = done.stdout.split("Broken contracts", 1)[-1]
    assert contract in " ".join(broken.split()), done.stdout[-3000:]
