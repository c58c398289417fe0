"""Stream parsing and the transform into one event."""

from __future__ import annotations

import base64
import json
import re
from decimal import Decimal
from pathlib import Path

import pytest

from runner import digest
from runner.harnesses.claude_code import stream
from runner.harnesses.claude_code.init import refusals
from runner.harnesses.contract import InitContext
from runner.transform.events import SessionFacts, corpus_identifiers, session_event
from runner.transform.shell import without_heredoc_bodies

FIXTURE = Path(__file__).parents[1] / "data" / "claude-code-2.1.197" / "read-write-answer.jsonl"
IDENT = re.compile(r"HW-DR-\d{4}")
DECL = ["current HW-DR-0052", "superseded HW-DR-0052"]
A_TEXT = "# doc HW-DR-0052\n"  # the fixture's a.md, as its Read shows it
A_DIGEST = digest.of_text(A_TEXT)
CONFIG = "/session/config"


def facts(files=None, **over):
    files = {"out.md": b"Cites HW-DR-0052.\n"} if files is None else files
    kw = dict(probe="p1", session="present-001", workspace="/workspace", config_dir=CONFIG,
              manifest={"a.md": A_DIGEST}, final_file=lambda rel: files.get(rel),
              identifiers=frozenset({"HW-DR-0052", "HW-DR-0061"}))
    kw.update(over)
    return SessionFacts(**kw)


def lines_of(objs, newline_last=True):
    out = [(json.dumps(o) + "\n").encode() for o in objs]
    if not newline_last:
        out[-1] = out[-1].rstrip(b"\n")
    return out


INIT = {"type": "system", "subtype": "init", "cwd": "/workspace", "permissionMode": "dontAsk", "plugins": [],
        "mcp_servers": [], "skills": [], "memory_paths": {"auto": CONFIG + "/projects/x/memory/"}}


def asst(*blocks, model="m-1"):
    return {"type": "assistant", "message": {"model": model, "content": list(blocks)}, "parent_tool_use_id": None}


def use(tid, name, **inp):
    return {"type": "tool_use", "id": tid, "name": name, "input": inp}


def res(tid, content, is_error=None):
    b = {"type": "tool_result", "tool_use_id": tid, "content": content}
    if is_error is not None:
        b["is_error"] = is_error
    return {"type": "user", "message": {"content": [b]}}


def result(text="HW-DR-0052 current", subtype="success", is_error=False, cost="0.1"):
    return {"type": "result", "subtype": subtype, "is_error": is_error, "result": text, "total_cost_usd": cost}


def raw_result(cost_literal="0.1", text="done\\ncurrent HW-DR-0052"):
    return ('{"type":"result","subtype":"success","is_error":false,"result":"%s","total_cost_usd":%s}\n' % (text, cost_literal)).encode()


def read_res(tid, content, *, start=1, num=None, total=None, kind="text"):
    """A Read's result line as 2.1.197 writes it: the numbered text the model was sent, and the
    structured record (tool_use_result) of what it read."""
    lines = content.split("\n")
    num = len(lines) if num is None else num
    line = res(tid, "\n".join(f"{start + i}\t{x}" for i, x in enumerate(lines)))
    line["tool_use_result"] = {"type": kind, "file": {"filePath": "/x", "content": content, "numLines": num,
                                                      "startLine": start, "totalLines": num if total is None else total}}
    return line


def parse_objs(objs, **kw):
    return stream.parse(lines_of(objs, **kw))


def test_fixture_parses_and_transforms_to_complete_event():
    with open(FIXTURE, "rb") as f:
        parsed = stream.parse(f)
    assert parsed.problems == []
    assert parsed.complete
    assert parsed.cost_usd == Decimal("0.003")
    assert parsed.served_models == ["claude-opus-4-8-20261101"]
    out = session_event(parsed, facts(), DECL, IDENT)
    assert out.refusals == []
    assert out.event == {
        "probe": "p1",
        "session": "present-001",
        "calls": [
            {"tool": "Read", "argument": "a.md", "result": A_DIGEST},
            {"tool": "Write", "argument": "out.md", "result": digest.of_text(
                "File created successfully at: /workspace/out.md (file state is current in your context \u2014 no need to Read it back)")},
        ],
        "produced": [{"path": "out.md", "result": digest.of_bytes(b"Cites HW-DR-0052.\n"), "cites": ["HW-DR-0052"]}],
        "answer": "current HW-DR-0052",
    }
    assert "findings" not in out.event["produced"][0]
    assert out.outside_paths == []
    assert out.cost_usd == Decimal("0.003")


