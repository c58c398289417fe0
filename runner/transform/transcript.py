"""The transcript file: YAML front matter, prose, and two headings with one fenced ``yaml``
block each, holding only the contract's four closed key sets.

``render`` writes it and ``parse`` reads one back (ours or anybody's) strictly enough that
intake can confirm it: a heading missing or doubled, a second fenced block, or a block that is
not YAML is a refusal of the whole file, stated with its reason.

The blocks hold what sessions wrote (a Bash heredoc writing Markdown puts its own fence lines
into a YAML scalar), so each is fenced with more backticks than any run it holds, which none of
its lines can close, and the reader takes fences, headings and lines as CommonMark does
(``_blocks``; tests/unit/test_transcript_fences.py holds it against markdown-it-py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import yaml

from runner.transform import yamlfast

RUN_IDENTITY_KEYS = (
    "model", "served_version", "tree", "lock", "selection", "read_set",
    "seed", "harness", "tier", "arm", "at", "cost_cents",
)
EVENT_KEYS = ("probe", "session", "calls", "produced", "answer")
CALL_KEYS = ("tool", "argument", "result")
PRODUCED_KEYS = ("path", "result", "cites", "findings")
KIND = "probe_transcript"
IDENTITY_HEADING = "Run identity"
EVENTS_HEADING = "Events"


class TranscriptError(ValueError):
    """The file is not a transcript this contract can read."""


def represent_str(dumper: yaml.representer.SafeRepresenter, data: str) -> yaml.ScalarNode:
    """PyYAML's safe representation of a string, except that one holding NEL (U+0085) is
    double-quoted. The emitter takes NEL for a line break and writes it as one inside a
    single-quoted scalar, which reads back as a space: the string a session gave would change on
    its way into the transcript. Double quotes escape it as ``\\N``, which reads back as NEL."""
    if "\x85" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style='"')
    return yaml.representer.SafeRepresenter.represent_str(dumper, data)


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper with :func:`represent_str`."""


_Dumper.add_representer(str, represent_str)


def _pyyaml_dump(value: object) -> str:
    return yaml.dump(value, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=10**6)


_fast_dump = yamlfast.dumper(_pyyaml_dump, _Dumper.yaml_implicit_resolvers)
_load = yamlfast.loader(_fast_dump)


def _dump(value: object) -> str:
    """PyYAML's text, from the fast layout when it can vouch for the value (runner/transform/yamlfast.py)."""
    text = _fast_dump(value)
    return _pyyaml_dump(value) if text is None else text


@dataclass(frozen=True)
class Rendered:
    """A transcript as ``render`` wrote it: the text, and for each YAML block (front matter,
    identity, events) the text it was written as with the value it was written from."""

    text: str
    blocks: tuple[tuple[str, object], ...]


def _fence(block: str) -> str:
    """The backtick fence for ``block``: longer than any run of backticks in it, and at least
    three. CommonMark closes a fence only on a line of the same character at least as long as the
    opening, so no line of the block can close it, whatever a session wrote into a value (a
    heredoc's own Markdown fence, in a YAML scalar over several lines, say).

    The shortest run the block lacks is found by asking whether it holds runs of a length
    (``in``, a fast search): since a block holding a run holds every shorter one, a few
    doublings and halvings settle it, a handful of passes whatever the block holds."""
    if "```" not in block:
        return "```"
    held, lacked = 3, 4
    while "`" * lacked in block:
        held, lacked = lacked, lacked * 2
    while lacked - held > 1:
        mid = (held + lacked) // 2
        if "`" * mid in block:
            held = mid
        else:
            lacked = mid
    return "`" * lacked


def _fenced(block: str) -> str:
    fence = _fence(block)
    return fence + "yaml\n" + block + fence + "\n"


def rendered(front: dict[str, Any], title: str, prose: list[str], identity: dict[str, Any], events: list[dict[str, Any]]) -> Rendered:
    blocks = tuple((_dump(value), value) for value in ({"kind": KIND, **front}, identity, events))
    parts = [
        "---\n" + blocks[0][0] + "---\n",
        f"# {title}\n",
        *(p.rstrip() + "\n" for p in prose),
        f"## {IDENTITY_HEADING}\n",
        _fenced(blocks[1][0]),
        f"## {EVENTS_HEADING}\n",
        _fenced(blocks[2][0]),
    ]
    return Rendered("\n".join(parts), blocks)


def render(front: dict[str, Any], title: str, prose: list[str], identity: dict[str, Any], events: list[dict[str, Any]]) -> str:
    return rendered(front, title, prose, identity, events).text


@dataclass
class ParsedTranscript:
    front: dict[str, Any]
    identity: object
    events: object


