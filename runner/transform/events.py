"""One session's stream and workspace into one event of the contract: the transform's first step.

It reaches nothing but the stored stream and the files the session left, and it reads no
probe expectation: every value is computed the same way for every probe (the contract's
boundary between recorder and grader). What the stream does not show is not written: a call
whose result never arrived has no ``result``; an artifact whose bytes were not collected has
no ``result`` or ``cites``; nothing checked an artifact, so no artifact has ``findings``.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import PurePosixPath
from typing import Any

from runner import digest, harnesses
from runner.answer import answer_of
from runner.harnesses.contract import InitContext
from runner.stream import BYTES, UNCHANGED, WHOLE, ParsedStream, ToolUse
from runner.transform.shell import HOME, Named, Session


@dataclass
class SessionFacts:
    """What the driver knows about a session besides its stream (the capture record)."""

    probe: str
    session: str
    workspace: str  # the workspace path as the session saw it
    config_dir: str
    manifest: dict[str, str]  # relative path -> digest of the sealed bytes
    final_file: Callable[[str], bytes | None]  # bytes a workspace file held when the session ended
    identifiers: frozenset[str]  # the identifiers of the corpus the plan was made over (see cites_of)
    artifacts_collected: bool = True
    not_collected_because: str | None = None  # the executor's reason, where it gave one
    links: dict[str, str] = field(default_factory=dict)  # workspace links when the session ended: relative path -> target
    # the sealed documents whose CLI view (Harness.read_view) is not their bytes: relative path -> digest of the view
    views: dict[str, str] = field(default_factory=dict)
    # the documents the session left changed (relative path -> digest) and deleted, as the capture
    # found them when it ended (meaningful where artifacts_collected)
    changed: dict[str, str] = field(default_factory=dict)
    deleted: frozenset[str] = frozenset()
    timed_out: bool = False  # the driver ended the session at its time limit
    driver_produced: list[str] = field(default_factory=list)
    declared_mcp_servers: frozenset[str] = frozenset()
    host_skills: frozenset[str] = frozenset()
    # the tools the one list of allowed tools names (Harness.rule_tools), or None where the
    # capture does not record the list
    allowed_tools: frozenset[str] | None = None


@dataclass
class SessionOutcome:
    probe: str
    session: str
    event: dict[str, Any] | None
    refusals: list[str]
    cost_usd: Decimal | None
    served_models: list[str]
    outside_paths: list[str]
    notes: list[str]
    timed_out: bool = False  # the time limit ended it: recorded as watched, without an answer
    over_budget: bool = False  # its own spend limit ended it (--max-budget-usd): an observation like any other
    tools: dict[str, int] = field(default_factory=dict)  # calls by tool, as the stream shows them (the event's calls)


class _Paths:
    def __init__(self, workspace: str):
        ws = PurePosixPath(workspace)
        self.workspace = str(ws)
        # None where no path, once normalised under the root "/", can lie inside the workspace:
        # a relative workspace, or one under POSIX's distinct root "//"
        self._ws_parts = list(ws.parts[1:]) if ws.root == "/" else None
        self._prefix = "/".join(["", *self._ws_parts, ""]) if self._ws_parts is not None else None
        self._base = workspace.rstrip("/")
        # The workspace at the start of a path (only whole path words: /workspace2 and
        # /home/workspace/x are other paths), with the rest of the path up to where the shell's
        # word ends or its quoting changes.
        self._named = re.compile(r"(?<![\w./~-])" + re.escape(self._base) + r"(?![\w.-])(/[^\s;|&<>()'\"`]*)?")

    def relative(self, path: str) -> str | None:
        """The workspace-relative form of a path inside the workspace, else None.

        Lexical, as the session named it (``..`` pops a component, nothing is resolved on
        disk), and on strings rather than PurePosixPath objects because it runs for every call
        of every session and pathlib cost more than parsing the stream."""
        if self._ws_parts is None or self._prefix is None:
            return None
        # Most paths a session names are already normal: no ".", ".." or empty component.
        absolute = path if path.startswith("/") else "/" + path
        if "/." not in absolute and "//" not in absolute and not absolute.endswith("/"):
            if not path.startswith("/"):
                return path
            if path.startswith(self._prefix):
                return path[len(self._prefix):]
        parts: list[str] = []
        for part in (path if path.startswith("/") else self.workspace + "/" + path).split("/"):
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
        """A command with each path inside the workspace written relative to it, as a word that
        still names the file: the workspace's own leading ``/`` and ``.`` components go, and the
        workspace itself is ``.`` (``/workspace//docs/x`` is ``docs/x``, ``/workspace/`` is
        ``.``), except where the word goes on past them (``/workspace/"a b"`` is ``"a b"``). A
        path that climbs out of the workspace (``/workspace/../x``) is left as it is."""
        if self._base not in text:  # most arguments never name the workspace: no pattern to run
            return text
        out, done, quote, scanned = [], 0, "", 0
        for m in self._named.finditer(text):
            quote, scanned = _quoting(text, scanned, m.start(), quote), m.start()
            rest = [c for c in (m.group(1) or "").split("/") if c not in ("", ".")]
            if rest[:1] == [".."]:
                continue
            after = m.end() + (1 if quote and text[m.end():m.end() + 1] == quote else 0)  # past a closing quote
            goes_on = after < len(text) and not text[after].isspace() and text[after] not in ";|&<>()"
            out += [text[done:m.start()], "/".join(rest) + ("/" if rest and m.group(0).endswith("/") else "")
                    if rest else ("" if goes_on else ".")]
            done = m.end()
        return "".join(out) + text[done:]

    def show(self, path: str) -> str:
        rel = self.relative(path)
        return rel if rel is not None else path

    def resolved(self, rel: str, links: dict[str, str]) -> str | None:
        """The workspace path a relative path leads to through the workspace's links (each link's
        target read against the link's own directory), or None where it leads out of the
        workspace; at most 40 links are followed, as the kernel does."""
        for _ in range(40):
            parts = rel.split("/")
            for i in range(1, len(parts) + 1):
                head = "/".join(parts[:i])
                if head in links:
                    target = links[head]
                    base = target if target.startswith("/") else posixpath.join(posixpath.dirname(head), target)
                    joined = "/".join([base, *parts[i:]]) if parts[i:] else base
                    inside = self.relative(joined)
                    if inside is None:
                        return None
                    rel = inside
                    break
            else:
                return rel
        return None


def _quoting(text: str, start: int, end: int, quote: str) -> str:
    """The shell's quoting at ``end``, from ``quote`` at ``start``: "" (none), "'" or '"'."""
    i = start
    while i < end:
        c = text[i]
        if quote == "'":
            quote = "" if c == "'" else quote
        elif c == "\\":
            i += 1
        elif quote == '"':
            quote = "" if c == '"' else quote
        elif c in "'\"":
            quote = c
        i += 1
    return quote