def test_no_result_line_refused():
    parsed = parse_objs([INIT, asst({"type": "text", "text": "hi"})])
    assert any("no result line" in p for p in parsed.problems)
    out = session_event(parsed, facts(), DECL, IDENT)
    assert out.event is None
    assert any("no result line" in r for r in out.refusals)


def test_truncated_last_line():
    lines = lines_of([INIT, result()])
    lines.append(b'{"type":"assistant","mess')
    parsed = stream.parse(lines)
    assert any("truncated" in p and "line 3" in p for p in parsed.problems)
    assert session_event(parsed, facts(), DECL, IDENT).event is None


def test_truncated_stream_without_result():
    lines = lines_of([INIT])
    lines.append(b'{"type":"res')
    parsed = stream.parse(lines)
    assert any("truncated" in p for p in parsed.problems)
    assert any("no result line" in p for p in parsed.problems)


def test_invalid_utf8_line():
    lines = lines_of([INIT])
    lines.append(b'{"type":"system","subtype":"x","t":"\xff\xfe"}\n')
    lines += lines_of([result()])
    parsed = stream.parse(lines)
    assert parsed.problems == ["line 2 is not valid UTF-8"]
    assert session_event(parsed, facts(), DECL, IDENT).event is None


def test_second_init_line():
    parsed = parse_objs([INIT, INIT, result()])
    assert parsed.problems == ["line 2 is a second init line"]


def test_assistant_after_result():
    parsed = parse_objs([INIT, result(), asst({"type": "text", "text": "late"})])
    assert parsed.problems == ["line 3 (assistant) comes after the result line"]
    assert session_event(parsed, facts(), DECL, IDENT).event is None


def test_tool_result_for_unknown_id():
    parsed = parse_objs([INIT, res("toolu_zz", "x"), result()])
    assert len(parsed.problems) == 1 and "toolu_zz" in parsed.problems[0]


def test_no_init_line():
    parsed = parse_objs([asst({"type": "text", "text": "hi"}), result()])
    assert any("no init line" in p for p in parsed.problems)
    assert session_event(parsed, facts(), DECL, IDENT).event is None


def test_result_is_error_refused():
    parsed = parse_objs([INIT, result(subtype="success", is_error=True, text="API Error: 500")])
    assert parsed.problems == []
    out = session_event(parsed, facts(), DECL, IDENT)
    assert out.event is None
    assert len(out.refusals) == 1 and "harness reported an error" in out.refusals[0]


def test_error_during_execution_refused():
    parsed = parse_objs([INIT, {"type": "result", "subtype": "error_during_execution", "is_error": True}])
    out = session_event(parsed, facts(), DECL, IDENT)
    assert out.event is None and out.refusals


def test_error_max_turns_gives_event_with_null_answer():
    parsed = parse_objs([INIT, {"type": "result", "subtype": "error_max_turns", "is_error": False, "total_cost_usd": 0.5}])
    out = session_event(parsed, facts(files={}), DECL, IDENT)
    assert out.refusals == []
    assert out.event == {"probe": "p1", "session": "present-001", "calls": [], "produced": [], "answer": None}


def test_no_tool_calls():
    parsed = parse_objs([INIT, asst({"type": "text", "text": "HW-DR-0052 superseded"}), result(text="HW-DR-0052 superseded")])
    out = session_event(parsed, facts(files={}), DECL, IDENT)
    assert out.event == {"probe": "p1", "session": "present-001", "calls": [], "produced": [], "answer": "superseded HW-DR-0052"}


def test_no_declared_answers_records_answer_null():
    """"Every other message records answer: null": a probe that declares no answers still had its
    session watched, and an absent key would say that nothing watched."""
    parsed = parse_objs([INIT, result()])
    out = session_event(parsed, facts(files={}), [], IDENT)
    assert out.event == {"probe": "p1", "session": "present-001", "calls": [], "produced": [], "answer": None}


def test_artifacts_not_collected_gives_no_produced_key():
    parsed = parse_objs([INIT, asst(use("t1", "Write", file_path="/workspace/x.md", content="c")), res("t1", "ok"), result()])
    out = session_event(parsed, facts(artifacts_collected=False), DECL, IDENT)
    assert out.event == {"probe": "p1", "session": "present-001",
                         "calls": [{"tool": "Write", "argument": "x.md", "result": digest.of_text("ok")}],
                         "answer": "current HW-DR-0052"}


def test_call_without_result_has_no_result_key():
    parsed = parse_objs([INIT, asst(use("t1", "Grep", pattern="HW-DR")), result()])
    out = session_event(parsed, facts(files={}), DECL, IDENT)
    assert out.event["calls"] == [{"tool": "Grep", "argument": "HW-DR ."}]  # a search of the workspace


