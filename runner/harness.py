"""The harness command line DESIGN.md fixes, shared by both executors so that every arm of
every executor runs the CLI with the same flags (only the executable's path differs)."""

from __future__ import annotations

from runner.plan import Plan
from runner.settings import Settings

# The CLI version the recorder's rules (the stream's shapes, the init line's checks, the
# budget's stop) were verified against; `probe-runner doctor` says so when another is found.
VERIFIED_VERSION = "2.1.197"


def tool_names(rules: list[str]) -> list[str]:
    """The tool each permission rule names (``Bash(git *)`` names Bash), once, in order."""
    return list(dict.fromkeys(rule.split("(", 1)[0].strip() for rule in rules))


def flags(plan: Plan, settings: Settings) -> list[str]:
    """Everything after the executable. The task goes in on stdin, never as an argument, so
    no task text appears in a process list or in a pod's spec.args."""
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
        argv += ["--max-budget-usd", str(settings.budget.session_usd)]
    return argv