def argument_of(use: ToolUse, paths: _Paths) -> str:
    """The call's identifying argument (see Tools.argument_keys): a path made relative to the
    workspace, a command, a search as shell words (its pattern, what it searched, "." for the
    workspace, and its file filter), an id or a name; for any other input its identity."""
    if use.identity is not None:
        return use.identity
    tools = harnesses.HARNESS.tools
    keys = tools.argument_keys[use.name]
    if use.name in tools.searches:
        pattern, where, *filters = keys
        words = [use.input[pattern], paths.show(w) if isinstance(w := use.input.get(where), str) else "."]
        words += [w for k in filters if isinstance(use.input.get(k), str) for w in (f"--{k}", use.input[k])]
        return paths.strip(shlex.join(words))
    values = [use.input[k] for k in keys if isinstance(use.input.get(k), str)]
    if len(values) > 1:
        return paths.strip(shlex.join(values))
    value = values[0]
    return paths.show(value) if keys[0] in tools.path_input_keys else paths.strip(value)


def _outside_paths(uses: list[ToolUse], paths: _Paths) -> list[str]:
    """Every path a call names that resolves outside the workspace, once, in order of first
    appearance: path inputs (and a Glob pattern, which is a path with wildcards), read against the
    shell's working directory, and the paths of each Bash command as the shell resolves them
    (transform/shell.py)."""
    found: dict[str, None] = {}
    tools = harnesses.HARNESS.tools
    shell = Session(paths.workspace, lambda p: not p.startswith(HOME) and paths.relative(p) is not None, tools.shell_keeps_cwd)
    for use in uses:
        named: list[Named] = []
        for key in tools.path_input_keys:
            value = use.input.get(key)
            if isinstance(value, str):
                named.append(shell.path(value))
        if use.name in tools.path_patterns and isinstance(pattern := use.input.get(tools.path_patterns[use.name]), str):
            named.append(shell.path(pattern))
        command = use.input.get(tools.shells[use.name]) if use.name in tools.shells else None
        # a path outside names "/" or "~", or is "..": a command with none of them names none
        if isinstance(command, str) and ("/" in command or "~" in command or ".." in command or "cd" in command or "pushd" in command):
            named += shell.named(command, subagent=use.parent is not None)
        for n in named:
            if n.text and (n.resolved.startswith(HOME) or paths.relative(n.resolved) is None):
                found[n.text] = None
    return list(found)


