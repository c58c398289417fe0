"""The Claude Code CLI's stream (``claude -p --output-format stream-json``), parsed into what it
observed (runner/stream.py's records).

The stream is the only source of an event, so the parser is strict about what would make an
observation unsound (a line that is not JSON, a stream cut short, a second init line, a
result line with lines after it, a tool result for a call nobody made) and tolerant of
everything the CLI legitimately varies across versions (hook lines before init, rate-limit
and status lines, unknown line types, tool inputs as open dicts, result content as a string
or a list of blocks). Problems are collected as sentences; the caller refuses the session on
any of them and never derives an event from a stream that has one. No input raises: a line
that cannot be read is a problem with its line number.

Memory is bounded by the longest line, not by the stream: the stream is read line by line,
and of each line only what the transform derives from is kept (a tool result as its digest,
a tool input without the bulk the transform never reads, such as a Write's content).

Lines are parsed with orjson, the fastest parser available, because parsing is most of the
transform's cost. orjson reads strict RFC 8259 JSON; the standard library's ``json`` is the
reference for what a line means, and it also reads what the CLI can legitimately write and
orjson refuses (a lone UTF-16 surrogate escape, which JavaScript's JSON.stringify emits for a
string cut inside a surrogate pair) and integers beyond 64 bits, which orjson reads as floats.
So a line orjson refuses is read again with ``json``, and so is a line whose value could
differ between the two (see ``_needs_reference``); the outcome is ``json``'s in every case.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import orjson

from runner import digest
from runner.harnesses.contract import Tools
from runner.stream import (
    BYTES,
    MAX_COST_PLACES,
    MAX_COST_USD,
    PART,
    UNCHANGED,
    WHOLE,
    ParsedStream,
    ReadSeen,
    ToolResult,
    ToolUse,
    canonical,
    money,
    result_bytes,
)

_BEFORE_INIT_OK = {"system", "rate_limit_event"}

# How a call of each known tool is identified (the contract's ``argument``): the input keys that
# name what the call touched (a path, a command, a pattern with what it searched, an id or a name
# from a closed set), in order, the first of them required. The parser keeps these, and the path
# inputs the transform checks against the workspace, and drops the rest of the input. A call of
# any other tool, or one whose required key is missing, is identified by the digest of its
# canonical input (``ToolUse.identity``), never by its text: inputs of TaskCreate, SendMessage,
# ExitPlanMode, TodoWrite, WebSearch and of tools a later CLI adds are the model's own words, and
# "a transcript holds no model prose".
WRITE_TOOLS = {"Write": "file_path", "Edit": "file_path", "MultiEdit": "file_path", "NotebookEdit": "notebook_path"}
READ_TOOLS = {"Read": "file_path", "NotebookRead": "notebook_path"}
SEARCH_TOOLS = {"Glob": ("pattern", "path"), "Grep": ("pattern", "path", "glob", "type")}
ARGUMENT_KEYS: dict[str, tuple[str, ...]] = {
    **{name: (key,) for name, key in (WRITE_TOOLS | READ_TOOLS).items()},
    **SEARCH_TOOLS,
    "LS": ("path",),
    "Bash": ("command",),
    "Task": ("subagent_type",),
    "Agent": ("subagent_type",),
    "Skill": ("skill",),
    "WebFetch": ("url",),
    "TaskGet": ("taskId",),
    "TaskUpdate": ("taskId",),
    "TaskOutput": ("task_id",),
    "TaskStop": ("task_id", "shell_id"),
    "BashOutput": ("bash_id",),
    "KillShell": ("shell_id",),
    "KillBash": ("shell_id",),
    "CronDelete": ("id",),
    "ListMcpResources": ("server",),
    "ReadMcpResource": ("server", "uri"),
    "ExitWorktree": ("action",),
}
# TaskStop names the task or, in older CLIs, the shell: either identifies it.
_ANY_OF = {"TaskStop"}
PATH_INPUT_KEYS = ("file_path", "notebook_path", "path")
STATED_COST = "total_cost_usd"  # the result line's field stating what the session cost
# The vocabulary as the transform reads it (runner/harnesses/contract.py's Tools).
TOOLS = Tools(
    writes=WRITE_TOOLS, reads=READ_TOOLS, searches=SEARCH_TOOLS, lists=frozenset({"LS"}),
    path_patterns={"Glob": "pattern"}, shells={"Bash": "command"},
    # one shell's working directory across the Bash calls, put back at the workspace after a call
    # that leaves it (seen through the real CLI: "Shell cwd was reset to ...")
    shell_keeps_cwd=True,
    mcp_prefix="mcp__", argument_keys=ARGUMENT_KEYS, path_input_keys=PATH_INPUT_KEYS,
)

# Deeper than this, a tool input or a tool result's content is refused: canonical JSON of it is
# written with the recursive json encoder, and real inputs nest a handful of levels.
MAX_VALUE_DEPTH = 64
# orjson reads an integer beyond 64 bits as a float; a float this large may have been one.
_INT_RANGE = float(2**63)


class _Unreadable(Exception):
    """The line cannot be read; the message is the problem."""


class _Truncated(_Unreadable):
    """The last line ends without a newline and is not complete JSON: the stream was cut."""


def _needs_reference(value: object, n: int) -> bool:
    """Whether ``value`` (parsed by orjson) may differ from what ``json`` reads.

    Raises _Unreadable for a value nested deeper than MAX_VALUE_DEPTH. Walks iteratively, so a
    deep value costs no stack, and visits only containers: it runs for every call and result."""
    if not isinstance(value, (dict, list)):
        return isinstance(value, float) and abs(value) >= _INT_RANGE
    if isinstance(value, dict) and all(type(x) is str for x in value.values()):
        return False  # most tool inputs: strings only, nothing to walk
    stack = [(value, 0)]
    suspicious = False
    while stack:
        v, depth = stack.pop()
        if depth >= MAX_VALUE_DEPTH:
            raise _Unreadable(f"line {n} nests a tool input or result deeper than {MAX_VALUE_DEPTH} levels")
        for x in v.values() if isinstance(v, dict) else v:
            if isinstance(x, (dict, list)):
                stack.append((x, depth + 1))
            elif isinstance(x, float):
                suspicious |= abs(x) >= _INT_RANGE
    return suspicious


def _reference(raw: bytes, n: int, last: bool) -> Any:
    """What the standard library's json reads from a line, or _Unreadable with the reason."""
    try:
        text = raw.decode("utf-8")  # explicit: json.loads(bytes) would accept UTF-16 and UTF-32
    except UnicodeDecodeError as e:
        if last and not raw.endswith(b"\n") and e.end == len(raw) and e.reason == "unexpected end of data":
            raise _Truncated(f"the stream is truncated: line {n} ends inside a character, without a newline") from None
        raise _Unreadable(f"line {n} is not valid UTF-8") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise _Unreadable(f"line {n} is nested too deeply to read") from None
    except ValueError:
        if last and not raw.endswith(b"\n"):
            raise _Truncated(f"the stream is truncated: line {n} ends without a newline and is not complete JSON") from None
        raise _Unreadable(f"line {n} is not a JSON document") from None