_LINE_END = re.compile("\r\n?")


def _indent(line: str) -> tuple[int, int]:
    """The columns of ``line``'s indentation (a tab goes to the next multiple of four) and the
    index of its first character that is neither a space nor a tab."""
    at = len(line) - len(line.lstrip(" \t"))
    if "\t" not in line[:at]:
        return at, at
    col = 0
    for c in line[:at]:
        col = col + 4 - col % 4 if c == "\t" else col + 1
    return col, at


def _atx(s: str) -> tuple[int, str] | None:
    """``(level, text)`` when ``s``, a line from its first non-blank character on, is an ATX
    heading: 1-6 ``#`` then a space, a tab or the end of the line, the text without its optional
    closing sequence of ``#`` (preceded by a space or tab) and its edge spaces and tabs."""
    rest = s.lstrip("#")
    level = len(s) - len(rest)
    if level > 6 or rest[:1] not in ("", " ", "\t"):
        return None
    rest = rest.rstrip(" \t")
    body = rest.rstrip("#")
    if len(body) < len(rest) and body[-1:] in (" ", "\t"):
        rest = body
    return level, rest.strip(" \t")


def _closing(text: str, pos: int, marker: str, length: int) -> tuple[int, int] | None:
    """The start and end of the first line from ``pos`` (a line start) on that closes a fence of
    ``length`` ``marker`` characters, or None: the same character, at least as many, indented at
    most three spaces, followed by nothing but spaces and tabs. Only occurrences of the run are
    looked at (str.find), so a block's lines cost nothing unless they hold one; of our own
    blocks, whose fence is longer than any run they hold, none does."""
    needle = marker * length
    find = text.find
    while True:
        at = find(needle, pos)
        if at < 0:
            return None
        start = text.rfind("\n", 0, at) + 1
        end = find("\n", at)
        if end < 0:
            end = len(text)
        if at - start <= 3 and not text[start:at].strip(" ") and not text[at:end].lstrip(marker).strip(" \t"):
            return start, end
        pos = end + 1  # no other place on this line can open a closing fence


def _dedent(content: str, indent: int) -> str:
    """The lines of a fence indented ``indent`` columns, each with up to that much of its own
    indentation removed (a tab that straddles the limit leaves the rest of its width as spaces)."""
    out = []
    for line in content.split("\n"):
        col = at = 0
        while at < len(line) and col < indent and line[at] in " \t":
            col = col + 4 - col % 4 if line[at] == "\t" else col + 1
            at += 1
        out.append(" " * (col - indent) + line[at:] if col > indent else line[at:])
    return "\n".join(out)


def _blocks(text: str, pos: int = 0) -> Iterator[tuple[Any, ...]]:
    """The headings and fenced blocks of ``text`` from ``pos`` (a line start) on, read by
    CommonMark's rules for a document without containers: ``("heading", level, text)`` for an
    ATX or setext heading, ``("fence", info, content, closed)`` for a fenced block, ``content``
    being its lines each ended by its line break (the form of markdown-it's ``fence`` token). Lines
    must end in ``\n`` only (``_parse`` turns ``\r\n`` and ``\r`` into it first, as CommonMark
    and markdown-it do); no other character ends a line.

    A fence opens on a line indented at most three spaces with three or more backticks or
    tildes, then an info string (with no backtick after backticks); it runs to the first line
    that closes it (``_closing``) or, unclosed, to the end of the document. A heading is indented
    at most three spaces. A line indented four columns or more is indented code, or continues a
    paragraph, and neither a heading nor a fence. Paragraphs are followed only so far as a setext
    underline needs: block quotes, lists, HTML blocks and link reference definitions are read as
    paragraph text."""
    n = len(text)
    find = text.find
    paragraph: list[str] | None = None  # the lines of the paragraph still open
    while pos < n:
        end = find("\n", pos)
        if end < 0:
            end = n
        line = text[pos:end]
        pos = end + 1
        col, at = _indent(line)
        if at == len(line):  # blank
            paragraph = None
            continue
        if col >= 4:  # indented code, or a paragraph's continuation
            if paragraph is not None:
                paragraph.append(line)
            continue
        c = line[at]
        if paragraph is not None and (c == "-" or c == "="):
            underline = line[at:].rstrip(" \t")
            if not underline.lstrip(c):
                yield ("heading", 1 if c == "=" else 2, "\n".join(paragraph).strip(" \t"))
                paragraph = None
                continue
        if c == "`" or c == "~":
            s = line[at:]
            info = s.lstrip(c)
            length = len(s) - len(info)
            if length >= 3 and not (c == "`" and "`" in info):
                start = min(pos, n)
                close = _closing(text, start, c, length)
                if close is None:  # the fence runs to the end of the document
                    content = text[start:]
                    pos = n
                else:
                    content = text[start:close[0]]
                    pos = close[1] + 1
                if at:
                    content = _dedent(content, at)
                yield ("fence", info.strip(" \t"), content, close is not None)
                paragraph = None
                continue
        elif c == "#":
            heading = _atx(line[at:])
            if heading is not None:
                yield ("heading", *heading)
                paragraph = None
                continue
        elif c == "-" or c == "*" or c == "_":
            if line.count(c) >= 3 and not line.replace(c, "").strip(" \t"):  # a thematic break
                paragraph = None
                continue
        if paragraph is None:
            paragraph = [line]
        else:
            paragraph.append(line)