def test_read_after_write_is_the_document_the_write_left_not_the_manifest_nor_what_returned():
    parsed = parse_objs([INIT,
                         asst(use("t1", "Write", file_path="/workspace/a.md", content="new")), _write_result("t1", original=A_TEXT, patch=[], content="new"),
                         asst(use("t2", "Read", file_path="/workspace/a.md")), read_res("t2", "new"),
                         result()])
    out = session_event(parsed, facts(files={"a.md": b"new"}, changed={"a.md": digest.of_text("new")}), DECL, IDENT)
    assert out.event["calls"][1] == {"tool": "Read", "argument": "a.md", "result": digest.of_text("new")}


def test_list_result_content_digest_is_canonical_json():
    content = [{"type": "text", "text": "x"}]
    parsed = parse_objs([INIT, asst(use("t1", "Bash", command="ls /workspace/docs")), res("t1", content), result()])
    out = session_event(parsed, facts(files={}), DECL, IDENT)
    assert out.event["calls"] == [{"tool": "Bash", "argument": "ls docs",
                                   "result": digest.of_bytes(b'[{"text":"x","type":"text"}]')}]


def test_outside_workspace_paths_counted():
    parsed = parse_objs([INIT,
                         asst(use("t1", "Read", file_path="/etc/passwd"), use("t2", "Bash", command="cat /root/x"),
                              use("t3", "Read", file_path="/workspace/a.md")),
                         read_res("t1", "root:x"), res("t2", "nope"), res("t3", "doc"),
                         result()])
    out = session_event(parsed, facts(files={}), DECL, IDENT)
    assert out.outside_paths == ["/etc/passwd", "/root/x"]
    assert out.event["calls"][0] == {"tool": "Read", "argument": "/etc/passwd", "result": digest.of_text("root:x")}
    assert out.event["calls"][2] == {"tool": "Read", "argument": "a.md", "result": A_DIGEST}


def test_a_stated_cost_is_money_to_twelve_places_without_the_clis_float_noise():
    """Issue 29: "status --json prints "cost_usd": "0.183600000000000004" and the Job's log
    cost 0.014400000000000001 USD ... Money is exact decimals end to end, in every output". The
    CLI sums in binary floating point; a cost is read from its literal exactly, then kept to
    12 decimal places (finer than any price per token): the noise goes, its cents with it
    (0.30000000000000004 was 31 whole cents), and no real digit does."""
    from runner.transform.run import _cents

    parsed = stream.parse(lines_of([INIT]) + [raw_result("0.30000000000000004441")])
    assert parsed.problems == [] and str(parsed.cost_usd) == "0.3" and _cents(parsed.cost_usd) == 30
    for literal, money in (("0.014400000000000001", "0.0144"), ("0.123456789012", "0.123456789012"),
                           ("2", "2"), ("0.0", "0"), ("999999999.999999999999", "999999999.999999999999")):
        assert str(stream.parse(lines_of([INIT]) + [raw_result(literal)]).cost_usd) == money, literal


def test_cost_exact_for_float_literal_short():
    parsed = stream.parse(lines_of([INIT]) + [raw_result("0.1234567")])
    assert parsed.cost_usd == Decimal("0.1234567")


def test_repeated_identical_result_line_is_a_note():
    parsed = parse_objs([INIT, result(), result()])
    assert parsed.problems == []
    assert parsed.notes


def test_init_refusal_propagates():
    init = dict(INIT, permissionMode="bypassPermissions")
    out = session_event(parse_objs([init, result()]), facts(files={}), DECL, IDENT)
    assert out.event is None
    assert any("bypassPermissions" in r for r in out.refusals)


def test_cites_with_capturing_group_in_identifier_pattern():
    # a plan may declare an identifier pattern with a group; cites must still be whole identifiers
    ident = re.compile(r"HW-(DR|OBL)-\d{4}")
    parsed = parse_objs([INIT, asst(use("t1", "Write", file_path="/workspace/out.md", content="c")), res("t1", "ok"), result()])
    out = session_event(parsed, facts(files={"out.md": b"Cites HW-DR-0052 and HW-OBL-0124.\n"},
                                  identifiers=frozenset({"HW-DR-0052", "HW-OBL-0124"})), DECL, ident)
    assert out.event["produced"][0]["cites"] == ["HW-DR-0052", "HW-OBL-0124"]


def test_tilde_path_in_bash_counted_as_outside():
    parsed = parse_objs([INIT, asst(use("t1", "Bash", command="cat ~/.ssh/id_rsa")), res("t1", "x"), result()])
    out = session_event(parsed, facts(files={}), DECL, IDENT)
    assert out.outside_paths == ["~/.ssh/id_rsa"]


