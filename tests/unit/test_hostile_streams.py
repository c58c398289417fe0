"""Hostile streams: each gets a defined outcome, stated as a problem with its line, or an event.

The stream comes from a session the recorder does not trust, so anything a line can hold is
tried: a 100 MB line, invalid UTF-8, NUL bytes, a result line in the middle, two init lines, a
tool result for a call nobody made, and values only the reference parser reads.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import subprocess
import sys

import fuzz_targets

from runner import digest
from runner.harnesses.claude_code import stream
from runner.transform import intake
from runner.transform.events import SessionFacts, session_event

INIT = {"type": "system", "subtype": "init", "cwd": "/workspace", "permissionMode": "dontAsk"}
RESULT = {"type": "result", "subtype": "success", "is_error": False, "result": "done", "total_cost_usd": 0.1}
IDENT = re.compile(r"HW-[A-Z]+-[0-9]{4}")
MB = 1 << 20


def line(obj: dict) -> bytes:
    return (json.dumps(obj) + "\n").encode()


def call(tid: str, name: str, **inp) -> bytes:
    return line({"type": "assistant", "message": {"model": "m", "content": [
        {"type": "tool_use", "id": tid, "name": name, "input": inp}]}, "parent_tool_use_id": None})


def answer(tid: str, content) -> bytes:
    return line({"type": "user", "message": {"content": [{"type": "tool_result", "tool_use_id": tid, "content": content}]}})


def outcome(lines: list[bytes]):
    facts = SessionFacts(probe="HW-PRB-0007", session="present-001", workspace="/workspace",
                         config_dir="/session/config", manifest={}, final_file=lambda rel: None,
                         identifiers=frozenset())
    return session_event(stream.parse(lines), facts, [], IDENT)


def survives_the_transcript(event: dict) -> bool:
    result = intake.confirm(fuzz_targets.render([event]), fuzz_targets.LOCK, {"HW-PRB-0007"})
    return result.refusal is None and result.events == [event]


def test_a_100_mb_line_is_read_in_linear_time_holding_about_one_line(tmp_path):
    """A 100 MB tool result is an ordinary result: its digest is the digest of its bytes. The
    parser holds the line, its parsed string and the string's UTF-8 while it digests it, and
    nothing of it afterwards; a quadratic reader would take minutes here."""
    path = tmp_path / "stream.jsonl"
    chunk = "0123456789abcdef" * (MB // 16 - 1) + "line\n"  # 1 MiB of text with an escape per MiB
    sha = hashlib.sha256()
    with open(path, "wb") as f:
        f.write(line(INIT) + call("t1", "Bash", command="cat big"))
        f.write(b'{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"t1","content":"')
        for _ in range(100):
            f.write(json.dumps(chunk)[1:-1].encode())
            sha.update(chunk.encode())
        f.write(b'"}]}}\n' + line(RESULT))
    size = path.stat().st_size
    assert size > 100 * 10**6
    # The process's own memory, in a fresh interpreter (not tracemalloc's count of Python's
    # allocations: a JSON library that allocates outside them would be invisible to it, or
    # counted twice; issue 30 found the bound failing under a newer orjson while RSS was the same).
    done = subprocess.run([sys.executable, "-c", PARSE_IN_A_FRESH_PROCESS, str(path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["seconds"] < 30
    assert seen["problems"] == []
    assert seen["digest"] == "sha256:" + sha.hexdigest()
    assert seen["peak"] < 3.5 * size  # the line, its string and the string's UTF-8 (measured: 3.0)
    # and nothing of it once parsed (the parser before this test kept 1.0; measured: 0.024, the
    # modules the parse imported and the allocator's arenas)
    assert seen["kept"] < 0.05 * size


# Peak: the growth of the resident set's high-water mark over the parse; kept: the resident set
# after it, over the one before it (the parsed stream alive).
PARSE_IN_A_FRESH_PROCESS = """
import json, os, resource, sys, time
from runner.harnesses.claude_code import stream

def resident():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

