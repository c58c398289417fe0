"""Parsing a harness stream (``claude -p --output-format stream-json``) into what it observed.

The stream is the only source of an event, so the parser is strict about what would make an
observation unsound (a line that is not JSON, a stream cut short, a second init line, a
result line with lines after it, a tool result for a call nobody made) and tolerant of
everything the CLI legitimately varies across versions (hook lines before init, rate-limit
and status lines, unknown line types, tool inputs as open dicts, result content as a string
or a list of blocks). Problems are collected as sentences; the caller refuses the session on
any of them and never derives an event from a stream that has one.

Memory is bounded by the longest line: the stream is read line by line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Iterable

_BEFORE_INIT_OK = {"system", "rate_limit_event"}


@dataclass
class ToolUse:
    id: str
    name: str
    input: dict
    parent: str | None  # non-null for a subagent's call
    line: int


@dataclass
class ToolResult:
    content: object  # a string, a list of blocks, or None
    is_error: bool | None
    structured: object = None  # the line's tool_use_result, where the CLI adds one


@dataclass
class ParsedStream:
    init: dict | None = None
    tool_uses: list[ToolUse] = field(default_factory=list)
    results: dict[str, ToolResult] = field(default_factory=dict)
    result: dict | None = None
    cost_usd: Decimal | None = None
    served_models: list[str] = field(default_factory=list)  # in order of first appearance
    lines: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.problems and self.result is not None


def _decode(raw: bytes, n: int, last: bool, out: ParsedStream) -> dict | None:
    body = raw.rstrip(b"\r\n")
    if not body.strip():
        return None
    try:
        text = body.decode("utf-8")  # explicit: json.loads(bytes) would accept UTF-16 and UTF-32
    except UnicodeDecodeError:
        out.problems.append(f"line {n} is not valid UTF-8")
        return None
    try:
        obj = json.loads(text)
    except ValueError:
        if last and not raw.endswith(b"\n"):
            out.problems.append(f"the stream is truncated: line {n} ends without a newline and is not complete JSON")
        else:
            out.problems.append(f"line {n} is not a JSON document")
        return None
    if not isinstance(obj, dict):
        out.problems.append(f"line {n} is not a JSON object")
        return None
    return obj


def _result_cost(line: dict) -> Decimal | None:
    for key in ("total_cost_usd", "cost_usd"):  # cost_usd: the name older CLI versions used
        value = line.get(key)
        if isinstance(value, (int, float, Decimal)) and not isinstance(value, bool):
            return Decimal(str(value)) if not isinstance(value, Decimal) else value
    return None


def parse(lines: Iterable[bytes]) -> ParsedStream:
    out = ParsedStream()
    seen_ids: set[str] = set()
    pending = None
    n = 0
    # Look one line ahead so the last line can be told apart (a cut-off last line is truncation).
    for raw in lines:
        if pending is not None:
            _line(out, pending, n, False, seen_ids)
        n += 1
        pending = raw
    if pending is not None:
        _line(out, pending, n, True, seen_ids)
    out.lines = n
    if out.init is None:
        out.problems.append("the stream has no init line, so it does not state what the session loaded")
    if out.result is None:
        out.problems.append("the stream has no result line: it is incomplete, whatever else it holds")
    return out


def _line(out: ParsedStream, raw: bytes, n: int, last: bool, seen_ids: set[str]) -> None:
    obj = _decode(raw, n, last, out)
    if obj is None:
        return
    kind = obj.get("type")
    if out.result is not None:
        if kind == "result":
            if _without_uuid(obj) == _without_uuid(out.result):
                out.notes.append(f"line {n} repeats the result line")
            else:
                out.problems.append(f"line {n} is a second, different result line")
        elif kind in ("assistant", "user") or (kind == "system" and obj.get("subtype") == "init"):
            out.problems.append(f"line {n} ({kind}) comes after the result line")
        return
    if out.init is None and kind not in _BEFORE_INIT_OK:
        if kind in ("assistant", "user", "result"):
            out.problems.append(f"line {n} ({kind}) comes before the init line")
            return
    if kind == "system" and obj.get("subtype") == "init":
        if out.init is not None:
            out.problems.append(f"line {n} is a second init line")
        else:
            out.init = obj
    elif kind == "assistant":
        _assistant(out, obj, n, seen_ids)
    elif kind == "user":
        _user(out, obj, n)
    elif kind == "result":
        out.result = obj
        # the cost is summed exactly, so it is read from the line's own decimal literal
        out.cost_usd = _result_cost(json.loads(raw, parse_float=Decimal))


def _without_uuid(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k != "uuid"}


def _assistant(out: ParsedStream, obj: dict, n: int, seen_ids: set[str]) -> None:
    message = obj.get("message")
    if not isinstance(message, dict):
        out.problems.append(f"line {n}: an assistant line without a message")
        return
    parent = obj.get("parent_tool_use_id")
    model = message.get("model")
    if parent is None and isinstance(model, str) and model and model != "<synthetic>":
        if model not in out.served_models:
            out.served_models.append(model)
    content = message.get("content")
    if not isinstance(content, list):
        return
    for block in content:
        if not isinstance(block, dict) or block.get("type") != "tool_use":
            continue
        tid, name, tinput = block.get("id"), block.get("name"), block.get("input")
        if not isinstance(tid, str) or not isinstance(name, str):
            out.problems.append(f"line {n}: a tool_use block without an id or a name")
            continue
        if tid in seen_ids:
            out.problems.append(f"line {n}: tool_use id {tid} appears twice")
            continue
        seen_ids.add(tid)
        out.tool_uses.append(ToolUse(tid, name, tinput if isinstance(tinput, dict) else {}, parent, n))


def _user(out: ParsedStream, obj: dict, n: int) -> None:
    message = obj.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        return
    known = {t.id for t in out.tool_uses}
    results = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
    for block in results:
        tid = block.get("tool_use_id")
        if tid not in known:
            out.problems.append(f"line {n}: a tool_result for tool_use id {tid!r}, which no call of the stream made")
            continue
        if tid in out.results:
            out.problems.append(f"line {n}: a second tool_result for tool_use id {tid}")
            continue
        is_error = block.get("is_error")
        out.results[tid] = ToolResult(
            content=block.get("content"),
            is_error=is_error if isinstance(is_error, bool) else None,
            structured=obj.get("tool_use_result") if len(results) == 1 else None,
        )
