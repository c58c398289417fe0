"""Contract fidelity under ordinary sessions (issue 11), through the real Claude Code CLI.

Every rule here is held by a session the real CLI ran against the scripted provider, recorded
by ``run_sessions`` under bwrap and turned into a transcript by the transform, exactly as
``probe-runner run`` does. One campaign holds one probe per rule (each probe's task selects its
scenario), so the CLI runs once per rule; one more campaign runs the bundled demo corpus.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from fidelity import events, plan_of, probe, record, stream_uses, use, write_corpus
from markdown_it import MarkdownIt

from runner import digest, layout, stream
from tests.support.clis import qualified_versions


@pytest.fixture(scope="module", params=qualified_versions())
def claude_command(request, qualified_cli):
    """This module's suite runs on every qualified CLI version, the pinned one first."""
    return qualified_cli(request.param)

DEMO = Path(__file__).parents[2] / "runner" / "demo"
IDENT = "HW-[A-Z]+-[0-9]{4}"
ANSWERS = ["current HW-DR-0052", "superseded HW-DR-0052"]
DOC_A = "# HW-DR-0052\n\nStatus: current. It supersedes HW-DR-0041.\n"
CORPUS = {
    "docs/a.md": DOC_A,
    "docs/decisions/HW-DR-0007.md": "# HW-DR-0007\n\nAn early decision.\n",
    "docs/decisions/HW-DR-0041.md": "# HW-DR-0041\n\nSuperseded.\n",
    # the probe HW-PRB-0008 ("Status of the shelf") named in ways the seal must catch
    "docs/notes/linked.md": "Background: [see the probe](../probes/shelf-status.md#task).\n",
    "docs/index2.md": "Probes: probes/shelf-status.md\n",
    "tools/broken-title.md": "A tool about the Status of\nthe shelf, for maintainers.\n",
    "docs/shouting.md": "STATUS OF THE SHELF is what we ask.\n",
}
PLAIN_HEREDOC = "mkdir -p notes && cat > notes/plain.md <<'EOF'\n# Report\n\n```\nls\n```\nEOF"
HEREDOC = ("cat > notes/report.md <<'EOF'\n# Report\n\n```\nls docs\n```\n\n~~~~\n````\n~~~~\n"
           "\n    ```\n```` yaml\nEOF")
SEPARATED = "printf 'one\u2028two\\n' > notes/ls.txt"
# A call that outlasts the session's time limit. Not a standalone `sleep`: 2.1.337 refuses
# one itself ("Blocked: standalone sleep 600 ..."), answering at once, so the session would
# end before the limit; `tail -f /dev/null` blocks on 2.1.197 and 2.1.337 alike.
OUTLAST = "tail -f /dev/null"
PROSE = ["PROSE-SUBJECT", "PROSE-DESCRIPTION", "PROSE-MESSAGE", "PROSE-PLAN", "PROSE-TODO", "PROSE-PROMPT"]


def _probe(pid: str, task: str, answers=ANSWERS, title=None, path=None) -> dict:
    return probe(pid, task, answers, title, path)


PROBES = [
    _probe("HW-PRB-0001", "FID-HEREDOC: write a report."),
    _probe("HW-PRB-0002", "FID-WRITES: try to edit."),
    _probe("HW-PRB-0003", "FID-PROSE: plan the work.", answers=[]),
    _probe("HW-PRB-0004", "FID-SEARCH: search the corpus."),
    _probe("HW-PRB-0005", "FID-CITES: write a note."),
    _probe("HW-PRB-0006", "FID-OUTSIDE: look around.", answers=[]),
    _probe("HW-PRB-0007", "FID-LINK: write through a link."),
    _probe("HW-PRB-0008", "FID-SEAL: list the corpus.", title="Status of the shelf", path="docs/probes/shelf-status.md"),
    _probe("HW-PRB-0009", "FID-SLOW: run into the time limit."),
]