def _load(raw: bytes, n: int, last: bool) -> dict[str, Any] | None:
    if not raw or raw.isspace():
        return None
    try:
        obj = orjson.loads(raw)  # JSON allows the trailing "\r\n" as white space: no copy to strip it
    except orjson.JSONDecodeError:
        obj = _reference(raw, n, last)
    if not isinstance(obj, dict):
        raise _Unreadable(f"line {n} is not a JSON object")
    return obj


def _result_cost(line: dict[str, Any]) -> Decimal | None:
    for key in (STATED_COST, "cost_usd"):  # cost_usd: the name older CLI versions used
        value = line.get(key)
        if isinstance(value, (int, float, Decimal)) and not isinstance(value, bool):
            return Decimal(str(value)) if not isinstance(value, Decimal) else value
    return None


def parse(lines: Iterable[bytes], ended_by_driver: bool = False) -> ParsedStream:
    """``ended_by_driver``: the driver killed the harness at the session's time limit, and the stream
    is all the harness wrote until then (the capture record says so). Its missing result line and
    a last line cut off by the kill are then what the kill left, stated as notes; every other
    problem still refuses the stream."""
    out = ParsedStream()
    state = _State({}, ended_by_driver)
    pending = None
    n = 0
    # Look one line ahead so the last line can be told apart (a cut-off last line is truncation).
    for raw in lines:
        if pending is not None:
            _line(out, pending, n, False, state)
        n += 1
        pending = raw
    if pending is not None:
        _line(out, pending, n, True, state)
    out.lines = n
    if out.init is None:
        out.problems.append("the stream has no init line, so it does not state what the session loaded")
    if out.result is None and ended_by_driver:
        out.notes.append("the stream has no result line: the driver ended the session at its time limit")
    elif out.result is None:
        out.problems.append("the stream has no result line: it is incomplete, whatever else it holds")
    return out