before, high = resident(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
start = time.monotonic()
with open(sys.argv[1], "rb") as f:
    parsed = stream.parse(f)
seconds = time.monotonic() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - high
print(json.dumps({"seconds": seconds, "problems": parsed.problems, "digest": parsed.results["t1"].digest,
                  "peak": peak, "kept": resident() - before}))
"""


def test_a_100_mb_line_of_junk_that_ends_the_stream_is_truncation(tmp_path):
    path = tmp_path / "stream.jsonl"
    with open(path, "wb") as f:
        f.write(line(INIT) + b'{"type":"user","message":')
        for _ in range(100):
            f.write(b"x" * MB)
    with open(path, "rb") as f:
        parsed = stream.parse(f)
    assert parsed.problems == [
        "the stream is truncated: line 2 ends without a newline and is not complete JSON",
        "the stream has no result line: it is incomplete, whatever else it holds"]


def test_invalid_utf8_in_a_tool_result_refuses_the_session_at_its_line():
    out = outcome([line(INIT), call("t1", "Read", file_path="/workspace/a.md"),
                   b'{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"t1","content":"\xc3\x28"}]}}\n',
                   line(RESULT)])
    assert out.event is None
    assert out.refusals == ["line 3 is not valid UTF-8"]


def test_utf8_encoded_surrogates_and_overlong_forms_are_not_utf8():
    for bad in (b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80"):
        parsed = stream.parse([line(INIT), b'{"type":"system","subtype":"x","t":"' + bad + b'"}\n', line(RESULT)])
        assert parsed.problems == ["line 2 is not valid UTF-8"], bad


def test_a_utf8_byte_order_mark_is_not_json():
    assert stream.parse([b"\xef\xbb\xbf" + line(INIT), line(RESULT)]).problems[0] == "line 1 is not a JSON document"


def test_raw_nul_bytes_are_not_json_but_an_escaped_nul_is_data():
    parsed = stream.parse([line(INIT), b"\x00\x00\n", b'{"type":"system","subtype":"x","t":"a\x00b"}\n',
                           b'{"type":"system","subtype":"x"}\x00\n', line(RESULT)])
    assert parsed.problems == ["line 2 is not a JSON document", "line 3 is not a JSON document",
                               "line 4 is not a JSON document"]
    out = outcome([line(INIT), call("t1", "Bash", command="printf 'a\x00b'"), answer("t1", "a\x00b"), line(RESULT)])
    assert out.refusals == []
    assert out.event["calls"] == [{"tool": "Bash", "argument": "printf 'a\x00b'", "result": digest.of_bytes(b"a\x00b")}]
    assert survives_the_transcript(out.event)


def test_a_result_line_in_the_middle_refuses_what_follows_it():
    out = outcome([line(INIT), line(RESULT), call("t1", "Read", file_path="/workspace/a.md"), answer("t1", "x")])
    assert out.event is None
    assert out.refusals == ["line 3 (assistant) comes after the result line", "line 4 (user) comes after the result line"]


def test_status_lines_after_the_result_line_are_tolerated_and_a_repeated_result_is_a_note():
    parsed = stream.parse([line(INIT), line(RESULT), line({"type": "rate_limit_event"}),
                           line({"type": "system", "subtype": "status"}), line(dict(RESULT, uuid="other"))])
    assert parsed.problems == []
    assert parsed.notes == ["line 5 repeats the result line"]


def test_a_second_different_result_line_is_refused():
    parsed = stream.parse([line(INIT), line(RESULT), line(dict(RESULT, result="other"))])
    assert parsed.problems == ["line 3 is a second, different result line"]


def test_two_init_lines_are_refused_and_the_first_one_is_the_check():
    second = dict(INIT, permissionMode="bypassPermissions")
    out = outcome([line(INIT), line(second), line(RESULT)])
    assert out.refusals == ["line 2 is a second init line"]
    assert stream.parse([line(INIT), line(second), line(RESULT)]).init == INIT


def test_a_tool_result_for_an_unknown_or_later_call_is_refused():
    out = outcome([line(INIT), answer("t9", "x"), call("t9", "Read", file_path="/workspace/a.md"), line(RESULT)])
    assert out.event is None
    assert out.refusals == ["line 2: a tool_result for tool_use id 't9', which no call of the stream made"]


def test_a_second_tool_result_and_a_reused_tool_use_id_are_refused():
    parsed = stream.parse([line(INIT), call("t1", "Bash", command="ls"), answer("t1", "a"), answer("t1", "b"),
                           call("t1", "Bash", command="ls"), line(RESULT)])
    assert parsed.problems == ["line 4: a second tool_result for tool_use id t1", "line 5: tool_use id t1 appears twice"]


def test_crlf_line_ends_and_blank_lines_are_tolerated():
    parsed = stream.parse([line(INIT).replace(b"\n", b"\r\n"), b"\n", b"  \r\n", line(RESULT).replace(b"\n", b"\r\n")])
    assert parsed.problems == [] and parsed.complete


def test_a_lone_surrogate_escape_is_read_as_json_reads_it():
    """JSON.stringify writes a lone surrogate as an escape when a string is cut inside a pair;
    the digest is of the bytes the surrogate stands for, as before orjson was used."""
    out = outcome([line(INIT), call("t1", "Bash", command="head -c 5 x"),
                   b'{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":"t1","content":"ab\\ud83d"}]}}\n',
                   line(RESULT)])
    assert out.refusals == []
    assert out.event["calls"][0]["result"] == digest.of_bytes(b"ab\xed\xa0\xbd")


def test_an_integer_beyond_64_bits_in_a_tool_input_keeps_every_digit():
    big = 123456789012345678901234567890
    out = outcome([line(INIT), call("t1", "mcp__calc__add", a=big, b=-0.5), answer("t1", "x"), line(RESULT)])
    # an unknown tool is identified by its canonical input, every digit of it as json reads it
    assert out.event["calls"][0]["argument"] == digest.of_bytes(b'{"a":123456789012345678901234567890,"b":-0.5}')
    assert survives_the_transcript(out.event)


def test_nan_in_a_tool_input_is_read_and_written_as_json_writes_it():
    out = outcome([line(INIT), b'{"type":"assistant","message":{"content":[{"type":"tool_use","id":"t1","name":"X","input":{"v":NaN}}]}}\n',
                   answer("t1", "x"), line(RESULT)])
    assert out.event["calls"][0]["argument"] == digest.of_bytes(b'{"v":NaN}')


def test_a_line_that_is_not_an_object_is_refused():
    parsed = stream.parse([line(INIT), b"[1, 2]\n", b'"text"\n', b"null\n", line(RESULT)])
    assert parsed.problems == ["line 2 is not a JSON object", "line 3 is not a JSON object", "line 4 is not a JSON object"]


def test_unknown_line_types_and_odd_values_are_tolerated():
    parsed = stream.parse([line({"type": "system", "subtype": "hook_started"}), line(INIT),
                           line({"type": 7}), line({"no": "type"}), line({"type": "new_kind_2030", "x": [1]}),
                           line(RESULT)])
    assert parsed.problems == [] and parsed.complete


def test_a_stream_read_from_a_file_object_gives_the_same_outcome_as_from_lines():
    lines = [line(INIT), call("t1", "Bash", command="ls"), answer("t1", [{"type": "text", "text": "a"}]), line(RESULT)]
    assert outcome(lines).event == outcome(list(io.BytesIO(b"".join(lines)))).event


def _nested(levels: int) -> dict:
    """A mapping whose innermost mapping is ``levels`` below it, holding a float only the
    reference parser reads exactly."""
    value: dict = {"f": 1e300}
    for _ in range(levels):
        value = {"a": value}
    return value


def test_nesting_is_refused_from_the_64th_level_in_inputs_and_results():
    for where in ("input", "result"):
        for levels, refused in ((63, False), (64, True)):
            # the innermost mapping ``levels`` below the input, or below the result's content list
            lines = [line(INIT), call("t1", "mcp__x__y", **_nested(levels)) if where == "input" else call("t1", "mcp__x__y"),
                     answer("t1", [_nested(levels - 1)] if where == "result" else "ok"), line(RESULT)]
            problems = stream.parse(lines).problems
            depth_problem = [p for p in problems if "deeper than 64 levels" in p]
            assert bool(depth_problem) == refused, (where, levels, problems)
