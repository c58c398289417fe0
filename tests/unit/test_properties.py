"""Property tests: bad input never raises and never loses data, whatever its shape.

Hypothesis generates the inputs; each property states the only outcomes a parser may have.
The coverage-guided fuzzer (bench/fuzz.py) searches the same targets for much longer; these run
with every unit test, so their example counts are kept small.
"""

from __future__ import annotations

import json
import re
from pathlib import PurePosixPath

import fuzz_targets
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner import answer, digest
from runner.harnesses.claude_code import stream
from runner.transform import intake, transcript
from runner.transform.events import _Paths
from runner.transform.shell import Session

FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
IDENT = re.compile(r"HW-[A-Z]+-[0-9]{4}")
TOOLS = ["Read", "Write", "Edit", "MultiEdit", "Bash", "Grep", "Glob", "Task", "Agent", "NotebookEdit", "mcp__x__y", "LS"]

# JSON values as json.loads can return them: big integers, NaN and lone surrogates included
scalars = (st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=30))
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
paths = st.one_of(st.sampled_from(["/workspace/a.md", "/workspace/../etc/x", "a.md", "~/.ssh/k", "/workspace2/b"]),
                  st.text(alphabet="/.aw~ ", max_size=20))


def dump(obj: object) -> bytes:
    return (json.dumps(obj) + "\n").encode("utf-8", "surrogatepass")


@st.composite
def streams(draw) -> list[bytes]:
    """Streams of plausible lines in any order: init, calls, results (for known and unknown
    ids), status lines, result lines, and the odd damaged line."""
    ids = draw(st.lists(st.sampled_from(["t1", "t2", "t3"]), max_size=4))
    lines = []
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["init", "call", "result_block", "status", "result", "junk", "value"]))
        if kind == "init":
            lines.append(dump({"type": "system", "subtype": "init", "permissionMode": draw(st.sampled_from(["dontAsk", "bypassPermissions"])),
                               "plugins": draw(st.one_of(st.just([]), json_values)), "memory_paths": draw(json_values)}))
        elif kind == "call":
            tool = draw(st.sampled_from(TOOLS))
            inp = draw(st.dictionaries(st.sampled_from(["file_path", "path", "command", "pattern", "content", "x"]),
                                       st.one_of(paths, json_values), max_size=3))
            lines.append(dump({"type": "assistant", "message": {"model": draw(st.text(max_size=5)), "content": [
                {"type": "tool_use", "id": draw(st.sampled_from(ids or ["t1"])), "name": tool, "input": inp}]},
                "parent_tool_use_id": draw(st.none() | st.just("t1"))}))
        elif kind == "result_block":
            lines.append(dump({"type": "user", "message": {"content": [
                {"type": "tool_result", "tool_use_id": draw(st.sampled_from(ids or ["t1"]) | json_values),
                 "content": draw(json_values), "is_error": draw(json_values)}]}}))
        elif kind == "status":
            lines.append(dump({"type": draw(st.sampled_from(["rate_limit_event", "system", "x"])), "subtype": draw(st.text(max_size=5))}))
        elif kind == "result":
            lines.append(dump({"type": "result", "subtype": draw(st.sampled_from(["success", "error_max_turns", "error_during_execution"])),
                               "is_error": draw(st.booleans()), "result": draw(st.text(max_size=40)),
                               "total_cost_usd": draw(json_values)}))
        elif kind == "junk":
            lines.append(draw(st.binary(max_size=30)) + b"\n")
        else:
            lines.append(dump(draw(json_values)))
    if lines and draw(st.booleans()):
        lines[-1] = lines[-1].rstrip(b"\n")
    return lines


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # each renders a transcript
@given(streams())
def test_any_stream_ends_in_an_event_that_survives_the_transcript_or_in_refusals(lines):
    fuzz_targets.stream_target(b"".join(lines))


@FAST
@given(st.binary(max_size=2000))
def test_any_bytes_are_a_stream_with_a_defined_outcome(data):
    fuzz_targets.stream_target(data)


@FAST
@given(st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from("\x00\x85\u2028\ufeff'\":#-[]{}|>!&*"), max_size=40),
       st.sampled_from(TOOLS))
def test_any_argument_survives_the_transcript(text, tool):
    event = {"probe": fuzz_targets.PROBE, "session": text or "s", "answer": text,
             "calls": [{"tool": tool, "argument": text, "result": digest.of_text(text)}],
             "produced": [{"path": text, "cites": [text]}]}
    result = intake.confirm(fuzz_targets.render([event]), fuzz_targets.LOCK, {fuzz_targets.PROBE})
    assert result.refusal is None and result.events == [event]


@FAST
@given(json_values, json_values)
def test_digests_and_arguments_are_what_json_reads(tool_input, content):
    """orjson parses; json is the reference: a tool input and a tool result give the argument
    and digest that json's reading of the same line gives."""
    inp = {"q": tool_input}
    line_use = dump({"type": "assistant", "message": {"content": [{"type": "tool_use", "id": "t", "name": "mcp__a__b", "input": inp}]}})
    line_res = dump({"type": "user", "message": {"content": [{"type": "tool_result", "tool_use_id": "t", "content": content}]}})
    init = dump({"type": "system", "subtype": "init"})
    result = dump({"type": "result", "subtype": "success", "result": "x", "total_cost_usd": 1})
    parsed = stream.parse([init, line_use, line_res, result])
    if any("deeper than" in p for p in parsed.problems):
        return
    assert parsed.problems == []
    reference_input = json.loads(line_use.decode("utf-8", "surrogatepass"))["message"]["content"][0]["input"]
    reference_content = json.loads(line_res.decode("utf-8", "surrogatepass"))["message"]["content"][0]["content"]
    # an unknown tool is identified by its canonical input, as json reads it
    assert parsed.tool_uses[0].identity == digest.of_bytes(stream.canonical(reference_input))
    assert parsed.results["t"].digest == digest.of_bytes(stream.result_bytes(reference_content))


