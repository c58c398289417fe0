"""How the Claude Code CLI is run: its verified version, its command line and its environment,
the same for both executors (only the executable's path and the way the credential arrives
differ), and where it keeps its configuration. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from runner.harnesses.contract import Reach

if TYPE_CHECKING:
    from runner.plan import Plan
    from runner.settings import Settings

# The pinned CLI version: the default install, the harness image's. The recorder's rules (the
# stream's shapes, the init line's checks, the budget's stop) are qualified with it and with
# the versions of qualified.py; `probe-runner doctor` says so when another is found.
VERSION = "2.1.337"
INSTALL = f"npm install -g @anthropic-ai/claude-code@{VERSION}"
# Its native binary alone, as `npm install` picks it for a platform: what the quick start and
# `probe-runner harness qualify` fetch (no Node.js needed).
NATIVE_PACKAGE = "@anthropic-ai/claude-code-linux-{arch}{libc}"
NATIVE_MEMBER = "package/claude"
EXECUTABLE = "claude"
BUDGET_FLAG = "--max-budget-usd"  # a session's spend limit, checked by the CLI after each answer
# Skill is on it because the present arm loads the workspace's skills "because they are what a
# campaign measures", and a skill reaches the session through the Skill tool alone.
ALLOWED_TOOLS = ("Read", "Grep", "Glob", "Edit", "Write", "MultiEdit", "NotebookEdit", "Bash", "Skill")
DISALLOWED_TOOLS = ("WebSearch", "WebFetch")
CREDENTIAL_VARIABLE = "ANTHROPIC_API_KEY"
CREDENTIALS_FILE = ".credentials.json"
# How every session ran, in the transcript's words ({allowed}: the one list of allowed tools).
CONDUCT = (
    "Every session ran in permission mode dontAsk with --setting-sources project,local, one list "
    "of allowed tools ({allowed}), and WebSearch and WebFetch denied, under a fresh configuration "
    "directory named by HOME and CLAUDE_CONFIG_DIR, so no user CLAUDE.md, skill, plugin, setting "
    "or auto-memory of the host loaded. The prompt was the body of the probe's Task section, in a "
    "workspace sealed against the probe and its answer keys. Each event was derived from the "
    "harness's standard output alone (claude -p --output-format stream-json), read by the driver."
)
CA_VARIABLE = "NODE_EXTRA_CA_CERTS"  # Node's extra roots, read by the CLI at start (it keeps the public ones too)


def tool_names(rules: list[str]) -> list[str]:
    """The tool each permission rule names (``Bash(git *)`` names Bash), once, in order."""
    return list(dict.fromkeys(rule.split("(", 1)[0].strip() for rule in rules))


def flags(plan: Plan, settings: Settings) -> list[str]:
    """Everything after the executable (docs/design.md's flags). The task goes in on stdin, never
    as an argument, so no task text appears in a process list or in a pod's spec.args."""
    h = settings.harness
    argv = [
        "-p",
        "--output-format", "stream-json", "--verbose",
        "--setting-sources", "project,local",
        "--permission-mode", "dontAsk",
        "--model", plan.model,
        # --allowedTools alone is not the list: under dontAsk 2.1.197 still runs the tools whose own
        # permission check allows them (Agent/Task, TaskCreate, CronCreate, ...); --tools offers
        # the model the listed built-in tools and no others
        "--tools", ",".join(tool_names(h.allowed_tools)),
        "--allowedTools", *h.allowed_tools,
        "--disallowedTools", *h.disallowed_tools,
    ]
    if h.max_turns:
        argv += ["--max-turns", str(h.max_turns)]
    if settings.budget.session_usd is not None:
        argv += [BUDGET_FLAG, str(settings.budget.session_usd)]
    return argv


def route(reach: Reach) -> dict[str, str]:
    """How the CLI is told its provider: the base URL, the proxy it goes through, its credential."""
    return {
        "ANTHROPIC_BASE_URL": reach.base_url,
        **({"HTTPS_PROXY": reach.proxy} if reach.proxy else {}),
        **({CREDENTIAL_VARIABLE: reach.token} if reach.token else {}),
    }


def environment(reach: Reach) -> dict[str, str]:
    """The CLI's environment: its configuration in the session's own directory, the provider
    as ``reach`` gives it, none of its traffic besides the session's calls."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": reach.config_dir,
        "CLAUDE_CONFIG_DIR": reach.config_dir,
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        **route(reach),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
    }


def credentials_path(environ: Mapping[str, str]) -> str:
    """Where, given its environment, the CLI reads a credentials file: its configuration
    directory (CLAUDE_CONFIG_DIR, else HOME)."""
    return str(Path(environ.get("CLAUDE_CONFIG_DIR", environ.get("HOME", "/tmp"))) / CREDENTIALS_FILE)


def host_skill_dirs(environ: Mapping[str, str]) -> list[Path]:
    """Where the CLI would find a host user's skills (a session loading one of those names is
    refused): the user's ~/.claude/skills and the configuration directory's."""
    dirs = [Path(environ.get("HOME", "/nonexistent")) / ".claude" / "skills"]
    if environ.get("CLAUDE_CONFIG_DIR"):
        dirs.append(Path(environ["CLAUDE_CONFIG_DIR"]) / "skills")
    return dirs