def _sections(text: str, pos: int = 0) -> dict[str, list[tuple[str, str]]]:
    """Level-2 sections of ``text`` from ``pos`` on -> the fenced blocks under each, as (info
    string, the block's lines joined by line breaks). A level-1 heading ends a section, deeper
    ones do not."""
    sections: dict[str, list[Any]] = {}
    current = None
    for block in _blocks(text, pos):
        if block[0] == "fence":
            _, info, content, closed = block
            if not closed:
                raise TranscriptError("a fenced block is not closed")
            if current is not None:
                sections[current].append((info, content[:-1]))
        elif block[1] == 2:
            current = block[2]
            if current in sections:
                raise TranscriptError(f"the heading '## {current}' appears twice")
            sections[current] = []
        elif block[1] == 1:
            current = None
    return sections


def parse(text: str) -> ParsedTranscript:
    return _parse(text, _load)


def reread(r: Rendered) -> ParsedTranscript:
    """A transcript ``render`` just wrote, read back as ``parse`` reads any file, except that a
    block whose text is still the text its value was written as is taken as that value instead of
    being read again: that text is PyYAML's for that value, which PyYAML reads back as that value
    (tests/unit/test_transcript_render.py), so reading it again would confirm what the dump
    already vouched for. The structure is read all the same: prose that opens a fence or a heading
    of its own, or anything else that moves a block, shows as it would to the engine."""
    written = iter(r.blocks)

    def load(block: str) -> object:
        text, value = next(written)
        return value if block + "\n" == text else _load(block)
    return _parse(r.text, load)


def _parse(text: str, load: Callable[[str], object]) -> ParsedTranscript:
    """The transcript's blocks, each read by ``load``, in the order front matter, identity, events."""
    if "\r" in text:
        text = _LINE_END.sub("\n", text)
    n = len(text)
    first = text.find("\n")
    if first < 0:
        first = n
    if text[:first].strip() != "---":
        raise TranscriptError("the file does not start with YAML front matter")
    pos = first + 1
    while True:
        if pos >= n:
            raise TranscriptError("the front matter is not closed")
        end = text.find("\n", pos)
        if end < 0:
            end = n
        if text[pos:end].strip() == "---":
            break
        pos = end + 1
    try:
        front = load(text[first + 1:pos - 1] if pos > first + 1 else "") or {}
    except yaml.YAMLError as e:
        raise TranscriptError(f"the front matter is not YAML: {e}".replace("\n", " ")) from None
    except (ValueError, TypeError, OverflowError) as e:  # PyYAML's constructors: a date like 2020-13-45, !!float abc
        raise TranscriptError(f"the front matter holds a value YAML cannot construct: {e}") from None
    except RecursionError:  # PyYAML's composer recurses once per level
        raise TranscriptError("the front matter is nested too deeply to read") from None
    if not isinstance(front, dict) or front.get("kind") != KIND:
        raise TranscriptError(f"the front matter does not declare kind: {KIND}")
    sections = _sections(text, end + 1)
    blocks = {}
    for heading in (IDENTITY_HEADING, EVENTS_HEADING):
        if heading not in sections:
            raise TranscriptError(f"the section '## {heading}' is missing")
        found = sections[heading]
        if len(found) != 1 or found[0][0] != "yaml":
            raise TranscriptError(f"the section '## {heading}' must hold exactly one fenced yaml block, not {len(found)}")
        try:
            blocks[heading] = load(found[0][1])
        except yaml.YAMLError as e:
            raise TranscriptError(f"the block under '## {heading}' is not YAML: {e}".replace("\n", " ")) from None
        except (ValueError, TypeError, OverflowError) as e:
            raise TranscriptError(f"the block under '## {heading}' holds a value YAML cannot construct: {e}") from None
        except RecursionError:
            raise TranscriptError(f"the block under '## {heading}' is nested too deeply to read") from None
    return ParsedTranscript(front=front, identity=blocks[IDENTITY_HEADING], events=blocks[EVENTS_HEADING])
