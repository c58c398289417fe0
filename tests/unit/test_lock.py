"""One lock for every install (issue 30, item 7: "a fresh install resolves a newer orjson under
which a unit test's memory bound fails"): constraints.txt pins each dependency of the package
and of its report and test extras to one version, and .ci/setup, .ci/quickstart and both images
install through it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _name(requirement: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0]).lower()


def test_every_dependency_is_pinned_once():
    pins = [line for line in (REPO / "constraints.txt").read_text().splitlines() if line and not line.startswith("#")]
    assert all(re.fullmatch(r"[a-z0-9-]+==[0-9][0-9A-Za-z.+-]*", p) for p in pins), pins
    names = [p.split("==")[0] for p in pins]
    assert len(names) == len(set(names))
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = {_name(r) for r in project["dependencies"]}
    wanted |= {_name(r) for extra in ("report", "test") for r in project["optional-dependencies"][extra]}
    wanted.discard("probe-runner")
    assert sorted(wanted - set(names)) == []
    assert "setuptools" not in names  # the build's, not the lock's (pyproject's build-system)


def test_every_install_goes_through_the_lock():
    installs = {".ci/setup": "-c constraints.txt", ".ci/quickstart": "-c constraints.txt",
                "images/runner/Dockerfile": "-c /src/constraints.txt", "images/harness/Dockerfile": "-c /src/constraints.txt"}
    for path, flag in installs.items():
        lines = [line for line in (REPO / path).read_text().splitlines() if re.search(r"pip install (?!.*--no-deps)", line)]
        assert lines and all(flag in line for line in lines), (path, lines)
    for dockerfile in ("images/runner/Dockerfile", "images/harness/Dockerfile"):
        assert "constraints.txt /src/" in (REPO / dockerfile).read_text()
