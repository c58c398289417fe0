"""Errors a user can cause, each with the exit status the CLI gives it.

A user mistake is reported as one clear line and an exit status, never a traceback; the CLI
catches exactly these classes and lets everything else (a bug) surface in full.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pydantic import ValidationError

EXIT_USAGE = 2
EXIT_BUDGET = 3  # the campaign's budget stopped it: the sessions not started wait for a larger one
EXIT_CONFINEMENT = 12  # the contract's status for a session that cannot be confined or is refused


class UserError(Exception):
    """A problem with what the user gave us (a plan, a corpus, a flag); exit 2."""

    exit_code = EXIT_USAGE


class ConfinementError(UserError):
    """The host cannot confine a session as the contract requires; exit 12, nothing spent."""

    exit_code = EXIT_CONFINEMENT


class KeyRefused(UserError):
    """The provider refuses the install's key (the gateway's key check): a setting to fix, exit 2,
    nothing spent."""


class SealError(UserError):
    """A workspace cannot be sealed for a (probe, arm); the session must not run."""


class NotStarted(Exception):
    """A session's harness never ran (e.g. its pod was never scheduled): nothing was spent, so
    the session stays intended and the next run starts it."""


class SessionInterrupted(Exception):
    """A session was cut off after its harness could have started; ``detail`` (journaled with
    the interrupted outcome) says what was kept of its stream."""

    def __init__(self, reason: str, detail: dict[str, object]):
        super().__init__(reason)
        self.detail = detail


class SessionRefused(Exception):
    """The executor refused a session after journaling its start, before the harness ran (e.g.
    the harness container could not be confined): recorded as refused, with ``reason``."""


def format_validation_error(source: str, err: ValidationError) -> str:
    """One line per problem, each naming the field (``probes[1].id``), never a traceback: the
    one formatter of every model a user writes (plan, probe configuration, settings, the
    settings ConfigMap)."""
    lines = []
    for e in err.errors():
        loc = ""
        for part in e["loc"]:
            loc += f"[{part}]" if isinstance(part, int) else (f".{part}" if loc else str(part))
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        elif e["type"] == "string_pattern_mismatch" and loc.split(".")[-1] in {"lock", "tree", "selection", "read_set"}:
            msg = "must be 'sha256:' followed by 64 lowercase hex digits"
        elif e["type"] == "string_pattern_mismatch" and loc == "campaign":
            msg = "must be lowercase letters, digits, '-' or '.', at most 63 characters"
        lines.append(f"{source}: {loc or '(top level)'}: {msg}")
    return "\n".join(lines)