def test_sibling_directory_with_workspace_prefix_not_rewritten():
    parsed = parse_objs([INIT, asst(use("t1", "Bash", command="ls /workspace2/x /workspace/docs")), res("t1", "x"), result()])
    out = session_event(parsed, facts(files={}), DECL, IDENT)
    assert out.event["calls"][0]["argument"] == "ls /workspace2/x docs"
    assert out.outside_paths == ["/workspace2/x"]


# --- issue 11's rules, one at a time (the real CLI holds each in tests/integration/test_contract_fidelity.py) ---

def _event(*pairs, files=None, **over):
    objs = [INIT]
    for u, r in pairs:
        objs.append(asst(u))
        if r is not None:
            objs.append(r)
    objs.append(result())
    return session_event(parse_objs(objs), facts(files=files or {}, **over), DECL, IDENT)


@pytest.mark.parametrize("tool, inp, argument", [
    ("NotebookEdit", {"notebook_path": "/workspace/n.ipynb", "new_source": "the model's words"}, "n.ipynb"),
    ("LS", {"path": "/workspace/docs"}, "docs"),
    ("Bash", {"command": "ls /workspace/docs", "description": "List the docs"}, "ls docs"),
    ("Grep", {"pattern": "Status", "path": "/workspace/docs/a.md", "output_mode": "content"}, "Status docs/a.md"),
    ("Grep", {"pattern": "HW DR", "glob": "*.md", "type": "md"}, "'HW DR' . --glob '*.md' --type md"),
    ("Glob", {"pattern": "**/*.md"}, "'**/*.md' ."),
    ("Glob", {"pattern": "*.md", "path": "/etc"}, "'*.md' /etc"),
    ("Task", {"subagent_type": "Explore", "description": "look", "prompt": "the model's words"}, "Explore"),
    ("Skill", {"skill": "corpus-guide"}, "corpus-guide"),
    ("WebFetch", {"url": "https://x.invalid/a", "prompt": "the model's words"}, "https://x.invalid/a"),
    ("TaskUpdate", {"taskId": "3", "status": "completed", "description": "the model's words"}, "3"),
    ("TaskGet", {"taskId": "3"}, "3"),
    ("TaskStop", {"shell_id": "b7"}, "b7"),
    ("KillShell", {"shell_id": "b7"}, "b7"),
    ("ReadMcpResource", {"server": "docs", "uri": "doc://a b"}, "docs 'doc://a b'"),
])
def test_each_known_tool_is_identified_by_what_it_touched(tool, inp, argument):
    out = _event((use("t1", tool, **inp), res("t1", "ok")))
    assert out.event["calls"] == [{"tool": tool, "argument": argument, "result": digest.of_text("ok")}]


@pytest.mark.parametrize("tool, inp", [
    ("TaskCreate", {"subject": "Check the status", "description": "I think it is current"}),
    ("SendMessage", {"to": "lead", "message": "It is current"}),
    ("ExitPlanMode", {"plan": "Read, then answer"}),
    ("TodoWrite", {"todos": [{"content": "read", "status": "pending", "activeForm": "reading"}]}),
    ("WebSearch", {"query": "status of HW-DR-0052"}),
    ("Task", {"description": "look", "prompt": "find it"}),  # no subagent_type: nothing names it
    ("mcp__docs__search", {"q": "status", "path": "/workspace/docs"}),
    ("ToolOfALaterCli", {}),
])
def test_prose_and_unknown_inputs_are_identified_by_their_canonical_digest(tool, inp):
    """"A transcript holds no model prose": the input's identity, never its text."""
    out = _event((use("t1", tool, **inp), res("t1", "ok", is_error=True)))
    assert out.event["calls"] == [{"tool": tool, "argument": digest.of_bytes(stream.canonical(inp)),
                                   "result": digest.of_text("ok")}]


def _write_result(tid, *, original, patch, content=None):
    line = res(tid, "ok")
    line["tool_use_result"] = {"type": "update", "originalFile": original, "structuredPatch": patch}
    if content is not None:
        line["tool_use_result"]["content"] = content
    return line


def test_failed_and_unchanging_writes_produce_nothing_and_later_reads_keep_the_document_digest():
    out = _event(
        (use("t1", "Edit", file_path="/workspace/a.md", old_string="x", new_string="y"), res("t1", "not found", is_error=True)),
        (use("t2", "Write", file_path="/workspace/a.md", content="same"), _write_result("t2", original="same", patch=[])),
        (use("t3", "MultiEdit", file_path="/workspace/a.md", edits=[]), res("t3", "No such tool", is_error=True)),
        (use("t4", "NotebookEdit", notebook_path="/workspace/a.md", new_source="x"), res("t4", "not a notebook", is_error=True)),
        (use("t5", "Read", file_path="/workspace/a.md"), res("t5", "1\tsame")),
        files={"a.md": b"same"})
    assert out.event["produced"] == []
    assert out.event["calls"][4]["result"] == A_DIGEST  # the manifest's digest of a.md: nothing changed it


