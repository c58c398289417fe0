"""Real stream-json captures of other projects, several CLI versions: each parses and
transforms to its defined outcome (an event, or refusals that name the contract's reason).

The captures and their sources are listed in tests/data/captures/README.md. Most were recorded
under bypassPermissions with the host's plugins, so the contract refuses them at the init
line; that refusal is the defined outcome asserted here. ``expected-outcomes.json`` holds what
the transform derived from each capture before the transform was optimised (see the README),
with the init check set aside so that the calls of every capture are compared too.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path

import pytest

from runner import digest
from runner.harnesses.claude_code import stream
from runner.transform.events import SessionFacts, session_event

DATA = Path(__file__).parents[1] / "data"
CAPTURES = DATA / "captures"
EXPECTED = CAPTURES / "expected-outcomes.json"
IDENT = re.compile(r"HW-[A-Z]+-[0-9]{4}")
NO_RESULT = "the stream has no result line: it is incomplete, whatever else it holds"


def streams() -> list[Path]:
    return sorted(p for p in CAPTURES.rglob("*") if p.suffix in (".jsonl", ".ndjson")) + [
        DATA / "claude-code-2.1.197" / "read-write-answer.jsonl"]


def run(path: Path, compliant_init: bool = False):
    """Parse and transform as the transform does: the workspace is the init line's cwd, and its
    sealed manifest holds the .md files the session read."""
    with open(path, "rb") as f:
        workspace = (stream.parse(f).init or {}).get("cwd", "/workspace")
        f.seek(0)
        reads = [u.input["file_path"] for u in stream.parse(f).tool_uses if u.name == "Read"]
        f.seek(0)
        manifest = {p[len(workspace) + 1:]: digest.of_text(p) for p in reads if p.startswith(workspace + "/") and p.endswith(".md")}
        facts = SessionFacts(probe="p", session="present-001", workspace=workspace, config_dir="/session/config",
                             manifest=manifest, final_file=lambda rel: None, identifiers=frozenset())
        parsed = stream.parse(f)
    if compliant_init and parsed.init is not None:
        parsed.init = {"permissionMode": "dontAsk"}
    return parsed, session_event(parsed, facts, ["4", "ok"], IDENT)


def outcome(path: Path) -> dict:
    """Everything the transform derives from a capture, as JSON."""
    parsed, out = run(path)
    _, relaxed = run(path, compliant_init=True)
    return {"problems": parsed.problems, "notes": out.notes, "refusals": out.refusals,
            "cost_usd": None if out.cost_usd is None else str(out.cost_usd), "served_models": out.served_models,
            "outside_paths": out.outside_paths, "event_with_compliant_init": relaxed.event}


def key(path: Path) -> str:
    return path.relative_to(DATA).as_posix()


def test_every_capture_has_a_recorded_outcome():
    assert sorted(json.loads(EXPECTED.read_text())) == sorted(key(p) for p in streams())


@pytest.mark.parametrize("path", streams(), ids=key)
def test_transform_gives_the_outcome_recorded_before_the_optimisation(path):
    assert outcome(path) == json.loads(EXPECTED.read_text())[key(path)]


def test_cli_2_1_7_minimal_session_is_an_event():
    parsed, out = run(CAPTURES / "claude-agent-sdk-gleam" / "basic_query.ndjson")
    assert parsed.problems == [] and out.refusals == []
    assert out.event == {"probe": "p", "session": "present-001", "calls": [], "produced": [], "answer": "4"}
    assert out.cost_usd == Decimal("0.1354875")
    assert out.served_models == ["claude-opus-4-5-20251101"]


def test_cli_2_1_117_hook_before_init_and_rate_limit_parse_cleanly_then_init_refuses():
    for name in ("simple-turn.jsonl", "tool-call-turn.jsonl"):
        parsed, out = run(CAPTURES / "claw-drive" / name)
        assert parsed.problems == [], name  # hook_started before init and rate_limit_event are tolerated
        assert out.event is None
        assert "the init line shows permission mode bypassPermissions" in out.refusals
        assert any("plugin 'superpowers'" in r for r in out.refusals)
        assert any("MCP server 'chrome-devtools'" in r for r in out.refusals)
        assert any("skill 'superpowers:writing-plans', which carries a plugin namespace" in r for r in out.refusals)
    parsed, _ = run(CAPTURES / "claw-drive" / "tool-call-turn.jsonl")
    assert [(u.name, u.input["command"]) for u in parsed.tool_uses] == [("Bash", "echo hi from probe")]
    assert parsed.cost_usd == Decimal("0.103154")


def test_cli_2_1_220_result_line_mid_stream_then_second_init_is_refused():
    parsed, out = run(CAPTURES / "claw-drive" / "context-limit.prefix.jsonl")
    # hook_started and hook_response precede init; the result line is line 27, a second session's init follows
    assert parsed.problems == ["line 28 (system) comes after the result line"]
    assert out.event is None and out.refusals[0] == parsed.problems[0]


def test_cli_2_1_72_subagent_calls_keep_their_parent_and_do_not_name_the_served_version():
    parsed, out = run(CAPTURES / "obers_ui" / "last_raw_stream.prefix.jsonl")
    assert [(u.name, u.parent) for u in parsed.tool_uses] == [
        ("Agent", None), ("Read", "toolu_013F5ztK1wuHYRB4Viucvs4v")]
    assert parsed.served_models == ["claude-sonnet-4-6"]  # the subagent's haiku is not the served version
    assert parsed.problems == [NO_RESULT]  # the excerpt ends before the result line
    assert out.event is None


def test_old_cli_multiedit_and_cost_usd():
    parsed, out = run(CAPTURES / "terragon-oss" / "claude-json-multiedit-test.excerpt.jsonl")
    assert parsed.problems == []
    assert parsed.cost_usd == Decimal("0.6496079")  # cost_usd, not total_cost_usd; the CLI wrote 0.6496078999999999
    assert out.refusals == ["the init line shows permission mode bypassPermissions"]
    _, relaxed = run(CAPTURES / "terragon-oss" / "claude-json-multiedit-test.excerpt.jsonl", compliant_init=True)
    calls = relaxed.event["calls"]
    assert [(c["tool"], c["argument"]) for c in calls] == [("MultiEdit", "apps/www/src/components/promptbox.tsx")] * 2
    # Both MultiEdits failed (the file had not been read; a no-op edit): "A write call that failed
    # produced nothing" (issue 11), so nothing is listed although both name the file.
    assert [c["result"] for c in calls] != [None, None]
    assert relaxed.event["produced"] == []