SCENARIOS = {"scenarios": [
    {"name": "heredoc", "match": "FID-HEREDOC", "turns": [
        use("Bash", command=PLAIN_HEREDOC), use("Bash", command=HEREDOC), use("Bash", command=SEPARATED),
        {"text": "Written.\nHW-DR-0052 current"}]},
    {"name": "writes", "match": "FID-WRITES", "turns": [
        use("Edit", file_path="{cwd}/docs/a.md", old_string="Status", new_string="State"),  # not read yet: refused
        use("Read", file_path="{cwd}/docs/a.md"),
        use("Edit", file_path="{cwd}/docs/a.md", old_string="NOT IN THE FILE", new_string="x"),
        use("Edit", file_path="{cwd}/docs/a.md", old_string="current", new_string="current"),
        use("MultiEdit", file_path="{cwd}/docs/a.md", edits=[{"old_string": "current", "new_string": "old"}]),
        use("NotebookEdit", notebook_path="{cwd}/docs/a.md", new_source="x"),
        use("Write", file_path="{cwd}/docs/a.md", content=DOC_A),  # the bytes it holds: changes nothing
        use("Write", file_path="/usr/probe-runner-refused.md", content="x"),  # /usr is read-only in the sandbox
        use("Read", file_path="{cwd}/docs/a.md"),
        {"text": "current current HW-DR-0052"}]},
    {"name": "prose", "match": "FID-PROSE", "turns": [
        use("TaskCreate", subject="PROSE-SUBJECT check", description="PROSE-DESCRIPTION I think it is current"),
        use("TaskUpdate", taskId="1", status="completed"),
        use("SendMessage", to="reviewer", message="PROSE-MESSAGE it is current"),
        use("ExitPlanMode", plan="PROSE-PLAN read then answer"),
        use("TodoWrite", todos=[{"content": "PROSE-TODO read", "status": "pending", "activeForm": "reading"}]),
        use("WebFetch", url="https://example.invalid/status", prompt="PROSE-PROMPT what is the status"),
        {"text": "I planned it.\ncurrent HW-DR-0052"}]},
    {"name": "search", "match": "FID-SEARCH", "turns": [
        use("Grep", pattern="Status", path="{cwd}/docs/a.md"),
        use("Glob", pattern="**/*.md", path="{cwd}/docs"),
        use("Grep", pattern="HW-DR", glob="*.md", output_mode="content"),
        {"text": "HW-DR-0052 current"}]},
    {"name": "cites", "match": "FID-CITES", "turns": [
        use("Bash", command="mkdir -p notes"),
        use("Write", file_path="{cwd}/notes/cites.md",
             content="HW-DR-00521 XHW-DR-0007Y HW-DR-9999 and HW-DR-0041; see HW-DR-0052.\n"),
        {"text": "HW-DR-0052 current"}]},
    {"name": "outside", "match": "FID-OUTSIDE", "turns": [
        use("Bash", command="cat ../outside.txt; ls --hide=/etc/hidden . >/tmp/probe-runner-out.txt; "
                             "cat <<'EOF'\n/etc/passwd is only text here\nEOF"),
        use("Glob", pattern="/etc/*.conf"),
        {"text": "Nothing."}]},
    {"name": "link", "match": "FID-LINK", "turns": [
        use("Read", file_path="{cwd}/notes/current.md"),
        use("Edit", file_path="{cwd}/notes/current.md", old_string="Status: current", new_string="Status: moot"),
        use("Write", file_path="{cwd}/shelf/new.md", content="New: HW-DR-0041 is superseded.\n"),
        use("Read", file_path="{cwd}/docs/new.md"),
        {"text": "HW-DR-0052 current"}]},
    {"name": "seal", "match": "FID-SEAL", "turns": [
        use("Bash", command="find . -type f | sort"),
        {"text": "HW-DR-0052 current"}]},
    {"name": "slow", "match": "FID-SLOW", "turns": [
        use("Read", file_path="{cwd}/docs/a.md"),
        use("Bash", command=OUTLAST, timeout=600000),
        {"text": "HW-DR-0052 current"}]},
]}


@pytest.fixture(scope="module")
def fidelity(tmp_path_factory, claude_command):
    root = tmp_path_factory.mktemp("fidelity")
    corpus = root / "corpus"
    write_corpus(corpus, CORPUS, PROBES)
    (corpus / "notes").mkdir()
    (corpus / "notes/current.md").symlink_to("../docs/a.md")
    (corpus / "shelf").symlink_to("docs")
    # 40 s: every other session ends in a few; FID-SLOW's OUTLAST call runs into it
    out = record(root, "fidelity", corpus, plan_of("fidelity", PROBES, IDENT), SCENARIOS, 40, claude_command)
    assert out["texts"]["present"], out["report"]
    out["events"] = events(out["texts"]["present"])
    return out


def test_a_fenced_heredoc_keeps_the_arm_and_both_parsers_see_two_blocks(fidelity):
    """"Under each heading the recorder writes one fenced yaml block": a session whose Bash call
    writes fenced Markdown by heredoc no longer closes the block early and loses the arm."""
    text = fidelity["texts"]["present"]
    assert len(fidelity["events"]) == len(PROBES)  # every session of the arm is in it
    e = fidelity["events"]["HW-PRB-0001"]
    assert [c["argument"] for c in e["calls"]] == [PLAIN_HEREDOC, HEREDOC, SEPARATED]  # U+2028 reads back unchanged
    assert e["answer"] == "current HW-DR-0052"
    body = text.split("\n---\n", 1)[1]  # CommonMark knows no front matter
    tokens = MarkdownIt("commonmark").parse(body)
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open" and t.tag == "h2"]
    fences = [t for t in tokens if t.type == "fence"]
    assert headings == ["Run identity", "Events"]
    assert [f.info for f in fences] == ["yaml", "yaml"]
    assert fences[1].content.count("- probe: ") == len(PROBES)