@settings(max_examples=400, deadline=None)
@given(st.recursive(scalars | st.sampled_from(["\ud800", "a\udfffb", "\u2028\x7f\x00\"\\", "é😀"]) | st.integers(),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=3) | st.sampled_from(["é", "😀", "\ud800", "Z"]), inner, max_size=4),
                    max_leaves=16))
def test_canonical_form_is_the_standard_librarys_byte_for_byte(value):
    """The digest of a list result and the argument of an open tool input are made from this form."""
    want = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass")
    assert stream.canonical(value) == want


def _relative_with_pathlib(workspace: str, path: str) -> str | None:
    """The workspace-relative path as computed with pathlib before it was done on strings."""
    ws = PurePosixPath(workspace)
    p = PurePosixPath(path)
    if not p.is_absolute():
        p = ws / p
    parts: list[str] = []
    for part in p.parts[1:]:
        if part == "..":
            if parts:
                parts.pop()
        elif part != ".":
            parts.append(part)
    norm = PurePosixPath("/", *parts)
    if norm == ws:
        return "."
    if ws in norm.parents:
        return norm.relative_to(ws).as_posix()
    return None


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(["/workspace", "/workspace/", "//workspace", "/", "/a/./b", "rel/ws"]),
       st.text(alphabet="/.aw", max_size=16) | st.sampled_from(["", ".", "..", "/workspace/..", "workspace"]))
def test_relative_paths_are_computed_as_pathlib_computed_them(workspace, path):
    assert _Paths(workspace).relative(path) == _relative_with_pathlib(workspace, path)


@settings(max_examples=1500, deadline=None)
@given(st.text(alphabet=" \t\r\n\x0b\xa0\u2003\x00ab/~'\"\\#|;&$()", max_size=30)
       | st.sampled_from(["", "''", "'' ''", "a#b c", "#x\ny", "\\", "'a", '"a\\"', '"a\\b\\"\\\\"', "a\\\nb",
                          "cat > n.md <<'EOF'\nx: 1 # y\nEOF\ngit commit -m \"a 'b'\""]))
def test_any_command_gives_the_paths_it_names_and_never_raises(command):
    shell = Session("/workspace", lambda p: p == "/workspace" or p.startswith("/workspace/"), keeps_cwd=True)
    for named in shell.named(command) + shell.named(command, subagent=True):
        assert named.resolved.startswith(("/", "~")), named
    assert shell.cwd.startswith("/workspace")  # the CLI puts a shell that left the workspace back


@FAST
@given(st.binary(max_size=1500) | json_values.map(lambda v: json.dumps({"probes": v, "campaign": v}).encode("utf-8", "surrogatepass")))
def test_the_plan_loader_and_probe_yml_only_refuse(tmp_path_factory, data):
    scratch = tmp_path_factory.mktemp("p")
    fuzz_targets.run("plan", data, scratch)
    fuzz_targets.run("plan", b"{" + data, scratch)
    fuzz_targets.run("probe_yml", data, scratch)


@FAST
@given(st.text(max_size=600))
def test_any_text_is_a_transcript_or_a_refusal_with_its_reason(text):
    for candidate in (text, fuzz_targets.sample_transcript().replace("current", text, 1), "---\n" + text):
        result = intake.confirm(candidate, fuzz_targets.LOCK, {fuzz_targets.PROBE})
        assert result.refusal is None or result.refusal.split(":")[0] in (
            "format", "identity", "taxonomy", "no prose", "realized cost")


@FAST
@given(json_values, json_values)
def test_any_identity_and_events_blocks_are_confirmed_or_refused(identity, events):
    """Whatever the blocks hold, intake answers; for a transcript just rendered, the answer
    without reading its blocks again is the answer of reading its text."""
    r = transcript.rendered({"title": "t"}, "t", [], identity if isinstance(identity, dict) else {"x": identity},
                            events if isinstance(events, list) else [events])
    verdict = intake.confirm(r.text, fuzz_targets.LOCK, {fuzz_targets.PROBE})
    assert repr(intake.confirm_rendered(r, fuzz_targets.LOCK, {fuzz_targets.PROBE})) == repr(verdict)


@FAST
@given(st.text(max_size=80), st.lists(st.text(max_size=20), max_size=3))
def test_the_answer_rule_never_raises_and_writes_only_a_declared_answer(message, declared):
    assert answer.answer_of(message, declared) in [None, *declared]


@FAST
@given(st.one_of(st.decimals(allow_nan=True).map(str), st.floats().map(repr),
                 st.integers(min_value=-10**40, max_value=10**40).map(str),
                 st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-0.0", "1e-999", '"0.1"'])))
def test_a_cost_is_a_finite_non_negative_amount_or_a_problem(literal):
    init = dump({"type": "system", "subtype": "init"})
    parsed = stream.parse([init, b'{"type":"result","subtype":"success","total_cost_usd":%s}\n' % literal.encode()])
    cost = parsed.cost_usd
    assert cost is None or (cost.is_finite() and 0 <= cost < stream.MAX_COST_USD)
    if cost is None and parsed.result is not None and literal != '"0.1"':
        assert any("which is not a cost" in p for p in parsed.problems)
