"""The fast YAML layout of runner/transform/yamlfast.py is PyYAML's output or nothing, and its loader's
verdict is the pure loader's: no transcript byte and no intake verdict depends on which path
ran. Held over random values (with the strings PyYAML treats specially) and over the events of
the real 2.1.197 stream."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.harnesses.claude_code import stream
from runner.transform import transcript, yamlfast
from runner.transform.events import SessionFacts, session_event

AWKWARD = ["", " ", "a ", " a", "yes", "No", "null", "~", "true", "12", "0x1F", "1e3", "2026-12-03", "1_000",
           "-", "- a", "a: b", "a #b", "#", "'", '"', "---", "...", "?", "@x", "`x", "%x", "!x", "&x", "*x",
           "[x]", "{x}", "a\nb", "a\x85b", "\u2028", "é✓😀", "\t", "a\tb", "\x00", "\ufeff", "x" * 300,
           "docs/decisions/HW-DR-0052.md", "sha256:" + "a" * 64, "HW-DR-0052 current", "<synthetic>",
           "a:", "a:b", "a::b", ":a", "? a", "?a", "-a", "a #b", "a#b", "a\n", "\na", "a\n\n\nb", "a \nb", "a\n b",
           "it's\nhere", "<<", "=", "1:20", ".inf", "-.5", "+1", "0o17", "~x", "\ud800x", "😀\t", "\x7f", "\xa0", "x\u2028y", "x\ry",
           "cat <<'EOF'\nline: 1\n  two\nEOF"]
# Characters PyYAML's emitter decides on: indicators, quotes, breaks, tabs, controls, non-ASCII.
EMITTER_ALPHABET = "ab :-#?,[]{}'\"\n\t\\!&*|>%@`.~é😀\x00\x1b\x7f\xa0\ufeff"
strings = (st.sampled_from(AWKWARD) | st.text(max_size=30) | st.text(alphabet="abc :-#'\"\n ", max_size=12)
           | st.text(alphabet=EMITTER_ALPHABET, max_size=40))
scalars = st.none() | st.booleans() | st.integers(min_value=-10**20, max_value=10**20) | strings
keys = st.sampled_from(["probe", "session", "calls", "tool", "argument", "result", "yes", "12", "a b"]) | st.text(min_size=1, max_size=8)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
                      max_leaves=25)
PROFILE = settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _typed(v):
    """The value with its types spelt out (True == 1 in Python, not in YAML)."""
    if isinstance(v, dict):
        return {k: _typed(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_typed(x) for x in v]
    return (type(v).__name__, v)


@PROFILE
@given(st.dictionaries(keys, values, max_size=5) | st.lists(values, max_size=5))
def test_fast_layout_is_pyyaml_output_or_declines(value):
    fast = transcript._fast_dump(value)
    if fast is not None:
        assert fast == transcript._pyyaml_dump(value)
        assert _typed(yaml.safe_load(fast)) == _typed(value)


@PROFILE
@given(st.lists(st.text(alphabet=EMITTER_ALPHABET, max_size=40), min_size=1, max_size=3))
def test_fast_layout_answers_for_strings_it_can_write_and_reads_them_back(items):
    """Speed, not safety: every string without NEL, LS or PS is laid out without PyYAML, at any
    depth, and read back without PyYAML; a regression here sends transcripts to the slow path."""
    value = [{"probe": "HW-PRB-0001", "calls": [{"tool": "Bash", "argument": s} for s in items]}, items]
    fast = transcript._fast_dump(value)
    assert fast is not None and fast == transcript._pyyaml_dump(value)
    assert _typed(yamlfast.read(fast[:-1])) == _typed(value)


@PROFILE
@given(st.dictionaries(keys, values, max_size=5) | st.lists(values, max_size=5))
def test_reader_reads_back_every_text_the_fast_layout_writes(value):
    fast = transcript._fast_dump(value)
    if fast is not None:
        assert _typed(yamlfast.read(fast[:-1])) == _typed(value)


@PROFILE
@given(st.dictionaries(keys, values, max_size=5) | st.lists(values, max_size=5))
def test_loader_verdict_is_the_pure_loaders(value):
    for text in {transcript._pyyaml_dump(value).removesuffix("\n"), transcript._pyyaml_dump(value)}:
        assert _typed(transcript._load(text)) == _typed(yaml.safe_load(text))


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab:- #'\"[]{}\n\t!&*|>", max_size=30))
def test_loader_on_foreign_text_agrees_with_the_pure_loader(text):
    try:
        want = ("ok", _typed(yaml.safe_load(text)))
    except yaml.YAMLError:
        want = ("error",)
    try:
        got = ("ok", _typed(transcript._load(text)))
    except yaml.YAMLError:
        got = ("error",)
    assert got == want


def test_double_quoted_escapes_made_by_replace_are_the_patterns_for_every_bmp_character():
    for c in range(0x10000):
        text = f"a{chr(c)}\t\\\n\"b"
        assert yamlfast._double_quoted(text) == '"' + yamlfast._DOUBLE_QUOTED_ESCAPE.sub(yamlfast._escape, text) + '"'


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(["a", "é", "\\t", "\\n", '\\"', "\\\\", "\\x41", "\\u00e9", "\\N", "\\q", "\\"]), max_size=12))
def test_double_quoted_text_read_by_replace_is_read_as_by_the_pattern(pieces):
    def outcome(unescape):
        try:
            return ("read", unescape(body))
        except yamlfast._Unsafe:
            return ("declined",)

    body = "".join(pieces)
    assert outcome(yamlfast._unescaped) == outcome(lambda b: yamlfast._ESCAPE_SEQUENCE.sub(yamlfast._unescape, b))


def test_real_stream_events_render_the_same_on_both_paths():
    raw = (Path(__file__).parents[1] / "data" / "claude-code-2.1.197" / "read-write-answer.jsonl").read_bytes()
    files = {"out.md": b"Cites HW-DR-0052.\n"}
    facts = SessionFacts(probe="HW-PRB-0007", session="present-001", workspace="/workspace", config_dir="/session/config",
                         manifest={"a.md": "sha256:" + "1" * 64}, final_file=files.get,
                         identifiers=frozenset({"HW-DR-0052", "HW-DR-0061"}))
    outcome = session_event(stream.parse(raw.splitlines(keepends=True)), facts, ["current HW-DR-0052"],
                        re.compile(r"HW-DR-\d{4}"))
    assert outcome.event is not None and outcome.event["calls"]
    events = [outcome.event, {**outcome.event, "session": "present-002"}, {"probe": "HW-PRB-0008", "session": "absent-001"}]
    events = json.loads(json.dumps(events))  # no object shared between the events
    fast = transcript._fast_dump(events)
    assert fast is not None and fast == transcript._pyyaml_dump(events)
