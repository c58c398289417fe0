"""Every input under tests/data/fuzz/ once crashed a parser (a traceback instead of a refusal).

``bench/fuzz.py`` writes what its runs find there, and inputs found by reading the code are
kept in the same format: the first byte picks the target (see tests/fuzz_targets.py).
Each is replayed through its target, which raises on anything but a defined outcome; the
inputs whose outcome matters in itself are also checked for that outcome.
"""

from __future__ import annotations

import io
from pathlib import Path

import fuzz_targets
import pytest

from runner.errors import UserError
from runner.harnesses.claude_code import stream
from runner.plan import load_plan
from runner.seal import PROBE_CONFIG, load_probe_config

FUZZ = Path(__file__).parents[1] / "data" / "fuzz"
INPUTS = sorted(FUZZ.glob("*.bin"))


def test_there_are_inputs_to_replay():
    assert len(INPUTS) >= 9


@pytest.mark.parametrize("path", INPUTS, ids=lambda p: p.name)
def test_replay_reaches_a_defined_outcome(path, tmp_path):
    data = path.read_bytes()
    target = fuzz_targets.TARGETS[data[0] % len(fuzz_targets.TARGETS)]
    assert path.name.startswith(target)  # the name says which parser the input crashed
    fuzz_targets.run(target, data[1:], tmp_path)


def stream_of(name: str) -> stream.ParsedStream:
    return stream.parse(io.BytesIO((FUZZ / name).read_bytes()[1:]))


def test_a_line_whose_type_is_an_object_is_an_unknown_line():
    parsed = stream_of("stream-1800cfbfce4322f4.bin")  # line 2 is {"type": {...}, ...}
    assert not any("line 2" in p for p in parsed.problems)
    assert parsed.problems[:2] == ["line 1 is not a JSON document",
                                   "the stream is truncated: line 3 ends without a newline and is not complete JSON"]


def test_a_tool_result_naming_its_call_by_an_object_is_refused():
    lines = [b'{"type":"system","subtype":"init"}\n',
             b'{"type":"user","message":{"content":[{"type":"tool_result","tool_use_id":{"a":1},"content":"x"}]}}\n']
    assert stream.parse(lines).problems[0] == "line 2: a tool_result for tool_use id {'a': 1}, which no call of the stream made"


def test_a_line_nested_past_any_parser_is_refused_by_line():
    assert stream_of("stream-nested-too-deep.bin").problems[0] == "line 1 is nested too deeply to read"


def test_a_tool_input_nested_past_64_levels_is_refused():
    assert "line 2 nests a tool input or result deeper than 64 levels" in stream_of("stream-deep-tool-input.bin").problems


def test_a_nan_cost_is_refused_and_counts_as_no_cost():
    parsed = stream_of("stream-nan-cost-and-scalar-plugins.bin")
    assert "line 2: the result line states a cost of NaN USD, which is not a cost" in parsed.problems
    assert parsed.cost_usd is None
    assert parsed.init["memory_paths"]  # the 900-deep list was read, and the init check walks it without recursion


@pytest.mark.parametrize("name, message", [
    ("plan-json-nested-too-deep.bin", "nested too deeply to read"),
    ("plan-json-integer-over-4300-digits.bin", "cannot read a value"),
    ("plan-yaml-impossible-date.bin", "cannot read a value"),
    ("plan-identifier-pattern-nested-groups.bin", "identifier_pattern: not a valid regular expression"),
])
def test_plan_files_are_user_errors_with_a_reason(tmp_path, name, message):
    data = (FUZZ / name).read_bytes()[1:]
    path = tmp_path / ("plan.json" if data[:1] == b"{" else "plan.yml")
    path.write_bytes(data)
    with pytest.raises(UserError, match=message):
        load_plan(path)


def test_probe_yml_nested_too_deep_is_a_user_error(tmp_path):
    (tmp_path / PROBE_CONFIG).parent.mkdir()
    (tmp_path / PROBE_CONFIG).write_bytes((FUZZ / "probe_yml-nested-too-deep.bin").read_bytes()[1:])
    with pytest.raises(UserError, match="nested too deeply to read"):
        load_probe_config(tmp_path)
