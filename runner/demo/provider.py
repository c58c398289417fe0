"""A scripted Anthropic Messages API server for driving the real Claude Code CLI offline.

Why this exists
---------------
The recorder trusts nothing but the harness's real standard output, so its tests (and
``probe-runner demo``) run the real ``claude`` binary. Only the model is replaced: this module
serves ``POST /v1/messages`` with Server-Sent Events shaped exactly like Anthropic's API, and
each answer comes from a *scenario* that says which tool calls the "model" makes, which API
errors it throws, and what its final text is. The CLI then executes the tools for real and
prints real stream-json.

Scenario document
-----------------
::

    {"scenarios": [
      {"name": "read-write-answer",
       "match": "status",                       # optional: substring of the first user turn
       "model": "claude-sonnet-4-5-20250929",   # optional: id served in message.model
       "usage": {"input_tokens": 100, "output_tokens": 20},   # optional, per answer
       "turns": [
         {"tool_uses": [{"name": "Read", "input": {"file_path": "{cwd}/docs/a.md"}}]},
         {"error": {"status": 429, "type": "rate_limit_error", "message": "slow down"},
          "times": 1},
         {"text": "The status is below.\\nHW-DR-0052 current."}
       ]}
    ]}

A turn is either an answer (``text`` and/or ``tool_uses``; ``text`` comes first in the
message when both are given; optional ``usage`` and ``stop_reason`` override the defaults) or
an ``error`` (HTTP ``status``, Anthropic error ``type`` (default from the status) and
``message``, optional ``retry_after`` seconds sent as a ``retry-after`` header, answered
``times`` times, default 1). A tool use may name its ``id``; otherwise one is generated.

What the CLI does with an error turn (2.1.197, observed): 401, 408/409/429/5xx are retried,
each retry announced by a ``system/api_retry`` line (``attempt``, ``max_retries``,
``retry_delay_ms``, ``error_status``, ``error``: ``authentication_failed``/``rate_limit``/
``overloaded``/``server_error``). The delay is ``500 ms * 2**(attempt-1)`` (capped at 32 s) plus up to 25 %
jitter; ``retry-after`` can only lengthen it. ``CLAUDE_CODE_MAX_RETRIES`` sets the budget
(default 10, at most 15); three 529s in a row end the call whatever the budget. A call that
stays failed ends the session with a ``<synthetic>`` assistant message and a result line of
subtype ``success`` with ``is_error: true`` (exit status 1). One error turn therefore costs
about 0.5-0.6 s of test time, two about 1.6-1.9 s.

Turn selection is stateless for answers: the answer index is the number of assistant
messages already in the request's ``messages``. A CLI that retries a request (after a
timeout, a dropped connection or one of our scripted errors) therefore gets the same turn
again instead of silently skipping one. Only error turns carry state: the server counts how
often each was served (per CLI session when the CLI names its session in a header, so
concurrent sessions of one scenario do not share counters) and moves past it after ``times``.

``{cwd}`` in any string of a tool input is replaced with the session's working directory,
which the CLI states in its system prompt (2.1.197) or in a mid-conversation system message
(2.1.337; see :func:`extract_cwd`); a scenario can therefore
name workspace files without knowing where the workspace is.

Requests that are not the main agent loop (the CLI's side queries: session-title generation
with a JSON-schema ``output_config``, quota probes with ``max_tokens: 1``, tool-less requests
without the environment section; see :func:`is_main_loop`) get a short answer (plain text, or
a minimal JSON value satisfying the requested schema) with zero usage, and neither advance
nor disturb the scenario: no error counter is touched and no cost is added to the session.

Scenario selection: the first scenario whose ``match`` is a substring of the first user
message's task text (``<system-reminder>`` blocks removed) wins; otherwise the one scenario
without ``match``; otherwise the request gets a 400 ``invalid_request_error`` saying so.
When the main loop asks for more turns than the scenario has, it gets a final text answer
(``EXHAUSTED_TEXT``) so the session still ends.

Other routes: ``POST /v1/messages/count_tokens`` (an estimate), ``GET /v1/models``,
``HEAD``/``GET /`` and ``/api/hello`` (2.1.197 checks the base URL's reachability with
``HEAD /``, 2.1.337 preconnects with ``HEAD /api/hello``). Anything
else is answered 404 with an Anthropic error body, logged, and listed in ``unknown_paths``.

Python API::

    with ScriptedProvider(doc_or_path, record_path="requests.jsonl") as p:
        env["ANTHROPIC_BASE_URL"] = p.base_url

Command line::

    python -m runner.demo.provider --scenarios FILE [--port N] [--record FILE]

prints the base URL on its first line and serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import logging
import os
import re
import signal
import ssl
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

__all__ = [
    "ScenarioError",
    "Scenario",
    "Turn",
    "ScriptedProvider",
    "load_scenarios",
    "extract_cwd",
    "first_user_text",
    "is_main_loop",
    "main",
]

log = logging.getLogger(__name__)

#: Text answered to requests that are not the main agent loop (titles, topics, probes).
AUXILIARY_TEXT = "Scripted session"

#: Text answered when the main loop asks for more turns than the scenario has.
EXHAUSTED_TEXT = "(scripted scenario exhausted)"

_DEFAULT_USAGE = {"input_tokens": 100, "output_tokens": 20}
_USAGE_KEYS = {
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
}
_STOP_REASONS = {"end_turn", "tool_use", "max_tokens", "stop_sequence", "pause_turn", "refusal"}
# Headers never written to the request record: they carry (dummy or real) credentials.
_SECRET_HEADERS = {"authorization", "x-api-key", "cookie", "proxy-authorization"}
# Headers in which the CLI may name its session; used to keep error counters per session.
_SESSION_HEADERS = ("x-claude-code-session-id", "x-session-id", "anthropic-session-id")


class ScenarioError(ValueError):
    """The scenario document is malformed; the message says where and why."""


# --------------------------------------------------------------------------------------
# Scenario model and validation
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolUse:
    name: str
    input: dict[str, Any]
    id: str | None = None


@dataclass(frozen=True)
class Turn:
    """One scripted step: an answer (text and/or tool uses) or an API error."""

    text: str | None = None
    tool_uses: tuple[ToolUse, ...] = ()
    usage: dict[str, int] | None = None
    stop_reason: str | None = None
    error_status: int | None = None
    error_type: str | None = None
    error_message: str | None = None
    retry_after: float | None = None
    times: int = 1

    @property
    def is_error(self) -> bool:
        return self.error_status is not None


@dataclass(frozen=True)
class Scenario:
    name: str
    turns: tuple[Turn, ...]
    match: str | None = None
    model: str | None = None
    usage: dict[str, int] = field(default_factory=lambda: dict(_DEFAULT_USAGE))

    def segments(self) -> list[tuple[list[int], int | None]]:
        """Split the turns into (error turn indices, answer turn index) per assistant message.

        Segment ``k`` is what the server serves once ``k`` assistant messages exist: first
        each pending error turn, then the answer. A trailing segment may have no answer.
        """
        segs: list[tuple[list[int], int | None]] = []
        errors: list[int] = []
        for i, turn in enumerate(self.turns):
            if turn.is_error:
                errors.append(i)
            else:
                segs.append((errors, i))
                errors = []
        if errors:
            segs.append((errors, None))
        return segs


def _fail(where: str, why: str) -> None:
    raise ScenarioError(f"{where}: {why}")


def _check_keys(obj: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        _fail(where, f"unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def _usage(obj: Any, where: str) -> dict[str, int]:
    if not isinstance(obj, dict):
        _fail(where, "must be an object")
    _check_keys(obj, _USAGE_KEYS, where)
    for k, v in obj.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            _fail(f"{where}.{k}", "must be a non-negative integer")
    return dict(obj)


def _turn(obj: Any, where: str) -> Turn:
    if not isinstance(obj, dict):
        _fail(where, "a turn must be an object")
    if "error" in obj:
        _check_keys(obj, {"error", "times"}, where)
        err = obj["error"]
        if not isinstance(err, dict):
            _fail(f"{where}.error", "must be an object")
        _check_keys(err, {"status", "type", "message", "retry_after"}, f"{where}.error")
        status = err.get("status")
        if not isinstance(status, int) or isinstance(status, bool) or not 400 <= status <= 599:
            _fail(f"{where}.error.status", "must be an HTTP error status (400-599)")
        etype = err.get("type", _default_error_type(status))
        if not isinstance(etype, str) or not etype:
            _fail(f"{where}.error.type", "must be a non-empty string")
        message = err.get("message", etype)
        if not isinstance(message, str):
            _fail(f"{where}.error.message", "must be a string")
        retry_after = err.get("retry_after")
        if retry_after is not None and (
            not isinstance(retry_after, (int, float)) or isinstance(retry_after, bool)
            or retry_after < 0
        ):
            _fail(f"{where}.error.retry_after", "must be a non-negative number of seconds")
        times = obj.get("times", 1)
        if not isinstance(times, int) or isinstance(times, bool) or times < 1:
            _fail(f"{where}.times", "must be a positive integer")
        return Turn(
            error_status=status,
            error_type=etype,
            error_message=message,
            retry_after=retry_after,
            times=times,
        )
    if "times" in obj:
        _fail(f"{where}.times", "only an error turn can repeat")
    _check_keys(obj, {"text", "tool_uses", "usage", "stop_reason"}, where)
    text = obj.get("text")
    if text is not None and not isinstance(text, str):
        _fail(f"{where}.text", "must be a string")
    raw_uses = obj.get("tool_uses", [])
    if not isinstance(raw_uses, list):
        _fail(f"{where}.tool_uses", "must be a list")
    uses: list[ToolUse] = []
    for j, u in enumerate(raw_uses):
        w = f"{where}.tool_uses[{j}]"
        if not isinstance(u, dict):
            _fail(w, "must be an object")
        _check_keys(u, {"name", "input", "id"}, w)
        name = u.get("name")
        if not isinstance(name, str) or not name:
            _fail(f"{w}.name", "must be a non-empty string (the tool's name, e.g. Read)")
        tool_input = u.get("input", {})
        if not isinstance(tool_input, dict):
            _fail(f"{w}.input", "must be an object")
        tid = u.get("id")
        if tid is not None and (not isinstance(tid, str) or not tid):
            _fail(f"{w}.id", "must be a non-empty string")
        uses.append(ToolUse(name=name, input=tool_input, id=tid))
    if text is None and not uses:
        _fail(where, "a turn needs 'text', 'tool_uses' or 'error'")
    stop = obj.get("stop_reason")
    if stop is not None and stop not in _STOP_REASONS:
        _fail(f"{where}.stop_reason", f"must be one of {sorted(_STOP_REASONS)}")
    usage = _usage(obj["usage"], f"{where}.usage") if "usage" in obj else None
    return Turn(text=text, tool_uses=tuple(uses), usage=usage, stop_reason=stop)


def _default_error_type(status: int) -> str:
    return {
        400: "invalid_request_error",
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        429: "rate_limit_error",
        500: "api_error",
        529: "overloaded_error",
    }.get(status, "api_error")


def load_scenarios(source: Mapping[str, Any] | str | os.PathLike[str]) -> list[Scenario]:
    """Validate a scenario document (a mapping, or a path to a JSON file) into scenarios.

    Raises :class:`ScenarioError` naming the offending location, e.g.
    ``scenarios[0].turns[2].error.status: must be an HTTP error status (400-599)``.
    """
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ScenarioError(f"{path}: cannot read scenario file: {exc}") from exc
        except json.JSONDecodeError as exc:
            raise ScenarioError(f"{path}: not valid JSON: {exc}") from exc
    else:
        doc = copy.deepcopy(dict(source))
    if not isinstance(doc, dict):
        _fail("document", "must be an object with a 'scenarios' list")
    _check_keys(doc, {"scenarios"}, "document")
    raw = doc.get("scenarios")
    if not isinstance(raw, list) or not raw:
        _fail("document.scenarios", "must be a non-empty list")
    scenarios: list[Scenario] = []
    names: set[str] = set()
    defaults: list[str] = []
    for i, s in enumerate(raw):
        where = f"scenarios[{i}]"
        if not isinstance(s, dict):
            _fail(where, "must be an object")
        _check_keys(s, {"name", "match", "model", "usage", "turns"}, where)
        name = s.get("name")
        if not isinstance(name, str) or not name:
            _fail(f"{where}.name", "must be a non-empty string")
        if name in names:
            _fail(f"{where}.name", f"duplicate scenario name {name!r}")
        names.add(name)
        where = f"scenarios[{i}] ({name})"
        match = s.get("match")
        if match is not None and (not isinstance(match, str) or not match):
            _fail(f"{where}.match", "must be a non-empty string (omit it for the default)")
        if match is None:
            defaults.append(name)
        model = s.get("model")
        if model is not None and (not isinstance(model, str) or not model):
            _fail(f"{where}.model", "must be a non-empty string")
        usage = dict(_DEFAULT_USAGE)
        if "usage" in s:
            usage.update(_usage(s["usage"], f"{where}.usage"))
        turns = s.get("turns")
        if not isinstance(turns, list) or not turns:
            _fail(f"{where}.turns", "must be a non-empty list")
        parsed = tuple(_turn(t, f"{where}.turns[{j}]") for j, t in enumerate(turns))
        scenarios.append(Scenario(name=name, turns=parsed, match=match, model=model, usage=usage))
    if len(defaults) > 1:
        _fail("document.scenarios", f"more than one default scenario (no 'match'): {defaults}")
    return scenarios


# --------------------------------------------------------------------------------------
# Reading the CLI's requests
# --------------------------------------------------------------------------------------

# How Claude Code states its working directory: 2.1.197 writes " - Primary working directory:
# /abs" in the "# Environment" section of its system prompt, 2.1.337 the same line in a
# mid-conversation system message (see extract_cwd); earlier builds had an
# "<env>" block with "Working directory: /abs". "cwd: /abs" and "current working directory
# is /abs" are accepted as well. Patterns are tried in order; the first match wins.
_CWD_PATTERNS = [
    re.compile(r"(?im)^\s*(?:[-*]\s*)?primary working directory:\s*(/[^\n]*?)\s*$"),
    re.compile(r"(?im)^\s*(?:[-*]\s*)?(?:current )?working directory:\s*(/[^\n]*?)\s*$"),
    re.compile(r"(?im)^\s*(?:[-*]\s*)?cwd:\s*(/[^\n]*?)\s*$"),
    re.compile(r"(?i)current working directory (?:is|:)\s*`?(/[^\s`'\"]+)"),
]


def _system_text(body: Mapping[str, Any]) -> str:
    system = body.get("system")
    if isinstance(system, str):
        return system
    if isinstance(system, list):
        return "\n".join(
            b.get("text", "") for b in system if isinstance(b, dict) and isinstance(b.get("text"), str)
        )
    return ""


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            b.get("text", "")
            for b in content
            if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
        )
    return ""


def _cwd_in(text: str) -> str | None:
    for pat in _CWD_PATTERNS:
        m = pat.search(text)
        if m:
            return m.group(1).rstrip("/") or "/"
    return None


def extract_cwd(body: Mapping[str, Any]) -> str | None:
    """The session's working directory as the CLI states it.

    2.1.197 puts it in the last system block, in an ``# Environment`` section::

        You have been invoked in the following environment:
         - Primary working directory: /tmp/ws-pwwcbuiy
         - Is a git repository: false

    2.1.337 no longer puts the ``# Environment`` section in the system prompt: it sends it in
    the conversation (observed: a mid-conversation ``system`` message, a list of text blocks in
    the first request and a string afterwards; a ``<system-reminder>`` in a user message is
    read the same way). The system prompt is searched first (as a string or as a list of text
    blocks), then the text of user messages and mid-conversation ``system`` messages, so both
    builds work.
    Returns ``None`` when no statement is found; ``{cwd}`` is then left as is.
    """
    found = _cwd_in(_system_text(body))
    if found:
        return found
    for m in body.get("messages") or []:
        if isinstance(m, dict) and m.get("role") in ("user", "system"):
            found = _cwd_in(_content_text(m.get("content")))
            if found:
                return found
    return None


_REMINDER = re.compile(r"<system-reminder>.*?</system-reminder>", re.S)


def first_user_text(body: Mapping[str, Any]) -> str:
    """The task text of the first user message.

    2.1.x splits the first user message into blocks: a ``<system-reminder>`` block carrying
    context (date, CLAUDE.md contents, ...) and then the task itself. The reminders are cut
    out so that a scenario's ``match`` selects on the task, not on workspace files that the
    CLI happens to inline. A user message that holds nothing but reminders (a build that sends
    its context, e.g. the environment section, as a message of its own before the task) is
    passed over for the next one; if every user message is only reminders, the first one's
    whole text is used.
    """
    first: str | None = None
    for m in body.get("messages") or []:
        if isinstance(m, dict) and m.get("role") == "user":
            text = _content_text(m.get("content"))
            stripped = _REMINDER.sub("", text).strip()
            if stripped:
                return stripped
            if first is None:
                first = text
    return first or ""


def assistant_count(body: Mapping[str, Any]) -> int:
    return sum(
        1 for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "assistant"
    )


def is_main_loop(body: Mapping[str, Any]) -> bool:
    """Whether a Messages request is the agent's main loop rather than a side query.

    What 2.1.197 sends in ``-p`` mode (observed): with
    ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1`` nothing but the main loop (plus a
    ``HEAD /`` reachability check); without it, one extra ``POST /v1/messages`` for the
    session title: ``tools: []``, ``thinking: {"type": "disabled"}``, a title-writing system
    prompt and ``output_config.format`` (a JSON schema ``{"title": string}``), with the task
    wrapped in ``<session>`` tags. Quota probes (``max_tokens: 1``) are reported for other
    builds and interactive mode; 2.1.197 ``-p`` was not seen sending one. The main loop, in
    contrast, always carries the ``# Environment`` system prompt (working directory) and,
    unless the session has no tools at all, the tool list (24 tools by default, plus
    ``mcp__<server>__<tool>`` entries). So: structured-output requests and ``max_tokens: 1``
    probes are side queries; a request with tools is the main loop; a tool-less request is
    the main loop only when it states a working directory (2.1.197: in its system prompt;
    2.1.337: in a mid-conversation ``system`` message, see :func:`extract_cwd`).

    Limits: a subagent's requests (Agent tool) look like a main loop and are scripted from
    the same scenario by their own assistant count; a main loop run with ``--json-schema``
    would carry ``output_config.format`` and be taken for a side query. The harness uses
    neither.
    """
    if body.get("max_tokens") == 1:
        return False
    oc = body.get("output_config")
    if isinstance(oc, dict) and oc.get("format"):
        return False
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        return True
    return extract_cwd(body) is not None


def _schema_example(schema: Any, depth: int = 0) -> Any:
    """A minimal value satisfying a JSON schema (for structured-output side queries)."""
    if not isinstance(schema, dict) or depth > 8:
        return AUXILIARY_TEXT
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return _schema_example(schema[key][0], depth + 1)
    stype = schema.get("type")
    if isinstance(stype, list):
        stype = next((t for t in stype if t != "null"), stype[0] if stype else "string")
    if stype == "object" or "properties" in schema:
        props = schema.get("properties")
        props = props if isinstance(props, dict) else {}
        required = schema.get("required")
        required = required if isinstance(required, list) else list(props)
        return {k: _schema_example(props.get(k, {}), depth + 1) for k in required}
    if stype == "array":
        n = schema.get("minItems", 0) if isinstance(schema.get("minItems"), int) else 0
        return [_schema_example(schema.get("items", {}), depth + 1) for _ in range(n)]
    if stype in ("integer", "number"):
        return schema.get("minimum", 0)
    if stype == "boolean":
        return False
    if stype == "null":
        return None
    return AUXILIARY_TEXT


def auxiliary_text(body: Mapping[str, Any]) -> str:
    """The short answer to a side query: plain text, or JSON when a schema is requested."""
    oc = body.get("output_config")
    fmt = oc.get("format") if isinstance(oc, dict) else None
    if isinstance(fmt, dict) and isinstance(fmt.get("schema"), dict):
        return json.dumps(_schema_example(fmt["schema"]))
    return AUXILIARY_TEXT


def _template(value: Any, cwd: str | None) -> Any:
    if isinstance(value, str):
        return value.replace("{cwd}", cwd) if cwd is not None else value
    if isinstance(value, list):
        return [_template(v, cwd) for v in value]
    if isinstance(value, dict):
        return {k: _template(v, cwd) for k, v in value.items()}
    return value


# --------------------------------------------------------------------------------------
# Building responses
# --------------------------------------------------------------------------------------


def _sse(event: str, data: Mapping[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _chunks(s: str, n: int) -> Iterator[str]:
    for i in range(0, len(s), n):
        yield s[i : i + n]


@dataclass
class Answer:
    """A resolved answer: content blocks plus the envelope fields."""

    content: list[dict[str, Any]]
    model: str
    stop_reason: str
    usage: dict[str, int]
    message_id: str = field(default_factory=lambda: "msg_" + uuid.uuid4().hex[:24])

    def message(self) -> dict[str, Any]:
        return {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": self.content,
            "stop_reason": self.stop_reason,
            "stop_sequence": None,
            "usage": self.full_usage(),
        }

    def full_usage(self) -> dict[str, int]:
        u = {
            "input_tokens": 0,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": 0,
        }
        u.update(self.usage)
        return u

    def sse(self) -> Iterator[bytes]:
        """The answer as Anthropic's streaming events, in the API's order."""
        usage = self.full_usage()
        # The real API reports a token or two of output in message_start and the final count
        # in message_delta. 2.1.197 copies message_start's usage into the stream-json
        # assistant line, so the full count is sent in both: the assistant lines then carry
        # the scenario's usage, as in fixtures/claude-code-2.1.197 (the result line sums the
        # message_delta counts either way).
        start = dict(self.message(), content=[], stop_reason=None, usage=usage)
        yield _sse("message_start", {"type": "message_start", "message": start})
        yield _sse("ping", {"type": "ping"})
        for index, block in enumerate(self.content):
            if block["type"] == "text":
                yield _sse(
                    "content_block_start",
                    {"type": "content_block_start", "index": index,
                     "content_block": {"type": "text", "text": ""}},
                )
                for piece in _chunks(block["text"], 64) if block["text"] else [""]:
                    yield _sse(
                        "content_block_delta",
                        {"type": "content_block_delta", "index": index,
                         "delta": {"type": "text_delta", "text": piece}},
                    )
            else:
                yield _sse(
                    "content_block_start",
                    {"type": "content_block_start", "index": index,
                     "content_block": {"type": "tool_use", "id": block["id"],
                                       "name": block["name"], "input": {}}},
                )
                raw = json.dumps(block["input"], separators=(",", ":"))
                for piece in [""] + list(_chunks(raw, 48)):
                    yield _sse(
                        "content_block_delta",
                        {"type": "content_block_delta", "index": index,
                         "delta": {"type": "input_json_delta", "partial_json": piece}},
                    )
            yield _sse("content_block_stop", {"type": "content_block_stop", "index": index})
        yield _sse(
            "message_delta",
            {"type": "message_delta",
             "delta": {"stop_reason": self.stop_reason, "stop_sequence": None},
             "usage": {"output_tokens": usage["output_tokens"]}},
        )
        yield _sse("message_stop", {"type": "message_stop"})


# --------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------


class _TlsServer(ThreadingHTTPServer):
    """HTTPS with the handshake deferred to the handler thread (``wrap_socket`` on accept
    would run it in the one accepting thread)."""

    tls: ssl.SSLContext

    def get_request(self):  # type: ignore[no-untyped-def]
        sock, addr = super().get_request()
        return self.tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr


class ScriptedProvider:
    """A Messages API server answering from scenarios; a context manager.

    ``ScriptedProvider(doc_or_path, record_path=None, host="127.0.0.1", port=0)``: binds on
    construction (port 0: any free port), serves in daemon threads on ``start()`` /
    ``__enter__`` and shuts down cleanly on ``stop()`` / ``__exit__``. ``base_url`` is what
    goes into ``ANTHROPIC_BASE_URL``. ``requests`` holds every request seen (the same records
    written to ``record_path`` as JSONL, if given).

    ``api_key``: when given, a ``/v1/`` request that does not carry it (``x-api-key`` or
    ``Authorization: Bearer``) is answered 401 ``authentication_error``, as the provider does
    (``refusal_status`` 403: ``permission_error``, as for a key without the permission, which
    the CLI does not retry);
    each record's ``credential`` says whether the key came (``key``), something else did
    (``other``) or nothing (``none``), never the value.

    ``tls`` (an ``ssl.SSLContext`` with the server's certificate loaded) serves HTTPS, as the
    provider is reached in production; ``server_name`` is then the host name ``base_url``
    names (the certificate's), instead of the bound address. Each connection's handshake runs
    in its own handler thread, so a client that never completes one stalls nobody else.
    """

    def __init__(
        self,
        scenarios: Mapping[str, Any] | str | os.PathLike[str],
        *,
        record_path: str | os.PathLike[str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        tls: ssl.SSLContext | None = None,
        server_name: str | None = None,
        api_key: str | None = None,
        refusal_status: int = 401,
    ) -> None:
        self.scenarios = load_scenarios(scenarios)
        self.api_key, self.refusal_status = api_key, refusal_status
        self.record_path = Path(record_path) if record_path is not None else None
        self.requests: list[dict[str, Any]] = []
        self.unknown_paths: list[str] = []
        self._lock = threading.Lock()
        self._error_counts: dict[tuple[str, str, int], int] = {}
        self._ids = 0
        self._thread: threading.Thread | None = None
        provider = self

        class Handler(_Handler):
            pass

        Handler.provider = provider
        self._tls = tls
        self._server_name = server_name
        if tls:
            server = _TlsServer((host, port), Handler)
            server.tls = tls
            self._server: ThreadingHTTPServer = server
        else:
            self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        # Large backlog: the CLI opens several connections at start-up.
        self._server.request_queue_size = 64

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        host, port = cast("tuple[str, int]", self._server.server_address[:2])  # an AF_INET server's
        if self._tls is None:
            return f"http://{host}:{port}"
        return f"https://{self._server_name or host}" + ("" if port == 443 else f":{port}")

    def start(self) -> ScriptedProvider:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._server.serve_forever,
                kwargs={"poll_interval": 0.1},
                name="scripted-provider",
                daemon=True,
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> ScriptedProvider:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- bookkeeping -----------------------------------------------------------------------

    def main_loop_requests(self) -> list[dict[str, Any]]:
        """Recorded ``/v1/messages`` requests that were classified as the main loop."""
        with self._lock:
            return [r for r in self.requests if r.get("kind") == "main"]

    def _record(self, rec: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append(rec)
            if self.record_path is not None:
                with self.record_path.open("a", encoding="utf-8") as fh:
                    fh.write(json.dumps(rec, ensure_ascii=False) + "\n")

    def _next_tool_id(self) -> str:
        with self._lock:
            self._ids += 1
            return f"toolu_{self._ids:02d}{uuid.uuid4().hex[:20]}"

    def select(self, body: Mapping[str, Any]) -> Scenario | None:
        text = first_user_text(body)
        default = None
        for s in self.scenarios:
            if s.match is None:
                default = s
            elif s.match in text:
                return s
        return default

    def plan(self, body: Mapping[str, Any], session: str) -> tuple[str, Any, dict[str, Any]]:
        """Decide the reply to a main-loop request: ("error", Turn, info) or ("answer", ...)."""
        scenario = self.select(body)
        if scenario is None:
            return "nomatch", None, {}
        k = assistant_count(body)
        segs = scenario.segments()
        info: dict[str, Any] = {"scenario": scenario.name, "assistant_messages": k}
        if k >= len(segs):
            info["exhausted"] = True
            return "answer", (scenario, None), info
        error_indices, answer_index = segs[k]
        with self._lock:
            for i in error_indices:
                key = (session, scenario.name, i)
                served = self._error_counts.get(key, 0)
                if served < scenario.turns[i].times:
                    self._error_counts[key] = served + 1
                    info.update(turn=i, error_served=served + 1)
                    return "error", scenario.turns[i], info
        if answer_index is None:
            info["exhausted"] = True
            return "answer", (scenario, None), info
        info["turn"] = answer_index
        return "answer", (scenario, scenario.turns[answer_index]), info

    def build_answer(
        self, body: Mapping[str, Any], scenario: Scenario | None, turn: Turn | None
    ) -> Answer:
        asked = body.get("model")
        requested = asked if isinstance(asked, str) else "claude-scripted"
        model = (scenario.model if scenario and scenario.model else None) or requested
        usage = dict(scenario.usage if scenario else _DEFAULT_USAGE)
        content: list[dict[str, Any]]
        if turn is None:
            content = [{"type": "text", "text": EXHAUSTED_TEXT}]
            return Answer(content, model, "end_turn", usage)
        if turn.usage:
            usage.update(turn.usage)
        cwd = extract_cwd(body)
        content = []
        if turn.text is not None:
            content.append({"type": "text", "text": turn.text})
        for use in turn.tool_uses:
            content.append(
                {
                    "type": "tool_use",
                    "id": use.id or self._next_tool_id(),
                    "name": use.name,
                    "input": _template(use.input, cwd),
                }
            )
        stop = turn.stop_reason or ("tool_use" if turn.tool_uses else "end_turn")
        return Answer(content, model, stop, usage)


class _Handler(BaseHTTPRequestHandler):
    """Routes the CLI's HTTP calls; one instance per request (ThreadingHTTPServer)."""

    provider: ScriptedProvider
    protocol_version = "HTTP/1.1"
    server_version = "scripted-provider/1"

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet: tests read the record
        log.debug("%s " + fmt, self.address_string(), *args)

    # -- plumbing --------------------------------------------------------------------------

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = bytearray()
            while True:
                line = self.rfile.readline().strip()
                size = int(line.split(b";")[0] or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                data += self.rfile.read(size)
                self.rfile.readline()
            raw = bytes(data)
        else:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        enc = self.headers.get("Content-Encoding", "").lower()
        if enc == "gzip":
            raw = gzip.decompress(raw)
        elif enc == "deflate":
            raw = zlib.decompress(raw)
        return raw

    def _send(self, status: int, payload: bytes, ctype: str, extra: Mapping[str, str] = {}) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("request-id", "req_" + uuid.uuid4().hex[:24])
        for k, v in extra.items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)
            self.wfile.flush()

    def _json(self, status: int, obj: Any, extra: Mapping[str, str] = {}) -> None:
        self._send(status, json.dumps(obj).encode(), "application/json", extra)

    def _error(self, status: int, etype: str | None, message: str | None, extra: Mapping[str, str] = {}) -> None:
        self._json(status, {"type": "error", "error": {"type": etype, "message": message}}, extra)

    def _base_record(self, raw: bytes) -> dict[str, Any]:
        try:
            body: Any = json.loads(raw) if raw else None
        except (ValueError, UnicodeDecodeError):
            body = raw.decode("utf-8", "replace")
        path, _, query = self.path.partition("?")
        return {
            "time": time.time(),
            "method": self.command,
            "path": path,
            "query": query,
            "headers": {
                k.lower(): v for k, v in self.headers.items() if k.lower() not in _SECRET_HEADERS
            },
            "body": body,
        }

    # -- routes ----------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch(b"")

    def do_HEAD(self) -> None:
        self._dispatch(b"")

    def do_POST(self) -> None:
        self._dispatch(self._read_body())

    def do_PUT(self) -> None:
        self._dispatch(self._read_body())

    def do_DELETE(self) -> None:
        self._dispatch(self._read_body())

    def _dispatch(self, raw: bytes) -> None:
        rec = self._base_record(raw)
        path = rec["path"].rstrip("/")
        auth = self.headers.get("authorization", "")
        given = self.headers.get("x-api-key") or (auth[7:] if auth.lower().startswith("bearer ") else None)
        rec["credential"] = "none" if given is None else ("key" if given == self.provider.api_key else "other")
        try:
            if self.provider.api_key is not None and path.startswith("/v1/") and rec["credential"] != "key":
                rec["kind"] = "unauthorized"
                status = rec["status"] = self.provider.refusal_status
                self._error(status, _default_error_type(status), "invalid x-api-key" if status == 401 else
                            "this API key does not have permission to use the Messages API")
            elif self.command == "POST" and path == "/v1/messages":
                self._messages(rec)
            elif self.command == "POST" and path == "/v1/messages/count_tokens":
                rec["kind"] = "count_tokens"
                body = rec["body"] if isinstance(rec["body"], dict) else {}
                estimate = max(1, len(json.dumps(body)) // 4)
                rec["status"] = 200
                self._json(200, {"input_tokens": estimate})
            elif self.command == "GET" and path == "/v1/models":
                rec["kind"] = "models"
                rec["status"] = 200
                models = sorted({s.model for s in self.provider.scenarios if s.model})
                data = [{"type": "model", "id": m, "display_name": m,
                         "created_at": "2025-01-01T00:00:00Z"} for m in models]
                self._json(200, {"data": data, "has_more": False,
                                 "first_id": data[0]["id"] if data else None,
                                 "last_id": data[-1]["id"] if data else None})
            elif self.command in ("GET", "HEAD") and path in ("", "/", "/health", "/healthz", "/api/hello"):
                # 2.1.197 sends ``HEAD /`` to the base URL at start-up (reachability check);
                # 2.1.337 sends ``HEAD /api/hello`` instead (a preconnect; it ignores the answer).
                rec["kind"] = "health"
                rec["status"] = 200
                self._json(200, {"ok": True})
            else:
                rec["kind"] = "unknown"
                rec["status"] = 404
                self.provider.unknown_paths.append(f"{self.command} {rec['path']}")
                log.warning("scripted provider: unknown path %s %s", self.command, rec["path"])
                self._error(404, "not_found_error", f"scripted provider: no route {rec['path']}")
        finally:
            self.provider._record(rec)

    def _messages(self, rec: dict[str, Any]) -> None:
        body = rec["body"]
        if not isinstance(body, dict):
            rec.update(kind="invalid", status=400)
            self._error(400, "invalid_request_error", "request body must be a JSON object")
            return
        p = self.provider
        stream = bool(body.get("stream"))
        if not is_main_loop(body):
            rec["kind"] = "auxiliary"
            asked = body.get("model")
            requested = asked if isinstance(asked, str) else "claude-scripted"
            # Zero usage: the CLI adds side queries to total_cost_usd and modelUsage, and a
            # scenario's cost should not depend on whether the CLI asked for a title.
            answer = Answer([{"type": "text", "text": auxiliary_text(body)}], requested,
                            "end_turn", {"input_tokens": 0, "output_tokens": 0})
            rec["response"] = answer.message()
            rec["status"] = 200
            self._answer(answer, stream)
            return
        rec["kind"] = "main"
        session = next((self.headers[h] for h in _SESSION_HEADERS if self.headers.get(h)), "")
        decision, payload, info = p.plan(body, session)
        rec.update(info)
        if decision == "nomatch":
            rec["status"] = 400
            msg = "scripted provider: no scenario matches the first user turn and none is default"
            log.warning(msg)
            self._error(400, "invalid_request_error", msg)
            return
        if decision == "error":
            turn: Turn = payload
            assert turn.error_status is not None  # plan() answers "error" with an error turn only
            rec["status"] = turn.error_status
            extra = {}
            if turn.retry_after is not None:
                extra["retry-after"] = str(turn.retry_after)
            self._error(turn.error_status, turn.error_type, turn.error_message, extra)
            return
        scenario, turn = payload
        rec["cwd"] = extract_cwd(body)
        if rec["cwd"] is None and turn is not None and any(
            "{cwd}" in json.dumps(u.input) for u in turn.tool_uses
        ):
            log.warning("scripted provider: no working directory in the request; {cwd} kept")
        answer = p.build_answer(body, scenario, turn)
        rec["status"] = 200
        rec["response"] = answer.message()
        self._answer(answer, stream)

    def _answer(self, answer: Answer, stream: bool) -> None:
        if not stream:
            self._json(200, answer.message())
            return
        payload = b"".join(answer.sse())
        self._send(200, payload, "text/event-stream; charset=utf-8", {"Cache-Control": "no-cache"})


# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runner.demo.provider",
        description="Serve a scripted Anthropic Messages API for the Claude Code CLI.",
    )
    parser.add_argument("--scenarios", required=True, help="scenario document (JSON file)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="port to bind (0: any free port)")
    parser.add_argument("--record", help="append every request to this JSONL file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        provider = ScriptedProvider(
            args.scenarios, record_path=args.record, host=args.host, port=args.port
        )
    except ScenarioError as exc:
        print(f"error: invalid scenarios: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def _on_signal(signum: int, frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    with provider:
        print(provider.base_url, flush=True)
        while not stop.wait(0.5):
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
