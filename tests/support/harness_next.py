"""A fake next version of the Claude Code CLI, through the harness seam (issue 30's sketch: "a
second harness version (a fake one in tests, through the seam)"). It stands where a real bump
would put runner/harnesses/claude_code/'s next state: one value of the contract
(runner/harnesses/contract.py) and its fixtures, nothing along the run path. Test-only.

Its made-up changes, one for each place the old code hard-wired the CLI:
- it is version 2.2.0, installed by its own command;
- it needs one more flag (``--strict-stream``) and one more environment variable;
- its stream calls the init line ``system/session_start`` and a call's structured record
  ``toolUseResult`` (2.1.197: ``system/init``, ``tool_use_result``); its parser reads them and
  reuses 2.1.197's for the rest, as a real bump would reuse what did not change;
- it loads memory from ``AGENTS.md`` too, which the no-claude-md arm must then remove;
- it sends a beta 2.1.197 does not, which the gateway must then let through.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from runner.harnesses import CLAUDE_CODE
from runner.harnesses.contract import BetaClass, Harness, Qualified, Reach
from runner.stream import ParsedStream

if TYPE_CHECKING:
    from runner.plan import Plan
    from runner.settings import Settings

VERSION = "2.2.0"
FLAG = "--strict-stream"
BETA = "strict-stream-2026-11-01"
_RENAMED = {"toolUseResult": "tool_use_result"}  # 2.2.0's key -> 2.1.197's


def _flags(plan: Plan, settings: Settings) -> list[str]:
    return [*CLAUDE_CODE.flags(plan, settings), FLAG]


def _environment(reach: Reach) -> dict[str, str]:
    return {**CLAUDE_CODE.environment(reach), "CLAUDE_CODE_STRICT_STREAM": "1"}


def _as_before(lines: Iterable[bytes]) -> Iterator[bytes]:
    """2.2.0's lines in 2.1.197's words; a line that is not a JSON object goes as it is, for the
    parser to refuse with its line number."""
    for raw in lines:
        try:
            obj = json.loads(raw)
        except ValueError:
            yield raw
            continue
        if not isinstance(obj, dict):
            yield raw
            continue
        if obj.get("type") == "system" and obj.get("subtype") == "session_start":
            obj["subtype"] = "init"
        for new, old in _RENAMED.items():
            if new in obj:
                obj[old] = obj.pop(new)
        yield json.dumps(obj, ensure_ascii=False).encode() + b"\n"


def _parse(lines: Iterable[bytes], ended_by_driver: bool) -> ParsedStream:
    return CLAUDE_CODE.parse(_as_before(lines), ended_by_driver)


def from_2_1_197(lines: Iterable[bytes]) -> list[bytes]:
    """A 2.1.197 capture as 2.2.0 writes the same session: the fixture maker."""
    out = []
    for raw in lines:
        obj = json.loads(raw)
        if obj.get("type") == "system" and obj.get("subtype") == "init":
            obj["subtype"] = "session_start"
        for new, old in _RENAMED.items():
            if old in obj:
                obj[new] = obj.pop(old)
        out.append(json.dumps(obj, ensure_ascii=False).encode() + b"\n")
    return out


NEXT = dataclasses.replace(
    CLAUDE_CODE,
    version=VERSION,
    install=f"npm install -g @anthropic-ai/claude-code@{VERSION}",
    flags=_flags,
    environment=_environment,
    parse=_parse,
    arm_files=dataclasses.replace(CLAUDE_CODE.arm_files, memory_names=CLAUDE_CODE.arm_files.memory_names | {"AGENTS.md"}),
    calls=dataclasses.replace(CLAUDE_CODE.calls, betas={**CLAUDE_CODE.calls.betas, BETA: BetaClass("allowed", "the next CLI's")}),
    qualified={VERSION: Qualified(VERSION, {m: dataclasses.replace(s, betas=s.betas | {BETA})
                                            for m, s in CLAUDE_CODE.qualified[CLAUDE_CODE.version].models.items()})},
)
assert isinstance(NEXT, Harness)