def test_a_write_that_changed_the_file_is_produced_and_a_read_after_it_that_proves_nothing_has_no_result():
    out = _event(
        (use("t1", "Write", file_path="/workspace/a.md", content="new"), _write_result("t1", original="old", patch=[{"lines": ["-old", "+new"]}])),
        (use("t2", "Read", file_path="/workspace/a.md"), res("t2", "1\tnew")),  # no structured record: no bytes shown
        files={"a.md": b"new HW-DR-0052"}, changed={"a.md": digest.of_text("new HW-DR-0052")})
    assert out.event["produced"] == [{"path": "a.md", "result": digest.of_text("new HW-DR-0052"), "cites": ["HW-DR-0052"]}]
    assert out.event["calls"][1] == {"tool": "Read", "argument": "a.md"}
    assert "the Read of a.md (call 2) has no result: the stream shows only part of it" in out.notes[0]


def test_a_write_whose_answer_never_came_may_have_written():
    out = _event((use("t1", "Write", file_path="/workspace/a.md", content="new"), None), files={"a.md": b"new"})
    assert out.event["produced"] == [{"path": "a.md", "result": digest.of_text("new"), "cites": []}]


def test_cites_are_token_bounded_identifiers_of_the_corpus():
    text = b"HW-DR-00521 XHW-DR-0007Y HW-DR-9999 (HW-DR-0052), HW-DR-0061. HW-DR-0007-draft docs/HW-DR-0041.md"
    out = _event((use("t1", "Write", file_path="/workspace/out.md", content="c"), res("t1", "ok")),
                 files={"out.md": text},
                 identifiers=frozenset({"HW-DR-0007", "HW-DR-0041", "HW-DR-0052", "HW-DR-0061"}))
    assert out.event["produced"][0]["cites"] == ["HW-DR-0041", "HW-DR-0052", "HW-DR-0061"]


def test_the_corpus_identifiers_are_its_token_bounded_matches_in_paths_and_text():
    texts = ["docs/decisions/HW-DR-0052.md", "# HW-DR-0052\nsupersedes HW-DR-0041; not HW-DR-00410 or aHW-DR-0001"]
    assert corpus_identifiers(texts, IDENT) == {"HW-DR-0052", "HW-DR-0041"}


@pytest.mark.parametrize("command, outside", [
    ("cat ../outside.txt docs/a.md", ["../outside.txt"]),
    ("cat docs/../../x", ["docs/../../x"]),
    ("cat docs/../a.md ..", [".."]),
    ("ls --hide=/etc/x -I=~/y --color=never .", ["/etc/x", "~/y"]),
    ("echo x >/tmp/a 2>>/tmp/b &>/dev/null <~/in", ["/tmp/a", "/tmp/b", "/dev/null", "~/in"]),
    ("echo x > /tmp/c", ["/tmp/c"]),
    ("OUT=/var/x make", ["/var/x"]),
    ("cat > notes.md <<'EOF'\nsee /etc/passwd and ../x\nEOF\ncat /etc/hosts", ["/etc/hosts"]),
    ("cat <<-END\n\t/etc/a\n\tEND\nls /b", ["/b"]),
    ("cat <<<'/etc/here-string'", ["/etc/here-string"]),  # a here-string is a word, no body
    ("a=1 ls /workspace/docs docs/x", []),
])
def test_every_path_a_command_names_outside_the_workspace_is_counted(command, outside):
    out = _event((use("t1", "Bash", command=command), res("t1", "x")))
    assert out.outside_paths == outside


def test_path_inputs_and_rooted_glob_patterns_outside_are_counted():
    out = _event((use("t1", "Glob", pattern="/etc/*.conf"), res("t1", "x")),
                 (use("t2", "Glob", pattern="../**/*.md"), res("t2", "x")),
                 (use("t3", "Read", file_path="/workspace/../etc/x"), res("t3", "x")),
                 (use("t4", "Grep", pattern="/etc/", path="docs"), res("t4", "x")))
    assert out.outside_paths == ["/etc/*.conf", "../**/*.md", "/workspace/../etc/x"]


def test_heredoc_bodies_are_dropped_and_the_command_kept():
    assert without_heredoc_bodies("cat > a <<EOF\nbody\nEOF\nls x") == "cat > a <<EOF\nls x"
    assert without_heredoc_bodies('cat <<"A" <<B\n1\nA\n2\nB\nend') == 'cat <<"A" <<B\nend'
    assert without_heredoc_bodies("cat <<EOF\nnever closed") == "cat <<EOF\n"