@dataclass
class _State:
    uses: dict[str, ToolUse]  # every call of the stream so far, by its tool_use id
    ended_by_driver: bool = False


def _line(out: ParsedStream, raw: bytes, n: int, last: bool, state: _State) -> None:
    try:
        obj = _load(raw, n, last)
        if obj is not None:
            _dispatch(out, raw, obj, n, last, state)
    except _Truncated as e:
        (out.notes if state.ended_by_driver else out.problems).append(str(e))
    except _Unreadable as e:
        out.problems.append(str(e))


def _dispatch(out: ParsedStream, raw: bytes, obj: dict[str, Any], n: int, last: bool, state: _State) -> None:
    kind = obj.get("type")
    if not isinstance(kind, str):
        kind = None  # a line of no known type, like any other unknown line
    elif kind == "result" or (kind == "system" and obj.get("subtype") == "init"):
        obj = _reference(raw, n, last)  # once a stream: their values reach the transcript and refusals as json reads them
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
        _assistant(out, raw, obj, n, last, state.uses)
    elif kind == "user":
        _user(out, raw, obj, n, last, state)
    elif kind == "result":
        cost = _result_cost(json.loads(raw, parse_float=Decimal))  # exact: summed from the line's own literal
        out.result = obj
        if cost is not None and not (cost.is_finite() and 0 <= cost < MAX_COST_USD
                                     and isinstance(places := cost.as_tuple().exponent, int) and places >= -MAX_COST_PLACES):
            out.problems.append(f"line {n}: the result line states a cost of {cost} USD, which is not a cost")
            cost = None
        out.cost_usd = None if cost is None else money(cost)


def _without_uuid(obj: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k != "uuid"}


