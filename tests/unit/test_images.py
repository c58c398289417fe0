"""The Dockerfiles of images/, parsed (no Docker engine runs here, so none is built by the
tests): base images pinned by digest or exact version, builds that reach only the package
registries, a non-root numeric USER in the final stage, what each image must carry for the
pods the chart and the controller make, and the egress proxy's files as egress.py writes them.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from runner import sandbox
from runner.k8s import egress, manifests
from runner.settings import KubeSettings

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "images"
# An exact tag: a version with at least major.minor.patch, or a dated Debian snapshot tag.
EXACT_TAG = re.compile(r"^[^:@\s]+:(\d+\.\d+\.\d+[-.\w]*|[a-z]+-\d{8}[-.\w]*)$")
DIGEST = re.compile(r"^[^@\s]+@sha256:[0-9a-f]{64}$")
NETWORK_TOOLS = re.compile(r"\b(curl|wget|git clone|pip download)\b|https?://")


@dataclass
class Stage:
    base: str
    alias: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [arg for k, arg in self.instructions if k == keyword]


def parse(path: Path) -> list[Stage]:
    """Stages of a Dockerfile: instruction keyword and argument text, continuation lines joined,
    comments and the parser directive dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in path.read_text().splitlines()
                                          if not line.lstrip().startswith("#")))
    stages: list[Stage] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        keyword, _, arg = line.strip().partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            words = arg.split()
            stages.append(Stage(words[0], words[2] if len(words) > 2 and words[1].upper() == "AS" else None))
        else:
            assert stages, f"{path}: {keyword} before FROM"
            stages[-1].instructions.append((keyword, arg.strip()))
    return stages


DOCKERFILES = sorted(IMAGES.glob("*/Dockerfile"))


def test_the_three_images_exist():
    assert [p.parent.name for p in DOCKERFILES] == ["egress-proxy", "harness", "runner"]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.parent.name)
def test_bases_are_pinned_and_builds_reach_only_package_registries(path):
    stages = parse(path)
    aliases = {s.alias for s in stages if s.alias}
    for s in stages:
        if s.base in aliases:
            continue
        assert EXACT_TAG.match(s.base) or DIGEST.match(s.base), f"{path}: base {s.base} is not pinned"
        assert not s.base.endswith((":latest", ":slim", ":bookworm-slim"))
        for keyword, arg in s.instructions:
            assert keyword != "ADD", f"{path}: ADD (can fetch URLs and unpack archives); use COPY"
            if keyword == "RUN":
                assert not NETWORK_TOOLS.search(arg), f"{path}: RUN reaches beyond the package registries: {arg}"
            if keyword == "COPY" and "--from=" in arg:
                assert arg.split("--from=")[1].split()[0] in aliases, f"{path}: COPY from an image, not a stage"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.parent.name)
def test_final_stage_runs_as_a_numeric_non_root_user(path):
    final = parse(path)[-1]
    users = final.all("USER")
    assert users, f"{path}: no USER in the final stage"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0 and (not gid or (gid.isdigit() and int(gid) != 0))
    # The user is the last word on it: nothing after it runs as root.
    last_user = max(i for i, (k, _) in enumerate(final.instructions) if k == "USER")
    assert all(k not in ("RUN", "COPY") for k, _ in final.instructions[last_user + 1:])


def _uid(path: Path) -> int:
    return int(parse(path)[-1].all("USER")[-1].split(":")[0])


def test_uids_are_those_the_pods_run_with():
    k = KubeSettings()
    assert _uid(IMAGES / "harness" / "Dockerfile") == k.harness_uid
    assert _uid(IMAGES / "runner" / "Dockerfile") == k.reader_uid
    chart = (REPO / "helm" / "probe-runner" / "templates" / "egress-proxy.yaml").read_text()
    assert f"runAsUser: {_uid(IMAGES / 'egress-proxy' / 'Dockerfile')}" in chart


def test_harness_image_has_the_pinned_cli_python3_and_the_runner_package():
    stages = parse(IMAGES / "harness" / "Dockerfile")
    by_alias = {s.alias: s for s in stages}
    base, gvisor, final = by_alias["harness-base"], by_alias["harness-gvisor"], stages[-1]
    pinned = re.search(r"^CLAUDE_CODE_VERSION=(\S+)", (REPO / ".ci" / "versions").read_text(), re.M).group(1)
    assert f"CLAUDE_CODE_VERSION={pinned}" in base.all("ARG")
    assert any('"@anthropic-ai/claude-code@${CLAUDE_CODE_VERSION}"' in r for r in base.all("RUN"))
    assert any("python3" in r.split("apt-get install")[-1] for r in base.all("RUN") if "apt-get install" in r)
    assert "--from=build /opt/runner /opt/runner" in base.all("COPY")
    build = stages[0]
    assert "runner /src/runner" in build.all("COPY") and any("pip install" in r and "/src" in r for r in build.all("RUN"))
    # The pod runs `python3 -m runner.entrypoints.pod` with PATH /usr/local/bin:/usr/bin:/bin: the
    # wrapper the image puts first on that PATH must run the venv's interpreter.
    assert manifests.POD_MODULE[0] == "python3"
    assert any("/usr/local/bin/python3" in r and "exec /opt/runner/bin/python3" in r for r in base.all("RUN"))
    # The default image (the last stage, what a plain build makes) and gVisor's variant are the
    # same base, the same user and workspace; the default alone makes its loader execute-only
    # (non-dumpable processes: runner/entrypoints/pod.py refuses a readable loader outside gVisor),
    # its one step after the base's, as root, before the harness user.
    assert final.alias == "harness" and final.base == gvisor.base == "harness-base"
    for stage in (final, gvisor):
        assert stage.all("WORKDIR") == [sandbox.WORKSPACE] and stage.all("USER") == [f"{KubeSettings().harness_uid}:10001"]
    assert final.all("RUN") == [r for r in final.all("RUN") if "chmod 0111" in r and "/lib64/ld-linux-x86-64.so.2" in r] != []
    assert gvisor.all("RUN") == [] and gvisor.all("COPY") == []


def test_runner_image_is_multi_stage_and_runs_the_controller_and_the_reader():
    stages = parse(IMAGES / "runner" / "Dockerfile")
    assert len(stages) == 2 and stages[0].alias == "build" and stages[0].base == stages[1].base
    final = stages[1]
    assert final.all("COPY") == ["--from=build /opt/runner /opt/runner"]  # nothing of the build tools
    assert any(e.startswith("PATH=/opt/runner/bin:") for e in final.all("ENV"))
    assert shlex.split(final.all("ENTRYPOINT")[0].strip("[]").replace(",", " ")) == ["probe-runner"]


def test_egress_proxy_files_are_what_egress_py_writes():
    d = IMAGES / "egress-proxy"
    assert (d / "squid.conf").read_text() == egress.squid_conf("api.anthropic.com")
    assert (d / "entrypoint.sh").read_text() == egress.squid_entrypoint()
    final = parse(d / "Dockerfile")[-1]
    assert f"images/egress-proxy/squid.conf {egress.CONF_PATH}" in final.all("COPY")
    assert any("squid-openssl" in r and "openssl" in r for r in final.all("RUN"))
    assert final.all("EXPOSE") == [str(3128)]