@pytest.mark.parametrize("command", [
    'grep -n "<<EOF" a.sh\ncat ~/.ssh/id_rsa',        # quoted: a pattern, not an operator
    "echo $((1<<4))\ncat ~/.ssh/id_rsa",               # arithmetic: a shift
    "(( x = 1 << 4 ))\ncat ~/.ssh/id_rsa",
    'python3 -c "print(1<<4)\nx = 2"\ncat ~/.ssh/id_rsa',  # inside a string over two lines
    "# see <<EOF\ncat ~/.ssh/id_rsa",                 # a comment
    "cat <<<EOF\ncat ~/.ssh/id_rsa",                  # a here-string has no body
])
def test_a_double_less_than_that_opens_no_heredoc_hides_nothing(command):
    out = _event((use("t1", "Bash", command=command), res("t1", "x")))
    assert out.outside_paths == ["~/.ssh/id_rsa"]


def test_trailing_white_space_costs_linear_time():
    import time
    started = time.process_time()
    out = _event((use("t1", "Bash", command="cat /etc/x" + " " * 200_000), res("t1", "x")))
    assert out.outside_paths == ["/etc/x"] and time.process_time() - started < 2  # was minutes: quadratic


def test_a_write_through_a_linked_directory_is_the_file_it_changed():
    links = {"shelf": "docs", "notes/cur.md": "../docs/a.md", "out": "/etc"}
    out = _event((use("t1", "Write", file_path="/workspace/shelf/new.md", content="n"), res("t1", "ok")),
                 (use("t2", "Read", file_path="/workspace/shelf/a.md"), res("t2", "1\tdoc")),
                 (use("t3", "Write", file_path="/workspace/out/x", content="n"), res("t3", "ok")),
                 files={"docs/new.md": b"n"}, links=links, manifest={"docs/a.md": "sha256:" + "2" * 64})
    assert out.event["produced"][0] == {"path": "docs/new.md", "result": digest.of_text("n"), "cites": []}
    assert out.event["calls"][1]["result"] == "sha256:" + "2" * 64  # read through the link: the document's digest
    assert out.event["produced"][1] == {"path": "/workspace/out/x"}  # led out of the workspace: nothing read
    assert "out/x was written through a link that leads out of the workspace" in out.notes


def test_a_session_the_driver_ended_at_its_time_limit_is_an_observation():
    cut = lines_of([INIT, asst(use("t1", "Read", file_path="/workspace/a.md")), res("t1", "doc"),
                    asst(use("t2", "Bash", command="sleep 600"))]) + [b'{"type":"assist']
    assert stream.parse(cut).problems  # as the harness's own account it is incomplete
    parsed = stream.parse(cut, ended_by_driver=True)
    assert parsed.problems == []
    assert parsed.notes == ["the stream is truncated: line 5 ends without a newline and is not complete JSON",
                            "the stream has no result line: the driver ended the session at its time limit"]
    out = session_event(parsed, facts(files={}, timed_out=True), DECL, IDENT)
    assert out.timed_out and out.cost_usd is None
    assert out.event == {"probe": "p1", "session": "present-001", "produced": [], "answer": None,
                         "calls": [{"tool": "Read", "argument": "a.md", "result": A_DIGEST},
                                   {"tool": "Bash", "argument": "sleep 600"}]}
    # anything else unsound still refuses it
    assert stream.parse(cut[:2] + [b"not json\n"] + cut[2:], ended_by_driver=True).problems


@pytest.mark.parametrize("memory, refused", [
    ("/run/probe/config/projects/x/memory/", False),
    ("/run/probe/config/../escape/", True),
    ("/run/probe/config/projects/../../../tmp/x", True),
    ("projects/x", True),  # relative: inside nothing
])
def test_the_memory_path_check_resolves_dot_dot(memory, refused):
    reasons = refusals(dict(INIT, memory_paths={"auto": memory}), InitContext(config_dir="/run/probe/config"))
    assert bool(reasons) is refused


def test_an_identifier_pattern_with_inline_flags_cites_on_token_bounds():
    ident = re.compile(r"(?i)hw-[a-z]+-[0-9]{4}")
    assert corpus_identifiers(["see HW-DR-0052 and hw-dr-00521"], ident) == {"HW-DR-0052"}


def test_a_timed_out_stream_cut_inside_a_character_is_still_an_observation():
    cut = lines_of([INIT, asst(use("t1", "Read", file_path="/workspace/a.md")), res("t1", "doc")])
    cut.append('{"type":"assistant","message":{"content":[{"type":"text","text":"—'.encode()[:-1])
    assert stream.parse(cut, ended_by_driver=True).problems == []
    assert "line 4 is not valid UTF-8" not in stream.parse(cut).problems  # without the kill: truncated, as it is
    assert any("truncated" in p for p in stream.parse(cut).problems)