def test_failed_and_unchanging_writes_produce_nothing_and_reads_keep_the_content_digest(fidelity):
    """"result on a call is the content digest of the document": an Edit whose old_string is not
    there, an Edit to the same text, a MultiEdit this CLI lacks, a NotebookEdit of a Markdown file,
    a Write of the bytes the file holds and a Write the read-only /usr refuses change nothing, so nothing is produced
    and the later Read is the document's digest, not the digest of the CLI's numbered output."""
    e = fidelity["events"]["HW-PRB-0002"]
    tools = [c["tool"] for c in e["calls"]]
    assert tools == ["Edit", "Read", "Edit", "Edit", "MultiEdit", "NotebookEdit", "Write", "Write", "Read"]
    uses = stream_uses(fidelity["store"], "fidelity", "HW-PRB-0002")
    assert "has not been read yet" in uses[0][1] and "String to replace not found" in uses[2][1]
    assert e["calls"][1]["result"] == e["calls"][8]["result"] == digest.of_text(DOC_A)
    assert e["produced"] == []
    assert e["calls"][7]["argument"] == "/usr/probe-runner-refused.md"  # a refused call is still a call
    assert uses[7][1].startswith("<tool_use_error>") or "read-only" in uses[7][1], uses[7][1]
    assert "result" in e["calls"][7]
    # "compared as a set of words": current current HW-DR-0052 is {current, hw-dr-0052}
    assert e["answer"] == "current HW-DR-0052"


def test_prose_inputs_are_identified_by_digest_and_never_written(fidelity):
    """"That refusal enforces the rule that a transcript holds no model prose": the inputs of
    TaskCreate, SendMessage, ExitPlanMode and TodoWrite are the model's words, so each call's
    argument is the identity of its canonical input; TaskUpdate is its task id, WebFetch its url."""
    e = fidelity["events"]["HW-PRB-0003"]
    text = fidelity["texts"]["present"]
    assert not [p for p in PROSE if p in text]
    uses = stream_uses(fidelity["store"], "fidelity", "HW-PRB-0003")
    args = {c["tool"]: c["argument"] for c in e["calls"]}
    for (inp, _), call in zip(uses, e["calls"], strict=False):
        if call["tool"] in ("TaskCreate", "SendMessage", "ExitPlanMode", "TodoWrite"):
            assert call["argument"] == digest.of_bytes(stream.canonical(inp))
    assert args["TaskUpdate"] == "1"
    assert args["WebFetch"] == "https://example.invalid/status"
    assert all("result" in c for c in e["calls"])  # denied or unknown, each call is recorded with its result
    # "Every other message records answer: null": the probe declares no answers
    assert e["answer"] is None


def test_a_search_names_what_it_searched(fidelity):
    e = fidelity["events"]["HW-PRB-0004"]
    assert [c["argument"] for c in e["calls"]] == ["Status docs/a.md", "'**/*.md' docs", "HW-DR . --glob '*.md'"]


def test_cites_are_whole_identifiers_of_this_corpus(fidelity):
    """"cites on a produced artifact is every identifier of this corpus that appears in the
    artifact": HW-DR-00521 and XHW-DR-0007Y hold no identifier as a token, and HW-DR-9999 is
    not one this corpus carries."""
    e = fidelity["events"]["HW-PRB-0005"]
    (note,) = e["produced"]
    assert note["path"] == "notes/cites.md" and note["cites"] == ["HW-DR-0041", "HW-DR-0052"]
    stored = json.loads(fidelity["store"].get(layout.identifiers_key("fidelity")))
    assert {"HW-DR-0007", "HW-DR-0041", "HW-DR-0052"} <= set(stored["identifiers"])
    assert "HW-DR-9999" not in stored["identifiers"]


def test_every_path_a_call_names_outside_the_workspace_is_counted(fidelity):
    """"The transcript also counts the paths outside the workspace that the session named": a ../
    escape, an option's value, a redirect target and a rooted Glob pattern; a heredoc's body is
    text, not a command."""
    text = fidelity["texts"]["present"]
    assert "HW-PRB-0006 present-001: 4" in text