def corpus_identifiers(texts: Iterable[str], identifier: re.Pattern[str]) -> frozenset[str]:
    """The identifiers of a corpus: every token-bounded match of the plan's identifier pattern in
    its files' paths and text, derived the same way for every probe (corpus.store_identifiers)."""
    bounded = token_bounded(identifier)
    return frozenset(m.group(0) for text in texts for m in bounded.finditer(text))


_INLINE_FLAGS = re.compile(r"(?:\(\?[aiLmsux]+\))+")


def token_bounded(identifier: re.Pattern[str]) -> re.Pattern[str]:
    """The pattern matched as a whole token: not inside a longer run of letters, digits, ``_`` or
    ``-`` (``HW-DR-00521`` and ``XHW-DR-0007Y`` hold no ``HW-DR-0052`` or ``HW-DR-0007``). Global
    inline flags (``(?i)``) stay at the front, where Python requires them."""
    flags = _INLINE_FLAGS.match(identifier.pattern)
    lead = flags.group(0) if flags else ""
    return re.compile(lead + r"(?<![\w-])(?:" + identifier.pattern[len(lead):] + r")(?![\w-])", identifier.flags)


def cites_of(data: bytes, identifier: re.Pattern[str], known: frozenset[str]) -> list[str]:
    """The contract's cites: "every identifier of this corpus that appears in the artifact", as a
    whole token; a token of the identifier's shape that the corpus does not carry is not cited."""
    # the whole match: findall would return a capturing group of the pattern instead
    return sorted({m.group(0) for m in token_bounded(identifier).finditer(data.decode("utf-8", "replace"))} & known)


def _write_target(use: ToolUse, paths: _Paths, links: dict[str, str]) -> str | None:
    """The workspace path a structured write changed (through the workspace's links), or None."""
    target = use.input.get(harnesses.HARNESS.tools.writes.get(use.name, ""))
    rel = paths.relative(target) if isinstance(target, str) else None
    return paths.resolved(rel, links) if rel is not None and links else rel


def _wrote(use: ToolUse, parsed: ParsedStream) -> bool:
    """Whether a structured write call may have changed its file: not a call the harness answered
    with an error (an Edit whose old_string is not there, a denied Write), nor one the harness's
    record shows changed nothing. A call whose answer never arrived may have written."""
    res = parsed.results.get(use.id)
    return res is None or (not res.is_error and res.changed is not False)


def _leaves_files(name: str) -> bool:
    """Whether a call of this tool leaves the workspace as it was: none of them can change a file."""
    tools = harnesses.HARNESS.tools
    return name in tools.reads or name in tools.searches or name in tools.lists