def test_every_tool_input_of_a_line_is_held_to_the_depth_limit():
    deep: object = "x"
    for _ in range(500):
        deep = [deep]
    line = {"type": "assistant", "message": {"content": [use("t1", "X", n=1e300), use("t2", "Y", d=deep)]}}
    assert any("deeper than" in p for p in stream.parse(lines_of([INIT, line, result()])).problems)


def test_a_cost_finer_than_a_cost_can_be_is_refused_and_sums_are_exact():
    from runner.transform.run import _cents, exact_sum
    raw = b'{"type":"result","subtype":"success","result":"x","total_cost_usd":1E-100000000}\n'
    parsed = stream.parse(lines_of([INIT]) + [raw])
    assert parsed.cost_usd is None and "which is not a cost" in parsed.problems[0]
    total = exact_sum([Decimal("0.10"), Decimal("1E-30")])
    assert total == Decimal("0.100000000000000000000000000001") and _cents(total) == 11  # 28 digits gave 10


# --- issue 27, item 1: a read is the digest of the document's bytes as that read saw it ---------
# "result on a call is the content digest of the document … never the bytes returned". The records
# below are shaped as 2.1.197 writes them (tests/integration/test_contract_fidelity_3.py holds the
# rule through the real CLI).

CRLF = b"one\r\ntwo\r\n"


def test_a_whole_read_is_the_known_state_whose_view_it_showed():
    # sealed, then edited (the capture found it changed), then read whole: the edited document
    edited = "# doc HW-DR-0052\nmore\n"
    out = _event((use("t1", "Read", file_path="/workspace/a.md"), read_res("t1", A_TEXT)),
                 (use("t2", "Bash", command="echo more >> a.md"), res("t2", "")),
                 (use("t3", "Read", file_path="/workspace/a.md"), read_res("t3", edited)),
                 files={"a.md": edited.encode()}, changed={"a.md": digest.of_text(edited)})
    assert [c.get("result") for c in out.event["calls"]][::2] == [A_DIGEST, digest.of_text(edited)]


def test_a_whole_read_of_a_crlf_document_is_the_bytes_not_the_view():
    """The CLI drops a CR before each LF and a byte-order mark: a whole read shows the view, and the
    sealed record's view digest tells which bytes it was."""
    view = stream.cli_view(b"\xef\xbb\xbf" + CRLF)
    assert view == b"one\ntwo\n"
    sealed = digest.of_bytes(b"\xef\xbb\xbf" + CRLF)
    out = _event((use("t1", "Read", file_path="/workspace/c.md"), read_res("t1", view.decode())),
                 manifest={"c.md": sealed}, views={"c.md": digest.of_bytes(view)})
    assert out.event["calls"][0]["result"] == sealed


def test_a_whole_read_that_no_known_state_explains_has_no_result_where_its_bytes_are_in_doubt():
    """A CRLF document changed by Bash and changed again: the read shows a view of neither state the
    run knows, and a CRLF document's view is not its bytes, so no digest is proven."""
    view = b"one\nTWO\n"
    out = _event((use("t1", "Bash", command="sed -i s/two/TWO/ c.md"), res("t1", "")),
                 (use("t2", "Read", file_path="/workspace/c.md"), read_res("t2", view.decode())),
                 (use("t3", "Bash", command="sed -i s/TWO/three/ c.md"), res("t3", "")),
                 manifest={"c.md": digest.of_bytes(CRLF)}, views={"c.md": digest.of_bytes(b"one\ntwo\n")},
                 files={"c.md": b"one\r\nthree\r\n"}, changed={"c.md": digest.of_bytes(b"one\r\nthree\r\n")})
    assert "result" not in out.event["calls"][1]
    assert any("the Read of c.md (call 2) has no result" in n for n in out.notes)


@pytest.mark.parametrize("before, changed, expected", [
    ([], {}, "sealed"),  # nothing ran that could change a file
    ([("Bash", {"command": "ls"})], {}, "sealed"),  # the session left it as sealed, no write named it
    ([("Bash", {"command": "sed -i s/a/b/ a.md"})], {"a.md": digest.of_text("b")}, None),  # it changed: which lines?
    ([("Grep", {"pattern": "x"})], {"a.md": digest.of_text("b")}, "sealed"),  # changed later, by what came after
])
def test_a_partial_read_proves_no_bytes_and_is_the_sealed_document_only_where_it_was_as_sealed(before, changed, expected):
    pairs = [(use(f"b{i}", name, **inp), res(f"b{i}", "")) for i, (name, inp) in enumerate(before)]
    pairs.append((use("r", "Read", file_path="/workspace/a.md", offset=2, limit=1), read_res("r", "x", start=2, num=1, total=4)))
    pairs.append((use("z", "Bash", command="true"), res("z", "")))
    out = _event(*pairs, changed=changed, files={"a.md": b"b"} if changed else {})
    assert out.event["calls"][len(before)].get("result") == (A_DIGEST if expected == "sealed" else None)