def test_a_write_through_a_link_lists_the_file_it_changed(fidelity):
    """"path on a produced artifact ... where the artifact landed": a Write through a linked
    directory lands in the directory the link names. (The CLI refuses to write through a linked
    file: 2.1.197 "Refusing to write through symlink", 2.1.337 "Refusing to write ...: it is a
    symbolic link"; that Edit failed and produced nothing.)"""
    e = fidelity["events"]["HW-PRB-0007"]
    uses = stream_uses(fidelity["store"], "fidelity", "HW-PRB-0007")
    assert uses[1][1].startswith("Refusing to write") and ("symlink" in uses[1][1] or "symbolic link" in uses[1][1]), uses[1][1]
    new = "New: HW-DR-0041 is superseded.\n"
    assert e["produced"] == [{"path": "docs/new.md", "result": digest.of_text(new), "cites": ["HW-DR-0041"]}]
    assert e["calls"][0]["result"] == digest.of_text(DOC_A)  # a read through a link is a read of its document


def test_the_seal_removes_files_that_link_or_name_the_probe_loosely(fidelity):
    """"tools/probe/seal.sh removes the probe shelves from the workspace, and every file that names
    the probe": by a relative link, a path relative to another directory, a title broken over a
    line or in another case."""
    ((_, listing),) = stream_uses(fidelity["store"], "fidelity", "HW-PRB-0008")
    for gone in ("linked.md", "index2.md", "broken-title.md", "shouting.md", "probes/"):
        assert gone not in listing, listing
    assert "./docs/a.md" in listing


def test_a_session_the_time_limit_ended_is_recorded_as_watched(fidelity):
    """A watched session is an observation: the calls it made until the limit, answer null (the
    three-state rule keeps an absent key for "nothing watched"), and the prose names it."""
    e = fidelity["events"]["HW-PRB-0009"]
    assert [c["tool"] for c in e["calls"]] == ["Read", "Bash"]
    assert e["calls"][0]["result"] == digest.of_text(DOC_A) and "result" not in e["calls"][1]
    assert e["answer"] is None and e["produced"] == []
    assert "The time limit ended 1 session(s) before the harness finished (HW-PRB-0009 present-001)" in fidelity["texts"]["present"]
    assert not [r for r in fidelity["report"].refusals if r.get("probe") == "HW-PRB-0009"]


# --- the bundled corpus ---------------------------------------------------------------------------

DEMO_SCENARIOS = {"scenarios": [
    {"name": "status", "match": "status of decision HW-DR-0052", "turns": [
        use("Grep", pattern="Status", path="{cwd}/docs/decisions/HW-DR-0052.md"),
        use("Bash", command="mkdir -p notes && cat > notes/status.md <<'EOF'\n# Status\n\n```\ngrep Status docs\n```\nEOF"),
        use("Edit", file_path="{cwd}/docs/decisions/HW-DR-0052.md", old_string="NOT THERE", new_string="x"),
        {"text": "HW-DR-0052 current."}]},
    {"name": "supersedes", "match": "supersedes HW-DR-0041", "turns": [
        use("TaskCreate", subject="Find the superseding decision", description="Read the decisions in turn"),
        use("Bash", command="mkdir -p notes"),
        use("Write", file_path="{cwd}/notes/supersession.md",
             content="HW-DR-0061 supersedes HW-DR-0041 (not HW-DR-00610, nor XHW-DR-0052, nor HW-DR-9999).\n"),
        {"text": "HW-DR-0061"}]},
]}


def test_the_bundled_corpus_records_one_transcript_per_arm_with_every_event(tmp_path, claude_command):
    """Issue 11's campaign: sessions of the bundled corpus that write fenced Markdown by heredoc,
    fail an edit, call TaskCreate, Grep a document and cite near-miss identifiers."""
    corpus = tmp_path / "corpus"
    shutil.copytree(DEMO / "corpus", corpus, symlinks=True)
    plan = json.loads((DEMO / "plan.json").read_text()) | {"campaign": "demo-fidelity", "repetitions": 1}
    out = record(tmp_path, "demo-fidelity", corpus, plan, DEMO_SCENARIOS, 120, claude_command)
    assert out["report"].refusals == []
    for arm in ("present", "absent"):
        by_probe = events(out["texts"][arm])
        assert sorted(by_probe) == ["HW-PRB-0007", "HW-PRB-0008"]
        status, supersedes = by_probe["HW-PRB-0007"], by_probe["HW-PRB-0008"]
        assert status["calls"][0]["argument"] == "Status docs/decisions/HW-DR-0052.md"
        assert status["produced"] == [] and status["answer"] == "current HW-DR-0052"
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", supersedes["calls"][0]["argument"])
        (note,) = supersedes["produced"]
        assert note["cites"] == ["HW-DR-0041", "HW-DR-0061"]
        assert supersedes["answer"] == "HW-DR-0061"