class _Documents:
    """What the run knows of the states a workspace document took during the session, for the
    identity of each read: "result on a call is the content digest of the document … never the
    bytes returned", so a read is the digest of the document's bytes as that read saw them.

    The stream proves what the CLI showed (runner/stream.py's ReadSeen): every line of a text document as it
    decoded it, or an image's or PDF's own bytes, or only a part. The states the run knows
    (digest of the bytes, digest of their CLI view) are the sealed bytes, the bytes the session
    left (where the capture collected them) and each Write's bytes. A whole read is the known state
    whose view it showed; where none is, its own content, if every known state of the document is
    its own view (a plain UTF-8 file with LF line ends), since the bytes are then what it showed.
    A read that shows only a part proves no bytes: it is the sealed document where the document
    was as sealed throughout (see _sealed_throughout); else it has no result."""

    def __init__(self, parsed: ParsedStream, facts: SessionFacts, paths: _Paths):
        self._facts = facts
        self._paths = paths
        self._written: dict[str, list[tuple[str, str]]] = {}  # what each Write whose record shows its bytes wrote
        self._named: set[str] = set()  # every document a structured write may have changed
        for use in parsed.tool_uses:
            if use.name in harnesses.HARNESS.tools.writes and _wrote(use, parsed) and (rel := _write_target(use, paths, facts.links)) is not None:
                self._named.add(rel)
                if (wrote := parsed.results[use.id].wrote if use.id in parsed.results else None) is not None:
                    self._written.setdefault(rel, []).append(wrote)
        self._last: dict[str, str | None] = {}  # a document's identity at its last read
        self._quiet = True  # no call so far could have changed a file

    def _states(self, rel: str) -> list[tuple[str, str]]:
        """(digest, view digest) of each state of the document the run knows."""
        f = self._facts
        states = list(self._written.get(rel, []))
        if rel in f.manifest:
            states.append((f.manifest[rel], f.views.get(rel, f.manifest[rel])))
        if f.artifacts_collected and rel in f.changed:
            data = f.final_file(rel)
            states.append((f.changed[rel], digest.of_bytes(harnesses.HARNESS.read_view(data)) if data is not None else ""))
        return states

    def identity(self, use: ToolUse, parsed: ParsedStream) -> tuple[str | None, str | None]:
        """The read's identity, and where it has none the reason (None for a call not answered)."""
        res = parsed.results[use.id]
        target = use.input.get(harnesses.HARNESS.tools.reads[use.name])
        rel = self._paths.relative(target) if isinstance(target, str) else None
        if rel is not None and self._facts.links:
            rel = self._paths.resolved(rel, self._facts.links)
        seen = res.read
        states = self._states(rel) if rel is not None else []
        found: str | None = None
        why = "the stream shows only part of it, and the document may have changed before the read"
        if seen is not None and seen.kind == BYTES:
            found = seen.digest
        elif seen is not None and seen.kind == WHOLE:
            known = {d for d, view in states if view == seen.digest}
            if len(known) == 1:
                found = known.pop()
            elif not known and all(d == view for d, view in states):
                found = seen.digest
            else:
                why = "its content is the view of more than one state of the document, or of none the run knows"
        elif seen is not None and seen.kind == UNCHANGED and rel in self._last:
            found = self._last[rel]
        if found is None and rel is not None and rel in self._facts.manifest and (seen is None or seen.kind != WHOLE) and self._sealed_throughout(rel):
            found = self._facts.manifest[rel]
        if rel is not None:
            self._last[rel] = found
        return found, None if found is not None else why

    def _sealed_throughout(self, rel: str) -> bool:
        """Whether the document was as sealed when a read that proves no bytes saw it: no call
        before the read could change a file, or no write named it and the session left it as
        sealed (what this cannot see is a Bash call that changed it and put it back)."""
        f = self._facts
        return self._quiet or (f.artifacts_collected and rel not in f.changed and rel not in f.deleted and rel not in self._named)

    def after(self, use: ToolUse) -> None:
        self._quiet = self._quiet and _leaves_files(use.name)


def _calls(parsed: ParsedStream, facts: SessionFacts, paths: _Paths, notes: list[str]) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    documents = _Documents(parsed, facts, paths)
    for use in parsed.tool_uses:
        call: dict[str, Any] = {"tool": use.name, "argument": argument_of(use, paths)}
        res = parsed.results.get(use.id)
        if res is not None and use.name in harnesses.HARNESS.tools.reads and not res.is_error:
            found, why = documents.identity(use, parsed)
            if found is not None:
                call["result"] = found  # the document's content digest, as the plan prints it
            else:
                notes.append(f"the Read of {call['argument']} (call {len(calls) + 1}) has no result: {why}")
        elif res is not None:
            call["result"] = res.digest
        documents.after(use)
        calls.append(call)
    return calls


def shown_paths(named: Iterable[str], workspace: str) -> set[str]:
    """Paths as the transform shows them: relative to the workspace when inside it."""
    paths = _Paths(workspace)
    return {paths.show(p) for p in named}


