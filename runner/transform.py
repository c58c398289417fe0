"""The transform: one session's stream and workspace into one event of the contract.

It reaches nothing but the stored stream and the files the session left, and it reads no
probe expectation: every value is computed the same way for every probe (the contract's
boundary between recorder and grader). What the stream does not show is not written: a call
whose result never arrived has no ``result``; an artifact whose bytes were not collected has
no ``result`` or ``cites``; nothing checked an artifact, so no artifact has ``findings``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import PurePosixPath
from typing import Callable

from runner import digest
from runner.answer import answer_of
from runner.initcheck import InitContext, refusals
from runner.stream import ARGUMENT_KEYS, PATH_INPUT_KEYS, READ_TOOLS, WRITE_TOOLS, ParsedStream, ResultNeeded, ToolUse, canonical


@dataclass
class SessionFacts:
    """What the driver knows about a session besides its stream (the capture record)."""

    probe: str
    session: str
    workspace: str  # the workspace path as the session saw it
    config_dir: str
    manifest: dict[str, str]  # relative path -> digest of the sealed bytes
    final_file: Callable[[str], bytes | None]  # bytes a workspace file held when the session ended
    artifacts_collected: bool = True
    driver_produced: list[str] = field(default_factory=list)
    declared_mcp_servers: frozenset[str] = frozenset()
    host_skills: frozenset[str] = frozenset()


@dataclass
class SessionOutcome:
    probe: str
    session: str
    event: dict | None
    refusals: list[str]
    cost_usd: Decimal | None
    served_models: list[str]
    outside_paths: list[str]
    notes: list[str]


class _Paths:
    def __init__(self, workspace: str):
        ws = PurePosixPath(workspace)
        self._ws_text = str(ws)
        # None where no path, once normalised under the root "/", can lie inside the workspace:
        # a relative workspace, or one under POSIX's distinct root "//"
        self._ws_parts = list(ws.parts[1:]) if ws.root == "/" else None
        self._prefix = "/".join(["", *self._ws_parts, ""]) if self._ws_parts is not None else None
        self._base = workspace.rstrip("/")
        base = re.escape(self._base)
        # Only whole path words: /workspace2 and /home/workspace/x are other paths.
        self._inside = re.compile(r"(?<![\w./~-])" + base + "/")
        self._bare = re.compile(r"(?<![\w./~-])" + base + r"(?![\w./-])")

    def relative(self, path: str) -> str | None:
        """The workspace-relative form of a path inside the workspace, else None.

        Lexical, as the session named it (``..`` pops a component, nothing is resolved on
        disk), and on strings rather than PurePosixPath objects because it runs for every call
        of every session and pathlib cost more than parsing the stream."""
        if self._ws_parts is None:
            return None
        # Most paths a session names are already normal: no ".", ".." or empty component.
        absolute = path if path.startswith("/") else "/" + path
        if "/." not in absolute and "//" not in absolute and not absolute.endswith("/"):
            if not path.startswith("/"):
                return path
            if path.startswith(self._prefix):
                return path[len(self._prefix):]
        parts: list[str] = []
        for part in (path if path.startswith("/") else self._ws_text + "/" + path).split("/"):
            if part == "..":
                if parts:
                    parts.pop()
            elif part and part != ".":
                parts.append(part)
        k = len(self._ws_parts)
        if parts[:k] == self._ws_parts:
            return "/".join(parts[k:]) or "."
        return None

    def strip(self, text: str) -> str:
        if self._base not in text:  # most arguments never name the workspace: no pattern to run
            return text
        return self._bare.sub(".", self._inside.sub("", text))

    def show(self, path: str) -> str:
        rel = self.relative(path)
        return rel if rel is not None else path


def argument_of(use: ToolUse, paths: _Paths) -> str:
    key = ARGUMENT_KEYS.get(use.name)
    value = use.input.get(key) if key else None
    if key in PATH_INPUT_KEYS and isinstance(value, str):
        return paths.show(value)
    if isinstance(value, str):
        return paths.strip(value)
    return paths.strip(canonical(use.input).decode("utf-8", "surrogatepass"))


def _outside_paths(uses: list[ToolUse], paths: _Paths) -> list[str]:
    found: dict[str, None] = {}  # in order of first appearance

    def add(candidate: str) -> None:
        # A ~ path names the home directory, which is never the workspace.
        if candidate.startswith("~") or paths.relative(candidate) is None:
            found[candidate] = None

    for use in uses:
        for key in PATH_INPUT_KEYS:
            value = use.input.get(key)
            if isinstance(value, str) and value.startswith(("/", "~")):
                add(value)
        command = use.input.get("command") if use.name == "Bash" else None
        if isinstance(command, str):
            for word in _shell_words(command):
                if word[:1] in ("/", "~"):
                    add(word)
    return list(found)


# A command as shlex reads it (posix, whitespace_split, comments), one word at a time: a word of
# unquoted runs, single- or double-quoted strings and escaped characters; a comment to the end of
# its line; or a quote or backslash left open.
_SHELL_WORD = re.compile(r"""[ \t\r\n]*(?:((?:[^ \t\r\n'"\\#]+|'[^']*'|"(?:[^"\\]|\\.)*"|\\.)+)|(#[^\n]*\n?)|(['"\\]))""", re.S)
_SHELL_PIECE = re.compile(r"""([^'"\\]+)|'([^']*)'|"((?:[^"\\]|\\.)*)"|\\(.)""", re.S)
_DOUBLE_QUOTED_ESCAPE = re.compile(r"\\(.)", re.S)
_QUOTING = re.compile(r"['\"\\\\]")


