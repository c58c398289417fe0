"""What a harness stream observed: the records every harness's parser produces
(runner/harnesses/: ``Harness.parse``) and the transform derives its events from, and the byte
and money forms they are stated in.

A parser is strict about what would make an observation unsound and collects the problems as
sentences (``ParsedStream.problems``); the caller refuses the session on any of them and never
derives an event from a stream that has one. Memory is bounded by the longest line: of each line
a parser keeps only what the transform derives from (a tool result as its digest, a tool input
without the bulk the transform never reads).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from decimal import Context, Decimal
from typing import Any

import orjson

COST_PLACES = 12  # decimal places of a cost: Anthropic prices reach $0.03 per million tokens (3e-8 a token)
COST_QUANTUM = Decimal(1).scaleb(-COST_PLACES)
# A cost beyond this is corruption, not a cost, and its whole cents would overflow what a
# transcript can carry; so is one finer than this many decimal places (a float's literal has
# about 20), which an exact sum would have to carry digit by digit.
MAX_COST_USD = Decimal(10) ** 9
MAX_COST_PLACES = 64
_MONEY = Context(prec=9 + COST_PLACES + 1)  # every digit of a cost below MAX_COST_USD to COST_PLACES places


@dataclass(slots=True)
class ToolUse:
    id: str
    name: str
    input: dict[str, Any]  # what the transform reads of it (see the harness's Tools.argument_keys)
    parent: str | None  # non-null for a subagent's call
    line: int
    identity: str | None = None  # the digest of the canonical input, where that is the argument


@dataclass(slots=True)
class ReadSeen:
    """What the harness's structured record of a successful read (the user line's
    ``tool_use_result``) shows of the document it read; the transform derives the read's
    identity from it (transform/events.py), never from the numbered text the model was sent."""

    # WHOLE: every line of a text document, as the CLI decoded it; BYTES: an image or PDF whose
    # own bytes the record carries; UNCHANGED: the CLI's "file unchanged since your last Read";
    # PART: anything that shows less than the document (a line range, a notebook's cells, a
    # resized image, pages of a PDF)
    kind: str
    digest: str | None = None  # WHOLE: of the content as UTF-8; BYTES: of the decoded bytes


WHOLE, BYTES, UNCHANGED, PART = "whole", "bytes", "unchanged", "part"


@dataclass(slots=True)
class ToolResult:
    # the identity of what the call returned: sha256 of its bytes (see result_bytes); None for a
    # successful read, whose identity is the document's (``read``), never what it returned
    digest: str | None
    is_error: bool | None
    # for a structured write: False where the harness's own record of the call (the user line's
    # tool_use_result) shows it changed no byte, else None (not stated)
    changed: bool | None = None
    read: ReadSeen | None = None  # a successful read's record, where the line carries one
    # a Write's record: the digest of the bytes it wrote, and of the CLI's view of them (what a
    # whole read of that file shows; see cli_view)
    wrote: tuple[str, str] | None = None


@dataclass
class ParsedStream:
    init: dict[str, Any] | None = None
    tool_uses: list[ToolUse] = field(default_factory=list)
    results: dict[str, ToolResult] = field(default_factory=dict)
    result: dict[str, Any] | None = None
    cost_usd: Decimal | None = None
    served_models: list[str] = field(default_factory=list)  # in order of first appearance
    lines: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.problems and self.result is not None


def canonical(value: object) -> bytes:
    """One byte form of a JSON value (sorted keys, no spaces, UTF-8), so its digest is stable.

    The form is ``json.dumps``'s; orjson writes the same bytes several times faster for every
    value without a float (it writes some floats differently, 1e+16 as 1e16) and refuses the rest
    (a lone surrogate, an integer beyond 64 bits), which ``json`` then writes, ``surrogatepass``
    keeping a lone surrogate as the bytes it stands for (tests/unit/test_properties.py)."""
    if not _holds_float(value):
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:
            pass
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")


def _holds_float(value: object) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, float):
            return True
    return False


def result_bytes(content: object) -> bytes:
    """The bytes a tool returned: a string's UTF-8, or canonical JSON of a list of blocks."""
    if isinstance(content, str):
        return content.encode("utf-8", "surrogatepass")
    if content is None:
        return b""
    return canonical(content)



def money(value: Decimal) -> Decimal:
    """A stated cost as money: the CLI sums its costs in binary floating point, so it writes
    0.014400000000000001 for $0.0144 (and its whole cents would then be 2, not 1). Kept to
    COST_PLACES decimal places, finer than any price per token, which drops that noise and
    nothing else; without trailing zeros. Only for a cost already found to be one."""
    text = format(value.quantize(COST_QUANTUM, context=_MONEY), "f")
    return Decimal(text.rstrip("0").rstrip(".") if "." in text else text)