def written_paths(uses: list[ToolUse], workspace: str) -> list[str]:
    """Each path a structured write call names, once, in order; workspace paths made relative.
    (What the executors collect: a superset of what was produced, decided before the results.)"""
    paths = _Paths(workspace)
    named: list[str] = []
    for use in uses:
        target = use.input.get(harnesses.HARNESS.tools.writes.get(use.name, ""))
        if isinstance(target, str) and (shown := paths.show(target)) not in named:
            named.append(shown)
    return named


def _produced(parsed: ParsedStream, facts: SessionFacts, paths: _Paths, identifier: re.Pattern[str], notes: list[str]) -> list[dict[str, Any]]:
    """The contract's produced: each path a structured write changed, once, in order (through a
    link, the file it changed; a write that failed or changed nothing produced nothing), then each
    path the driver named that the session left; result and cites read off the file."""
    named: list[str] = []
    for use in parsed.tool_uses:
        target = use.input.get(harnesses.HARNESS.tools.writes.get(use.name, ""))
        if not isinstance(target, str) or not _wrote(use, parsed):
            continue
        rel = paths.relative(target)
        shown = target if rel is None else _write_target(use, paths, facts.links)
        if shown is None:
            notes.append(f"{rel} was written through a link that leads out of the workspace")
            shown = target
        if shown not in named:
            named.append(shown)
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
        entry: dict[str, Any] = {"path": shown}
        inside = paths.relative(shown) is not None
        data = facts.final_file(shown) if inside else None
        if data is not None:
            entry["result"] = digest.of_bytes(data)
            entry["cites"] = cites_of(data, identifier, facts.identifiers)
        elif inside:
            notes.append(f"{shown} was written but no file was there when the session ended")
        produced.append(entry)
    return produced


def _ran_outside_the_list(parsed: ParsedStream, allowed: frozenset[str] | None) -> list[str]:
    """"Every arm runs in the permission mode dontAsk, with one list of allowed tools": a call of
    another tool that the harness answered without an error ran, and the session then did not run
    under the list. (A tool of an MCP server the workspace declares is the mcp arm's to measure.)"""
    if allowed is None:
        return []
    ran: dict[str, int] = {}
    for n, use in enumerate(parsed.tool_uses, 1):
        res = parsed.results.get(use.id)
        if use.name not in allowed and not use.name.startswith(harnesses.HARNESS.tools.mcp_prefix) and res is not None and not res.is_error:
            ran.setdefault(use.name, n)
    return [f"the stream shows {name} running (call {n}), a tool outside the one list of allowed tools "
            f"({', '.join(sorted(allowed))})" for name, n in ran.items()]


def session_event(parsed: ParsedStream, facts: SessionFacts, declared_answers: list[str], identifier: re.Pattern[str]) -> SessionOutcome:
    harness = harnesses.HARNESS
    paths = _Paths(facts.workspace)
    notes = list(parsed.notes)
    reasons = list(parsed.problems)
    if parsed.init is not None:
        reasons += harness.init_refusals(
            parsed.init,
            InitContext(config_dir=facts.config_dir, declared_mcp_servers=facts.declared_mcp_servers, host_skills=facts.host_skills),
        )
    if parsed.result is not None:
        error = harness.error(parsed.result)
        if error:
            reasons.append(error)
    reasons += _ran_outside_the_list(parsed, facts.allowed_tools)
    outside = _outside_paths(parsed.tool_uses, paths)
    event: dict[str, Any] | None = None
    if not reasons:
        event = {"probe": facts.probe, "session": facts.session, "calls": _calls(parsed, facts, paths, notes)}
        if facts.artifacts_collected:
            event["produced"] = _produced(parsed, facts, paths, identifier, notes)
        else:
            notes.append(f"{facts.not_collected_because or 'the files the session changed were not collected'}, "
                         "so the event has no produced key")
        # A watched session is an observation: answer null where the final line states no declared
        # answer, where the probe declares none, and where the time limit ended the session.
        event["answer"] = answer_of(harness.final_message(parsed.result or {}), declared_answers)
    return SessionOutcome(
        probe=facts.probe,
        session=facts.session,
        event=event,
        refusals=reasons,
        cost_usd=parsed.cost_usd,
        served_models=list(parsed.served_models),
        outside_paths=outside,
        notes=notes,
        timed_out=facts.timed_out,
        over_budget=harness.over_budget(parsed.result or {}),
        tools=dict(Counter(use.name for use in parsed.tool_uses)),
    )