def test_a_read_of_an_unchanged_file_is_the_document_its_last_read_saw():
    unchanged = res("t3", "Wasted call \u2014 file unchanged since your last Read.")
    unchanged["tool_use_result"] = {"type": "file_unchanged", "file": {"filePath": "/workspace/n.md"}}
    out = _event((use("t1", "Write", file_path="/workspace/n.md", content="n\n"), _write_result("t1", original=None, patch=[], content="n\n")),
                 (use("t2", "Read", file_path="/workspace/n.md"), read_res("t2", "n\n")),
                 (use("t3", "Read", file_path="/workspace/n.md"), unchanged),
                 files={"n.md": b"n\n"}, changed={"n.md": digest.of_text("n\n")})
    assert out.event["calls"][1]["result"] == out.event["calls"][2]["result"] == digest.of_text("n\n")


@pytest.mark.parametrize("original_size, proven", [(None, True), (999, False)])
def test_an_image_read_is_its_bytes_where_the_cli_passed_them_through(original_size, proven):
    data = b"\x89PNG\r\n\x1a\n fake"
    line = res("t2", [{"type": "image", "source": {"type": "base64", "data": base64.b64encode(data).decode(), "media_type": "image/png"}}])
    line["tool_use_result"] = {"type": "image", "file": {"base64": base64.b64encode(data).decode(), "type": "image/png",
                                                          "originalSize": original_size or len(data)}}
    out = _event((use("t1", "Bash", command="cp /tmp/x.png i.png"), res("t1", "")),
                 (use("t2", "Read", file_path="/workspace/i.png"), line), changed={"i.png": digest.of_bytes(data)},
                 files={"i.png": data})
    assert out.event["calls"][1].get("result") == (digest.of_bytes(data) if proven else None)


def test_a_notebook_read_shows_cells_not_bytes():
    line = res("t2", [{"type": "text", "text": "<cell id=\"cell-0\">print(1)</cell id=\"cell-0\">"}])
    line["tool_use_result"] = {"type": "notebook", "file": {"filePath": "/workspace/n.ipynb", "cells": [{"cellType": "code", "source": "print(1)"}]}}
    nb = digest.of_text("{}")
    quiet = _event((use("t2", "Read", file_path="/workspace/n.ipynb"), line), manifest={"n.ipynb": nb})
    assert quiet.event["calls"][0]["result"] == nb
    after_edit = _event((use("t1", "NotebookEdit", notebook_path="/workspace/n.ipynb", new_source="x"), res("t1", "ok")),
                        (use("t2", "Read", file_path="/workspace/n.ipynb"), line), manifest={"n.ipynb": nb},
                        changed={"n.ipynb": digest.of_text("{ }")}, files={"n.ipynb": b"{ }"})
    assert "result" not in after_edit.event["calls"][1]


def test_a_failed_read_is_what_it_returned():
    out = _event((use("t1", "Read", file_path="/workspace/b.dat"), res("t1", "cannot read binary files", is_error=True)),
                 manifest={"b.dat": digest.of_text("x")})
    assert out.event["calls"][0]["result"] == digest.of_text("cannot read binary files")


def test_a_session_whose_stream_shows_a_tool_outside_the_list_running_is_refused():
    """"Every arm runs in the permission mode dontAsk, with one list of allowed tools": 2.1.197
    without --tools ran TaskCreate though the list did not hold it (a real capture), and the session
    did not run under the list."""
    with open(FIXTURE.parent / "unlisted-tool-ran.jsonl", "rb") as f:
        parsed = stream.parse(f)
    assert parsed.problems == []
    allowed = frozenset({"Read", "Grep", "Glob", "Edit", "Write", "Bash"})
    out = session_event(parsed, facts(files={}, allowed_tools=allowed), DECL, IDENT)
    assert out.event is None
    assert out.refusals == ["the stream shows TaskCreate running (call 1), a tool outside the one list of allowed tools "
                            "(Bash, Edit, Glob, Grep, Read, Write)"]
    # under a list that holds TaskCreate the same stream is an event
    kept = session_event(parsed, facts(files={}, allowed_tools=allowed | {"TaskCreate"}), DECL, IDENT)
    assert kept.refusals == [] and kept.event["calls"][1]["result"] == A_DIGEST
