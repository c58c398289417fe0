"""Fixtures for integration tests: the real Claude Code CLI and the scripted provider."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from runner import harnesses
from runner.demo.provider import ScriptedProvider

#: The CLI version the fixtures and the recorder were verified against.
EXPECTED_CLAUDE_VERSION = harnesses.HARNESS.version


def _locate_claude() -> list[str]:
    """The harness command: ``RUNNER_HARNESS__COMMAND`` (shell-split), else ``claude`` on PATH."""
    configured = os.environ.get("RUNNER_HARNESS__COMMAND", "").strip()
    if configured:
        argv = shlex.split(configured)
        exe = argv[0]
        resolved = exe if os.sep in exe else shutil.which(exe)
        if not resolved or not os.access(resolved, os.X_OK):
            pytest.fail(
                f"RUNNER_HARNESS__COMMAND={configured!r}: {exe!r} is not an executable file "
                "(set it to the Claude Code CLI, e.g. /opt/cc-test/node_modules/.bin/claude)",
                pytrace=False,
            )
        return [resolved, *argv[1:]]
    found = shutil.which("claude")
    if not found:
        pytest.fail(
            "the Claude Code CLI was not found: set RUNNER_HARNESS__COMMAND to its path or put "
            f"`claude` on PATH (npm install -g @anthropic-ai/claude-code@{EXPECTED_CLAUDE_VERSION})."
            " These tests drive the real CLI and are never skipped.",
            pytrace=False,
        )
    return [found]


@pytest.fixture(scope="session")
def claude_command() -> list[str]:
    """argv prefix of the real CLI; fails the test (never skips) when it is missing."""
    argv = _locate_claude()
    try:
        out = subprocess.run(
            [*argv, "--version"], capture_output=True, text=True, timeout=60,
            env={"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.fail(f"cannot run the Claude Code CLI {argv}: {exc}", pytrace=False)
    if out.returncode != 0:
        pytest.fail(
            f"`{' '.join(argv)} --version` failed ({out.returncode}): {out.stderr.strip()}",
            pytrace=False,
        )
    return argv


@pytest.fixture(scope="session")
def qualified_cli() -> Callable[[str], list[str]]:
    """``qualified_cli(version)``: the argv of that qualified CLI version: the pinned one is the
    CLI ``claude_command`` finds; another is its native binary in the cache `.ci/setup` fetched
    it to (runner/qualify/fetch.py). Fails (never skips) where it is missing or another version."""
    from runner.qualify import fetch

    def find(version: str) -> list[str]:
        argv = _locate_claude() if version == EXPECTED_CLAUDE_VERSION else [str(fetch.cache_dir() / version / "claude")]
        try:
            out = subprocess.run([*argv, "--version"], capture_output=True, text=True, timeout=60,
                                 env={"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")})
        except OSError as e:
            pytest.fail(f"the qualified CLI {version} is not at {argv[0]} ({e}): `bash .ci/setup` fetches it "
                        f"(python3 -m runner.qualify.fetch {version} {argv[0]})", pytrace=False)
        if not out.stdout.startswith(f"{version} "):
            pytest.fail(f"{argv[0]} is {out.stdout.strip()!r}, not the qualified {version}", pytrace=False)
        return argv

    return find


@pytest.fixture(scope="session")
def claude_version(claude_command: list[str]) -> str:
    """The CLI's version string, e.g. ``2.1.197``."""
    out = subprocess.run(
        [*claude_command, "--version"], capture_output=True, text=True, timeout=60,
        env={"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp")},
    )
    return out.stdout.split()[0] if out.stdout.split() else ""


@pytest.fixture
def scripted_provider(tmp_path: Path) -> Iterator[Callable[..., ScriptedProvider]]:
    """Factory: ``scripted_provider(doc)`` starts a provider recording to tmp_path.

    Every provider started through it is stopped at teardown. The request record is
    ``provider.record_path`` (JSONL), and ``provider.requests`` holds the same records.
    """
    started: list[ScriptedProvider] = []

    def make(doc: Mapping[str, Any] | str | os.PathLike[str], **kw: Any) -> ScriptedProvider:
        kw.setdefault("record_path", tmp_path / f"provider-requests-{len(started)}.jsonl")
        provider = ScriptedProvider(doc, **kw).start()
        started.append(provider)
        return provider

    yield make
    for provider in started:
        provider.stop()
