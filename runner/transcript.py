"""The transcript file: YAML front matter, prose, and two headings with one fenced ``yaml``
block each, holding only the contract's four closed key sets.

``render`` writes it and ``parse`` reads one back (ours or anybody's) strictly enough that
intake can confirm it: a heading missing or doubled, a second fenced block, or a block that is
not YAML is a refusal of the whole file, stated with its reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import yaml

from runner import yamlfast

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


class _Dumper(yaml.SafeDumper):
    """PyYAML's safe dumper, except that a string holding NEL (U+0085) is double-quoted.

    The emitter takes NEL for a line break and writes it as one inside a single-quoted scalar,
    which reads back as a space: the string a session gave would change on its way into the
    transcript. Double quotes escape it as ``\\N``, which reads back as NEL."""

    def represent_str(self, data: str) -> yaml.ScalarNode:
        if "\x85" in data:
            return self.represent_scalar("tag:yaml.org,2002:str", data, style='"')
        return super().represent_str(data)


_Dumper.add_representer(str, _Dumper.represent_str)


def _pyyaml_dump(value: object) -> str:
    return yaml.dump(value, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=10**6)


_fast_dump = yamlfast.dumper(_pyyaml_dump, _Dumper.yaml_implicit_resolvers)
_load = yamlfast.loader(_fast_dump)


def _dump(value: object) -> str:
    """PyYAML's text, from the fast layout when it can vouch for the value (runner/yamlfast.py)."""
    text = _fast_dump(value)
    return _pyyaml_dump(value) if text is None else text


@dataclass(frozen=True)
class Rendered:
    """A transcript as ``render`` wrote it: the text, and for each YAML block (front matter,
    identity, events) the text it was written as with the value it was written from."""

    text: str
    blocks: tuple[tuple[str, object], ...]


def rendered(front: dict, title: str, prose: list[str], identity: dict, events: list[dict]) -> Rendered:
    blocks = tuple((_dump(value), value) for value in ({"kind": KIND, **front}, identity, events))
    parts = [
        "---\n" + blocks[0][0] + "---\n",
        f"# {title}\n",
        *(p.rstrip() + "\n" for p in prose),
        f"## {IDENTITY_HEADING}\n",
        "```yaml\n" + blocks[1][0] + "```\n",
        f"## {EVENTS_HEADING}\n",
        "```yaml\n" + blocks[2][0] + "```\n",
    ]
    return Rendered("\n".join(parts), blocks)


def render(front: dict, title: str, prose: list[str], identity: dict, events: list[dict]) -> str:
    return rendered(front, title, prose, identity, events).text


@dataclass
class ParsedTranscript:
    front: dict
    identity: object
    events: object


_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^(`{3,}|~{3,})\s*([A-Za-z0-9_-]*)\s*$")


def _sections(lines: list[str]) -> dict[str, list[list[str]]]:
    """Level-2 sections -> the fenced blocks (lines) under each, with their info strings."""
    sections: dict[str, list] = {}
    current = None
    fence = None
    block: list[str] = []
    info = ""
    for line in lines:
        if fence is not None:
            if line.strip() == fence:
                if current is not None:
                    sections[current].append((info, block))
                fence = None
            else:
                block.append(line)
            continue
        m = _FENCE.match(line.strip())
        if m:
            fence, info, block = m.group(1), m.group(2), []
            continue
        h = _HEADING.match(line)
        if h and len(h.group(1)) == 2:
            current = h.group(2)
            if current in sections:
                raise TranscriptError(f"the heading '## {current}' appears twice")
            sections[current] = []
        elif h and len(h.group(1)) == 1:
            current = None
    if fence is not None:
        raise TranscriptError("a fenced block is not closed")
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
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        raise TranscriptError("the file does not start with YAML front matter")
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise TranscriptError("the front matter is not closed") from None
    try:
        front = load("\n".join(lines[1:end])) or {}
    except yaml.YAMLError as e:
        raise TranscriptError(f"the front matter is not YAML: {e}".replace("\n", " ")) from None
    except RecursionError:  # PyYAML's composer recurses once per level
        raise TranscriptError("the front matter is nested too deeply to read") from None
    if not isinstance(front, dict) or front.get("kind") != KIND:
        raise TranscriptError(f"the front matter does not declare kind: {KIND}")
    sections = _sections(lines[end + 1:])
    blocks = {}
    for heading in (IDENTITY_HEADING, EVENTS_HEADING):
        if heading not in sections:
            raise TranscriptError(f"the section '## {heading}' is missing")
        found = sections[heading]
        if len(found) != 1 or found[0][0] != "yaml":
            raise TranscriptError(f"the section '## {heading}' must hold exactly one fenced yaml block, not {len(found)}")
        try:
            blocks[heading] = load("\n".join(found[0][1]))
        except yaml.YAMLError as e:
            raise TranscriptError(f"the block under '## {heading}' is not YAML: {e}".replace("\n", " ")) from None
        except RecursionError:
            raise TranscriptError(f"the block under '## {heading}' is nested too deeply to read") from None
    return ParsedTranscript(front=front, identity=blocks[IDENTITY_HEADING], events=blocks[EVENTS_HEADING])
