"""Fast tests of the contract's rules: answers, plan validation, stream refusals, intake."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path

import pytest

from runner import digest
from runner.answer import answer_of
from runner.errors import SealError, UserError
from runner.harnesses.claude_code import stream
from runner.plan import parse_plan
from runner.seal import seal
from runner.transform.events import SessionFacts, session_event
from runner.transform.intake import confirm
from runner.transform.transcript import render

FIXTURE = Path(__file__).parents[1] / "data" / "claude-code-2.1.197" / "read-write-answer.jsonl"
DECLARED = ["current HW-DR-0052", "superseded HW-DR-0052"]
IDENT = re.compile("HW-[A-Z]+-[0-9]{4}")
LOCK = "sha256:" + "1" * 64


@pytest.mark.parametrize("message, expected", [
    ("current HW-DR-0052", "current HW-DR-0052"),
    ("HW-DR-0052 current", "current HW-DR-0052"),            # #1384: order does not matter
    ("HW-DR-0052 current.", "current HW-DR-0052"),           # one trailing period stripped
    ("CURRENT hw-dr-0052", "current HW-DR-0052"),            # case folded
    ("It says so in the file.\nHW-DR-0052 current\n\n", "current HW-DR-0052"),  # #980: the final line
    ("HW-DR-0052 current\nThat is the status.", None),       # the last line is a sentence
    ("**current** HW-DR-0052", None),                       # emphasis stays part of the word
    ("0052 current HW-DR-0052", None),                      # an extra word
    ("current", None),                                      # a missing word
    ("current current HW-DR-0052", "current HW-DR-0052"),   # compared as a set: a repeated word adds nothing
    ("superseded  HW-DR-0052", "superseded HW-DR-0052"),     # runs of space split once
    ("", None),
    (None, None),
])
def test_answer_rule(message, expected):
    assert answer_of(message, DECLARED) == expected


def _plan(**over) -> dict:
    plan = {"campaign": "c", "tier": "campaign", "model": "m",
            "identity": {"lock": LOCK, "tree": LOCK, "selection": LOCK, "read_set": LOCK, "seed": 1, "harness": "h"},
            "arms": ["present", "absent"], "repetitions": 2, "identifier_pattern": IDENT.pattern,
            "probes": [{"id": "HW-PRB-0007", "path": "docs/probes/p.md", "title": "Status of HW-DR-0052",
                        "task": "What is it?", "answers": DECLARED}]}
    plan.update(over)
    return plan


@pytest.mark.parametrize("change, message", [
    ({"extra": 1}, "extra: unknown key"),
    ({"tier": "nightly"}, "tier: Input should be"),
    ({"arms": ["present", "sideways"]}, "arms[1]: Input should be"),
    ({"arms": ["present", "present"]}, "arms: duplicate arm(s): present"),
    ({"repetitions": 0}, "repetitions: Input should be greater than or equal to 1"),
    ({"repetitions": 1000}, "repetitions: Input should be less than or equal to 999"),
    ({"identifier_pattern": "("}, "identifier_pattern: not a valid regular expression"),
    ({"identity": {"lock": "sha256:ABC", "tree": LOCK, "selection": LOCK, "read_set": LOCK, "seed": 1, "harness": "h"}},
     "identity.lock: must be 'sha256:' followed by 64 lowercase hex digits"),
])
def test_plan_errors_name_the_field(change, message):
    with pytest.raises(UserError) as e:
        parse_plan(_plan(**change), "plan.json")
    assert f"plan.json: {message}" in str(e.value)


def test_plan_refuses_duplicate_probes_and_empty_tasks():
    probe = _plan()["probes"][0]
    with pytest.raises(UserError, match=r"duplicate probe id\(s\): HW-PRB-0007"):
        parse_plan(_plan(probes=[probe, {**probe, "path": "docs/probes/q.md"}]))
    with pytest.raises(UserError, match=r"probes\[0\].task: the task is empty"):
        parse_plan(_plan(probes=[{**probe, "task": "  \n"}]))
    with pytest.raises(UserError, match=r"probes\[0\].path: must be a relative path"):
        parse_plan(_plan(probes=[{**probe, "path": "../x.md"}]))


def test_sessions_expand_probe_by_arm_by_repetition():
    sessions = parse_plan(_plan()).sessions()
    assert [s.key for s in sessions] == ["HW-PRB-0007/present-001", "HW-PRB-0007/present-002",
                                         "HW-PRB-0007/absent-001", "HW-PRB-0007/absent-002"]


# --- sealing ------------------------------------------------------------------------------

def _corpus(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_sealing_removes_the_probe_its_answer_keys_and_what_names_them(tmp_path):
    corpus = _corpus(tmp_path / "corpus", {
        "docs/probes/p.md": "# probe",
        "docs/probes/other.md": "# another probe",
        "docs/probe-runs/r.md": "old recording",
        "docs/decisions/HW-DR-0052.md": "Status: current.\n",
        "docs/mention.md": "see HW-PRB-0007\n",
        "docs/notes/answer.md": "current HW-DR-0052\n",
        "docs/index.md": "keep me\n- docs/notes/answer.md\n- notes/answer.md is ../notes/answer.md\nkeep too\n",
        "tools/probe/README.md": "The probe Status of HW-DR-0052 is recorded elsewhere.\n",
        "tools/other.md": "about Status of HW-DR-0052\n",
        ".headwater/probe.yml": "folds: [tools/probe/README.md]\nanswer_keys:\n  HW-PRB-0007: [docs/notes/answer.md]\n",
        ".git/HEAD": "ref: HW-PRB-0007",
        "CLAUDE.md": "read decisions\n",
    })
    plan = parse_plan(_plan())
    ws = seal(corpus, plan, plan.probes[0], "present", tmp_path / "ws")
    files = sorted(p.relative_to(ws.path).as_posix() for p in ws.path.rglob("*") if p.is_file())
    assert files == ["CLAUDE.md", "docs/decisions/HW-DR-0052.md", "docs/index.md", "tools/probe/README.md"]
    assert (ws.path / "docs/index.md").read_text() == "keep me\nkeep too\n"
    assert ws.manifest["docs/index.md"] == digest.of_text("keep me\nkeep too\n")
    assert ws.folds_kept == ["tools/probe/README.md"]
    assert ws.removed[".headwater/probe.yml"] == "names the probe"
    absent = seal(corpus, plan, plan.probes[0], "absent", tmp_path / "ws-absent")
    assert "CLAUDE.md" not in absent.manifest and absent.removed["CLAUDE.md"] == "removed by the absent arm"


def test_a_fold_that_states_an_answer_refuses_the_workspace(tmp_path):
    corpus = _corpus(tmp_path / "corpus", {
        "tools/probe/README.md": "Status of HW-DR-0052: the answer is current HW-DR-0052\n",
        ".headwater/probe.yml": "folds: [tools/probe/README.md]\n",
    })
    plan = parse_plan(_plan())
    with pytest.raises(SealError, match="is a fold but states the answer 'current HW-DR-0052'"):
        seal(corpus, plan, plan.probes[0], "present", tmp_path / "ws")


def test_a_link_out_of_the_corpus_refuses_the_workspace(tmp_path):
    corpus = _corpus(tmp_path / "corpus", {"docs/a.md": "a"})
    (corpus / "docs/escape").symlink_to("/etc/passwd")
    plan = parse_plan(_plan())
    with pytest.raises(SealError, match="leads out of the corpus"):
        seal(corpus, plan, plan.probes[0], "present", tmp_path / "ws")


def test_the_no_hook_arm_removes_only_the_hooks_key(tmp_path):
    settings = {"hooks": {"SessionStart": []}, "permissions": {"allow": ["Read"]}}
    corpus = _corpus(tmp_path / "corpus", {".claude/settings.json": json.dumps(settings), ".mcp.json": "{}"})
    plan = parse_plan(_plan())
    ws = seal(corpus, plan, plan.probes[0], "no-hook", tmp_path / "ws")
    assert json.loads((ws.path / ".claude/settings.json").read_text()) == {"permissions": {"allow": ["Read"]}}
    assert (ws.path / ".mcp.json").exists()


# --- stream and transform -----------------------------------------------------------------

def _facts(**over) -> SessionFacts:
    base = dict(probe="HW-PRB-0007", session="present-001", workspace="/workspace", config_dir="/session/config",
                manifest={"a.md": digest.of_text("# doc HW-DR-0052\n")},
                final_file=lambda rel: b"Cites HW-DR-0052.\n" if rel == "out.md" else None,
                identifiers=frozenset({"HW-DR-0052"}))
    base.update(over)
    return SessionFacts(**base)


def _lines() -> list[bytes]:
    return FIXTURE.read_bytes().splitlines(keepends=True)


def test_the_real_fixture_transforms_to_the_complete_event():
    out = session_event(stream.parse(_lines()), _facts(), DECLARED, IDENT)
    write_result = "File created successfully at: /workspace/out.md (file state is current in your context — no need to Read it back)"
    assert out.refusals == []
    assert out.event == {
        "probe": "HW-PRB-0007", "session": "present-001",
        "calls": [{"tool": "Read", "argument": "a.md", "result": digest.of_text("# doc HW-DR-0052\n")},
                  {"tool": "Write", "argument": "out.md", "result": digest.of_text(write_result)}],
        "produced": [{"path": "out.md", "result": digest.of_text("Cites HW-DR-0052.\n"), "cites": ["HW-DR-0052"]}],
        "answer": "current HW-DR-0052",
    }
    assert out.cost_usd == Decimal("0.003") and out.served_models == ["claude-opus-4-8-20261101"]


def _without(pred) -> list[bytes]:
    return [ln for ln in _lines() if not pred(json.loads(ln))]


@pytest.mark.parametrize("lines, reason", [
    (lambda: _without(lambda o: o["type"] == "result"), "no result line"),
    (lambda: _without(lambda o: o.get("subtype") == "init"), "no init line"),
    (lambda: _lines()[:-1] + [_lines()[-1][:40]], "truncated"),
    (lambda: _lines()[:2] + [b"\xff\xfe{}\n"] + _lines()[2:], "not valid UTF-8"),
    (lambda: _lines()[:2] + [b"not json\n"] + _lines()[2:], "not a JSON document"),
    (lambda: _lines()[:1] + _lines()[:1] + _lines()[1:], "second init line"),
    (lambda: _lines() + _lines()[1:2], "comes after the result line"),
    (lambda: _without(lambda o: o["type"] == "assistant" and o["message"]["content"][0]["type"] == "tool_use"), "which no call of the stream made"),
])
def test_unsound_streams_are_refused_with_a_reason(lines, reason):
    out = session_event(stream.parse(lines()), _facts(), DECLARED, IDENT)
    assert out.event is None
    assert any(reason in r for r in out.refusals), out.refusals


def test_a_harness_error_is_refused_and_max_turns_is_recorded_without_answer():
    def with_result(**fields):
        lines = _lines()
        result = json.loads(lines[-1])
        result.update(fields)
        return lines[:-1] + [json.dumps(result).encode() + b"\n"]

    err = session_event(stream.parse(with_result(is_error=True, result="API Error: 500")), _facts(), DECLARED, IDENT)
    assert err.event is None and any("harness reported an error" in r for r in err.refusals)
    turns = session_event(stream.parse(with_result(subtype="error_max_turns", is_error=True)), _facts(), DECLARED, IDENT)
    assert turns.refusals == [] and turns.event["answer"] is None


def test_absent_keys_say_that_nothing_watched():
    """"An event with no calls key says that nothing watched": the artifacts were not collected, so
    no produced key; the session was watched, so its answer is recorded, null where the probe
    declares none ("Every other message records answer: null")."""
    out = session_event(stream.parse(_lines()), _facts(artifacts_collected=False), [], IDENT)
    assert "produced" not in out.event and out.event["answer"] is None and "calls" in out.event


@pytest.mark.parametrize("init_change, reason", [
    ({"permissionMode": "bypassPermissions"}, "bypassPermissions"),
    ({"plugins": [{"name": "p", "path": "/opt/p"}]}, "plugin 'p' at '/opt/p', which is not builtin"),
    ({"mcp_servers": [{"name": "extra", "status": "connected"}]}, "MCP server 'extra'"),
    ({"skills": ["plug:skill"]}, "carries a plugin namespace"),
    ({"skills": ["host-skill"]}, "a skill directory of the host"),
    ({"memory_paths": {"auto": "/elsewhere/memory/"}}, "outside the configuration directory"),
])
def test_each_init_line_item_refuses(init_change, reason):
    lines = _lines()
    init = {**json.loads(lines[0]), **init_change}
    out = session_event(stream.parse([json.dumps(init).encode() + b"\n"] + lines[1:]),
                    _facts(host_skills=frozenset({"host-skill"})), DECLARED, IDENT)
    assert out.event is None and any(reason in r for r in out.refusals), out.refusals


# --- transcript and intake ----------------------------------------------------------------

IDENTITY = {"model": "m", "served_version": "m-1", "tree": LOCK, "lock": LOCK, "selection": LOCK, "read_set": LOCK,
            "seed": 1, "harness": "h", "tier": "campaign", "arm": "present", "at": "2026-12-02T00:00:00Z", "cost_cents": 3}
EVENT = {"probe": "HW-PRB-0007", "session": "present-001",
         "calls": [{"tool": "Read", "argument": "a.md", "result": LOCK}], "produced": [], "answer": None}


def _confirm(identity=IDENTITY, events=(EVENT,)):
    return confirm(render({}, "t", ["prose"], identity, list(events)), LOCK, {"HW-PRB-0007"})


def test_a_good_transcript_round_trips_and_is_accepted():
    result = _confirm()
    assert result.refusal is None and result.events == [EVENT]


@pytest.mark.parametrize("identity, events, reason", [
    ({**IDENTITY, "lock": "sha256:" + "2" * 64}, [EVENT], "taxonomy"),
    ({k: v for k, v in IDENTITY.items() if k != "cost_cents"}, [EVENT], "identity: the run identity lacks cost_cents"),
    ({**IDENTITY, "reasoning": "x"}, [EVENT], "run identity carries key(s) outside its closed set: reasoning"),
    (IDENTITY, [{**EVENT, "reasoning": "x"}], "event 0 carries key(s) outside its closed set: reasoning"),
    (IDENTITY, [{**EVENT, "calls": [{"tool": "Read", "why": "x"}]}], "calls[0] carries key(s)"),
    (IDENTITY, [{**EVENT, "produced": [{"path": "a", "bytes": "x"}]}], "produced[0] carries key(s)"),
    ({**IDENTITY, "cost_cents": 1.5}, [EVENT], "not a whole number of cents"),
    ({**IDENTITY, "cost_cents": "3"}, [EVENT], "not a whole number of cents"),
])
def test_intake_refuses_the_whole_file(identity, events, reason):
    result = _confirm(identity, events)
    assert result.refusal is not None and reason in result.refusal


def test_an_event_of_an_unknown_probe_is_dropped_and_the_rest_stand():
    result = _confirm(events=[EVENT, {**EVENT, "probe": "HW-PRB-9999"}])
    assert result.refusal is None and result.events == [EVENT]
    assert result.dropped[0]["reason"].startswith("membership")


def test_a_second_block_under_events_is_refused():
    text = render({}, "t", [], IDENTITY, [EVENT]) + "\n```yaml\n[]\n```\n"
    result = confirm(text, LOCK, {"HW-PRB-0007"})
    assert result.refusal and "exactly one fenced yaml block" in result.refusal