def _unquoted(word: str) -> str:
    """A word of the command that holds a quote or a backslash, without them, as shlex gives it."""
    pieces = []
    for run, single, double, escaped in _SHELL_PIECE.findall(word):
        # findall gives "" for a group that did not take part: the one that did is the piece
        pieces.append(run or single or escaped or
                      # inside double quotes a backslash escapes only a backslash or a double quote
                      _DOUBLE_QUOTED_ESCAPE.sub(lambda e: e.group(1) if e.group(1) in '\\"' else e.group(0), double))
    return "".join(pieces)


def _shell_words(command: str) -> list[str]:
    """The words of a command as ``shlex.split(command, comments=True)`` gives them, or where it
    refuses the command (an open quote, a final backslash) its words split on white space.

    shlex reads a character at a time in Python and cost more than parsing the stream; this reads
    a word at a time with one pattern (held to shlex by tests/unit/test_properties.py)."""
    words = []
    for word, _comment, open_ in _SHELL_WORD.findall(command):
        if open_:
            return command.split()
        if word:
            words.append(_unquoted(word) if _QUOTING.search(word) else word)
    return words


def cites_of(data: bytes, identifier: re.Pattern[str]) -> list[str]:
    # the whole match: findall would return a capturing group of the pattern instead
    return sorted({m.group(0) for m in identifier.finditer(data.decode("utf-8", "replace"))})


def _calls(parsed: ParsedStream, facts: SessionFacts, paths: _Paths) -> list[dict]:
    calls = []
    written: set[str] = set()
    for use in parsed.tool_uses:
        call = {"tool": use.name, "argument": argument_of(use, paths)}
        res = parsed.results.get(use.id)
        if res is not None:
            rel = None
            if use.name in READ_TOOLS:
                target = use.input.get(READ_TOOLS[use.name])
                rel = paths.relative(target) if isinstance(target, str) else None
            if rel is not None and rel not in written and rel in facts.manifest and not res.is_error:
                call["result"] = facts.manifest[rel]  # the document's content digest, as the plan prints it
            else:
                call["result"] = res.digest
        if use.name in WRITE_TOOLS:
            target = use.input.get(WRITE_TOOLS[use.name])
            rel = paths.relative(target) if isinstance(target, str) else None
            if rel is not None:
                written.add(rel)
        calls.append(call)
    return calls