def _kept_input(name: str, tinput: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The part of a tool input the transform reads, and the input's identity where the call is
    identified by it (see ARGUMENT_KEYS)."""
    keys = ARGUMENT_KEYS.get(name)
    if keys is not None and (any(isinstance(tinput.get(k), str) for k in keys) if name in _ANY_OF
                             else isinstance(tinput.get(keys[0]), str)):
        return {k: tinput[k] for k in (*keys, *PATH_INPUT_KEYS) if k in tinput}, None
    return {k: tinput[k] for k in PATH_INPUT_KEYS if k in tinput}, digest.of_bytes(canonical(tinput))


def _assistant(out: ParsedStream, raw: bytes, obj: dict[str, Any], n: int, last: bool, uses: dict[str, ToolUse]) -> None:
    message = obj.get("message")
    if not isinstance(message, dict):
        out.problems.append(f"line {n}: an assistant line without a message")
        return
    content = message.get("content")
    if isinstance(content, list):
        suspicious = False
        for b in content:  # every input, not only up to the first suspicious one: each is held to the depth limit
            if isinstance(b, dict) and b.get("type") == "tool_use" and isinstance(i := b.get("input"), (dict, list)):
                suspicious |= _needs_reference(i, n)
        if suspicious:
            obj = _reference(raw, n, last)
            message = obj["message"]
            content = message.get("content")
    parent = obj.get("parent_tool_use_id")
    model = message.get("model")
    if parent is None and isinstance(model, str) and model and model != "<synthetic>":
        if model not in out.served_models:
            out.served_models.append(model)
    if not isinstance(content, list):
        return
    for block in content:
        if not isinstance(block, dict) or block.get("type") != "tool_use":
            continue
        tid, name, tinput = block.get("id"), block.get("name"), block.get("input")
        if not isinstance(tid, str) or not isinstance(name, str):
            out.problems.append(f"line {n}: a tool_use block without an id or a name")
            continue
        if tid in uses:
            out.problems.append(f"line {n}: tool_use id {tid} appears twice")
            continue
        if isinstance(tinput, dict):
            kept, identity = _kept_input(name, tinput)
        else:  # not an input any tool takes: identified by what it is
            kept, identity = {}, digest.of_bytes(canonical(tinput))
        uses[tid] = use = ToolUse(tid, name, kept, parent, n, identity)
        out.tool_uses.append(use)


def _user(out: ParsedStream, raw: bytes, obj: dict[str, Any], n: int, last: bool, state: _State) -> None:
    message = obj.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, list):
        return
    results = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
    suspicious = False
    for block in results:  # every block, so that each is held to the depth limit
        if not isinstance(block.get("content"), str):
            suspicious |= _needs_reference(block.get("content"), n)
    if suspicious:
        obj = _reference(raw, n, last)
        results = [b for b in obj["message"]["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]
    for block in results:
        tid = block.get("tool_use_id")
        if not isinstance(tid, str) or tid not in state.uses:
            out.problems.append(f"line {n}: a tool_result for tool_use id {tid!r}, which no call of the stream made")
            continue
        if tid in out.results:
            out.problems.append(f"line {n}: a second tool_result for tool_use id {tid}")
            continue
        is_error = block.get("is_error")
        is_error = is_error if isinstance(is_error, bool) else None
        use = state.uses[tid]
        # the harness's structured record of the call (2.x): one per user line that answers one call
        record = obj.get("tool_use_result") if len(results) == 1 else None
        record = record if isinstance(record, dict) else None
        read = use.name in READ_TOOLS and not is_error
        out.results[tid] = ToolResult(
            # a read's identity is its document's, never what it returned (result_bytes costs a
            # third of parsing the line, so it is not computed for nothing)
            digest=None if read else digest.of_bytes(result_bytes(block.get("content"))),
            is_error=is_error,
            changed=_changed(record) if use.name in WRITE_TOOLS and not is_error else None,
            read=_read_seen(record) if read else None,
            wrote=_wrote(record) if use.name == "Write" and not is_error else None,
        )


def _changed(record: dict[str, Any] | None) -> bool | None:
    """False where the harness's structured record of a write shows that it changed nothing: a
    file that existed (``originalFile`` a string) and a patch with no hunk, as the CLI records a
    Write of the bytes the file already held. None where the line does not say so."""
    if record is not None and isinstance(record.get("originalFile"), str) and record.get("structuredPatch") == []:
        return False
    return None


def cli_view(data: bytes) -> bytes:
    """What a whole read of a file with these bytes shows as its content (2.1.197's reader): the
    bytes decoded as UTF-8 (an invalid sequence as U+FFFD), a leading byte-order mark dropped,
    lines split at LF and one CR at the end of each line dropped, joined again with LF. Most
    files are their own view; one with CRLF line ends or a BOM is not, and only the document's
    known bytes then tell what a read of it saw."""
    if not data.startswith(b"\xef\xbb\xbf") and b"\r" not in data:
        try:
            data.decode("utf-8")
            return data
        except UnicodeDecodeError:
            pass
    text = data.decode("utf-8", "replace").removeprefix("\ufeff")
    return "\n".join(line.removesuffix("\r") for line in text.split("\n")).encode("utf-8")


def _read_seen(record: dict[str, Any] | None) -> ReadSeen:
    """What the structured record of a successful read shows (see ReadSeen); a record of no form
    this version knows shows a part at most."""
    kind = record.get("type") if record is not None else None
    file = record.get("file") if record is not None else None
    if not isinstance(file, dict):
        return ReadSeen(PART)
    if kind == "text" and isinstance(content := file.get("content"), str):
        if (file.get("startLine") == 1 and file.get("numLines") == file.get("totalLines")
                and not file.get("truncatedByTokenCap")):
            return ReadSeen(WHOLE, digest.of_bytes(content.encode("utf-8", "surrogatepass")))
    elif kind == "file_unchanged":
        return ReadSeen(UNCHANGED)
    elif kind in ("image", "pdf") and isinstance(b64 := file.get("base64"), str):
        try:
            data = base64.b64decode(b64, validate=True)
        except ValueError:
            return ReadSeen(PART)
        # the file's own bytes where the CLI passed them through: an image it resized or
        # re-encoded is another picture of the document, not the document
        if len(data) == file.get("originalSize"):
            return ReadSeen(BYTES, digest.of_bytes(data))
    return ReadSeen(PART)


def _wrote(record: dict[str, Any] | None) -> tuple[str, str] | None:
    """The digests of what a Write wrote (its record's ``content``, written as UTF-8 with LF line
    ends by 2.1.197) and of its view (cli_view)."""
    content = record.get("content") if record is not None else None
    if not isinstance(content, str):
        return None
    data = content.encode("utf-8", "surrogatepass")
    return digest.of_bytes(data), digest.of_bytes(cli_view(data))