def result_needed(facts: SessionFacts) -> ResultNeeded:
    """For ``stream.parse``: whether the transform can write a call's result as the digest of
    what the call returned. It does not for a successful read of a document of the sealed
    workspace that no write before it touched; that read's result is the document's digest.
    Writes seen so far stand for writes before the call (a superset: the call's own tool_use
    and every earlier one came first), so a result is never wrongly spared."""
    paths = _Paths(facts.workspace)
    written: set[str] = set()
    counted = 0

    def needed(use: ToolUse, is_error: bool | None, uses: list[ToolUse]) -> bool:
        nonlocal counted
        for seen in uses[counted:]:
            target = seen.input.get(WRITE_TOOLS.get(seen.name, ""))
            if isinstance(target, str) and (rel := paths.relative(target)) is not None:
                written.add(rel)
        counted = len(uses)
        if use.name not in READ_TOOLS or is_error:
            return True
        target = use.input.get(READ_TOOLS[use.name])
        rel = paths.relative(target) if isinstance(target, str) else None
        return rel is None or rel in written or rel not in facts.manifest

    return needed


def written_paths(uses: list[ToolUse], workspace: str) -> list[str]:
    """Each path a structured write call names, once, in order; workspace paths made relative."""
    paths = _Paths(workspace)
    named: list[str] = []
    for use in uses:
        target = use.input.get(WRITE_TOOLS.get(use.name, ""))
        if isinstance(target, str) and (shown := paths.show(target)) not in named:
            named.append(shown)
    return named


def _produced(parsed: ParsedStream, facts: SessionFacts, paths: _Paths, identifier: re.Pattern[str], notes: list[str]) -> list[dict]:
    named = written_paths(parsed.tool_uses, facts.workspace)
    for path in facts.driver_produced:
        shown = paths.show(path)
        if shown in named:
            continue
        if facts.final_file(shown) is None:
            notes.append(f"{shown} was named with --produced but the session left no such file")
            continue
        named.append(shown)
    produced = []
    for shown in named:
        entry: dict = {"path": shown}
        inside = paths.relative(shown) is not None
        data = facts.final_file(shown) if inside else None
        if data is not None:
            entry["result"] = digest.of_bytes(data)
            entry["cites"] = cites_of(data, identifier)
        elif inside:
            notes.append(f"{shown} was written but no file was there when the session ended")
        produced.append(entry)
    return produced


def _final_message(parsed: ParsedStream) -> str | None:
    result = parsed.result or {}
    if result.get("subtype") == "success" and not result.get("is_error") and isinstance(result.get("result"), str):
        return result["result"]
    return None


def _harness_error(parsed: ParsedStream) -> str | None:
    result = parsed.result or {}
    subtype = result.get("subtype")
    if subtype == "error_max_turns":
        return None  # the session ran out of turns: a behaviour of the model, recorded with answer null
    if result.get("is_error") or (subtype not in (None, "success")):
        detail = result.get("errors") or result.get("result") or result.get("api_error_status")
        return f"the harness reported an error ({subtype}, is_error={result.get('is_error')}): {str(detail)[:300]}"
    return None


def transform(parsed: ParsedStream, facts: SessionFacts, declared_answers: list[str], identifier: re.Pattern[str]) -> SessionOutcome:
    paths = _Paths(facts.workspace)
    notes = list(parsed.notes)
    reasons = list(parsed.problems)
    if parsed.init is not None:
        reasons += refusals(
            parsed.init,
            InitContext(config_dir=facts.config_dir, declared_mcp_servers=facts.declared_mcp_servers, host_skills=facts.host_skills),
        )
    if parsed.result is not None:
        error = _harness_error(parsed)
        if error:
            reasons.append(error)
    outside = _outside_paths(parsed.tool_uses, paths)
    event = None
    if not reasons:
        event = {"probe": facts.probe, "session": facts.session, "calls": _calls(parsed, facts, paths)}
        if facts.artifacts_collected:
            event["produced"] = _produced(parsed, facts, paths, identifier, notes)
        else:
            notes.append("the files the session changed were not collected, so the event has no produced key")
        if declared_answers:
            event["answer"] = answer_of(_final_message(parsed), declared_answers)
    return SessionOutcome(
        probe=facts.probe,
        session=facts.session,
        event=event,
        refusals=reasons,
        cost_usd=parsed.cost_usd,
        served_models=list(parsed.served_models),
        outside_paths=outside,
        notes=notes,
    )
