"""Sealing: what "names the probe" and "names an answer key" mean, folds that state an answer,
links, and line splitting. Each test reproduces a defect sealing had (see runner/seal.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from runner.errors import SealError
from runner.plan import parse_plan
from runner.seal import seal

D = "sha256:" + "a" * 64
PID = "HW-PRB-0007"
PROBE = "docs/probes/status-of-0052.md"
TITLE = "Status of HW-DR-0052"
KEY = "docs/notes/status-answer.md"


def make_plan(path=PROBE, title=TITLE):
    return parse_plan({
        "campaign": "c1", "tier": "regression", "model": "m",
        "identity": {"lock": D, "tree": D, "selection": D, "read_set": D, "seed": 1, "harness": "h"},
        "arms": ["present", "absent"], "repetitions": 1,
        "identifier_pattern": r"HW-[A-Z]+-[0-9]{4}",
        "probes": [{"id": PID, "path": path, "title": title, "task": "Say the status.",
                    "answers": ["current HW-DR-0052", "superseded HW-DR-0052"],
                    "examines": ["docs/decisions/HW-DR-0052.md"]}],
    })


def write(root: Path, rel: str, data: str | bytes) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        p.write_bytes(data)
    else:
        p.write_text(data)


def files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() or p.is_symlink()}


def config(keys=(KEY,), folds=()):
    return (f"folds: [{', '.join(folds)}]\n"
            f"answer_keys:\n  {PID}: [{', '.join(keys)}]\n")


def make_corpus(tmp_path, extra: dict[str, str | bytes], keys=(KEY,), folds=(), probe=PROBE) -> Path:
    c = tmp_path / "corpus"
    write(c, probe, f"# {TITLE}\n\n## Task\nSay the status.\n")
    write(c, "docs/decisions/HW-DR-0052.md", "Status: current.\n")
    for k in keys:
        write(c, k, "current HW-DR-0052\n")
    write(c, ".headwater/probe.yml", config(keys, folds))
    for rel, text in extra.items():
        write(c, rel, text)
    return c


def do_seal(corpus, tmp_path, plan=None, arm="present"):
    plan = plan or make_plan()
    return seal(corpus, plan, plan.probes[0], arm, tmp_path / f"ws-{arm}")


# --- 1. a file that reaches the probe by a relative path or a link names it ------------------

@pytest.mark.parametrize("rel, text", [
    ("docs/notes/n.md", "[see](../probes/status-of-0052.md)\n"),
    ("docs/index.md", "- probes/status-of-0052.md\n"),
    ("docs/index.md", "see ./probes/status-of-0052.md for the task\n"),
    ("tools/t.md", "read ../docs/probes/status-of-0052.md first\n"),
    ("docs/notes/n.md", '[see](<../probes/status-of-0052.md#task> "the task")\n'),
    ("docs/notes/n.md", "[p]: ../probes/status-of-0052.md?plain=1\n"),
    ("docs/notes/n.md", "[p]: <../probes/status-of-0052.md>\n"),
    ("docs/notes/n.md", "[see](../probes/./../probes/status-of-0052.md).\n"),
    ("docs/notes/n.md", "[see](/docs/probes/status-of-0052.md)\n"),
    ("tools/t.md", "https://git.example/org/repo/blob/main/docs/probes/status-of-0052.md\n"),
    ("docs/notes/n.md", "see **../probes/status-of-0052.md**\n"),
    ("docs/notes/n.md", '<a href="../probes/status-of-0052.md">task</a>\n'),
    ("docs/notes/n.md", "[wiki](../probes/status-of-0052)\n"),  # a link without the suffix
])
def test_a_file_reaching_the_probe_by_a_relative_path_is_removed(tmp_path, rel, text):
    corpus = make_corpus(tmp_path, {rel: text, "docs/plain.md": "plain\n"})
    ws = do_seal(corpus, tmp_path)
    assert rel not in files(ws.path)
    assert ws.removed[rel] == "names the probe"
    assert "docs/plain.md" in files(ws.path)


@pytest.mark.parametrize("text", [
    "[x](../probes/status%20of%200052.md)\n",
    "[x](<../probes/status of 0052.md>)\n",
    "[x]: <../probes/status of 0052.md#task>\n",
])
def test_a_percent_encoded_or_bracketed_link_to_the_probe_is_removed(tmp_path, text):
    probe = "docs/probes/status of 0052.md"
    corpus = make_corpus(tmp_path, {"docs/notes/n.md": text}, probe=probe)
    ws = do_seal(corpus, tmp_path, plan=make_plan(path=probe))
    assert "docs/notes/n.md" not in files(ws.path)


@pytest.mark.parametrize("rel, text", [
    ("docs/notes/n.md", "see ../other/status-of-0052.md\n"),      # a same-named file elsewhere
    ("docs/notes/n.md", "see probes/status-of-0052.md\n"),        # docs/notes/probes/…, not the probe
    ("docs/notes/n.md", "see status-of-0052.md\n"),               # the name alone, from another directory
    ("docs/notes/n.md", "see ../probes/status-of-0052.md.bak\n"),  # another file
])
def test_a_path_that_does_not_resolve_to_the_probe_is_kept(tmp_path, rel, text):
    corpus = make_corpus(tmp_path, {rel: text})
    ws = do_seal(corpus, tmp_path)
    assert (ws.path / rel).read_text() == text


@pytest.mark.parametrize("rel, line", [
    ("tools/t.md", "[a](../docs/notes/status-answer.md)"),
    ("docs/index.md", "[a](notes/status-answer.md#top)"),
    ("docs/index.md", "[a]: ./notes/status-answer.md"),
    ("docs/notes/other.md", "[a](status-answer.md)"),
    ("docs/probes-index/x.md", "[a](../notes/status%2Danswer.md)"),
])
def test_lines_reaching_an_answer_key_by_a_relative_path_are_removed(tmp_path, rel, line):
    corpus = make_corpus(tmp_path, {rel: f"keep\n{line}\nkeep too\n"})
    ws = do_seal(corpus, tmp_path)
    assert (ws.path / rel).read_text() == "keep\nkeep too\n"
    assert ws.removed[rel + "#lines"] == "lines naming an answer key"


# --- 2. the title and the id: case and line breaks -------------------------------------------

@pytest.mark.parametrize("text", [
    "Status of\nHW-DR-0052 is what the probe asks.\n",
    "status of hw-dr-0052\n",
    "STATUS  OF\tHW-DR-0052\n",
    "> Status of\n> HW-DR-0052\n",
    "the Status of HW-DR-0052.\n",
    "# Status of\n# HW-DR-0052\n",
    "Status\n\nof HW-DR-0052\n",             # any run of white space, a blank line included
    f"see {PID}\n",
    f"see {PID.lower()}\n",                 # the id case-insensitively
    f"see {PID}-notes.md\n",                # bounded by '-'
])
def test_the_title_or_id_in_another_case_or_broken_over_lines_names_the_probe(tmp_path, text):
    corpus = make_corpus(tmp_path, {"src/a.md": text})
    ws = do_seal(corpus, tmp_path)
    assert "src/a.md" not in files(ws.path)
    assert ws.removed["src/a.md"] == "names the probe"


@pytest.mark.parametrize("text", [
    "Status of HW-DR-00521\n",      # another identifier
    "HW-PRB-00071\n",               # another probe's id
    "XHW-PRB-0007\n",
])
def test_a_longer_identifier_does_not_name_the_probe(tmp_path, text):
    corpus = make_corpus(tmp_path, {"src/a.md": text})
    ws = do_seal(corpus, tmp_path)
    assert (ws.path / "src/a.md").read_text() == text


# --- 3. an answer key named by its file name, its stem or its identifier ---------------------

@pytest.mark.parametrize("line", [
    "see status-answer.md",
    "the status-answer note says so",
    "**status-answer.md**",
    "`status-answer.md`.",
    "_status-answer_ is where it was written",
    "(status-answer.md)",
    "see docs/notes/status-answer.md",
    "cat ./docs/notes/status-answer.md; echo",
])
def test_a_line_naming_the_answer_key_by_its_name_or_stem_is_removed(tmp_path, line):
    corpus = make_corpus(tmp_path, {"src/a.md": f"keep\n{line}\nkeep too\n"})
    ws = do_seal(corpus, tmp_path)
    assert (ws.path / "src/a.md").read_text() == "keep\nkeep too\n"


@pytest.mark.parametrize("line", [
    "per HW-NOTE-0003 the decision is current",
    "per hw-note-0003 the decision is current",
    "[note](HW-NOTE-0003)",
    "HW-NOTE-0003.md",
])
def test_a_line_naming_the_answer_keys_identifier_is_removed(tmp_path, line):
    key = "docs/notes/HW-NOTE-0003.md"
    corpus = make_corpus(tmp_path, {"src/a.md": f"keep\n{line}\nkeep too\n"}, keys=(key,))
    ws = do_seal(corpus, tmp_path)
    assert (ws.path / "src/a.md").read_text() == "keep\nkeep too\n"


def test_an_identifier_the_probe_itself_uses_is_not_the_answer_keys(tmp_path):
    # The key's file name carries HW-DR-0052, the decision the probe examines: that identifier
    # names the subject, not the key, so the decision and the lines citing it stay.
    key = "docs/notes/HW-DR-0052-answer.md"
    corpus = make_corpus(tmp_path, {"src/a.md": "see HW-DR-0052\nand HW-DR-0052-answer.md\n"}, keys=(key,))
    ws = do_seal(corpus, tmp_path)
    assert (ws.path / "src/a.md").read_text() == "see HW-DR-0052\n"
    assert (ws.path / "docs/decisions/HW-DR-0052.md").read_text() == "Status: current.\n"


def test_a_plain_word_stem_is_not_a_name(tmp_path):
    key = "docs/notes/answer.md"
    corpus = make_corpus(tmp_path, {"src/a.md": "the answer is below\nanswer.md\n"}, keys=(key,))
    ws = do_seal(corpus, tmp_path)
    assert (ws.path / "src/a.md").read_text() == "the answer is below\n"


# --- 4. a name inside another word is not the answer key -------------------------------------

@pytest.mark.parametrize("line", [
    "my-status-answer.md.bak",
    "notstatus-answer.md",
    "status-answer.md.bak",
    "my_status-answer.md",
    "other/status-answer.md",                 # the same name in another directory
    "../notes/status-answer.md",              # from src/: resolves to notes/…, not docs/notes/…
    "status-answers",
    "HW-NOTE-00031",
])
def test_a_line_holding_the_name_inside_another_word_is_kept(tmp_path, line):
    corpus = make_corpus(tmp_path, {"src/a.md": f"keep\n{line}\n"})
    ws = do_seal(corpus, tmp_path)
    assert (ws.path / "src/a.md").read_text() == f"keep\n{line}\n"
    assert "src/a.md#lines" not in ws.removed


@pytest.mark.parametrize("rel, line", [
    # from the key's own directory the old relative form was the bare name, found inside words
    ("docs/notes/other.md", "my-status-answer.md.bak"),
    ("docs/notes/other.md", "notstatus-answer.md"),
    ("docs/notes/other.md", "see status-answer.md.orig"),
    ("src/a.md", "mydocs/notes/status-answer.md"),
    ("src/a.md", "docs/notes/status-answer.mdx"),
])
def test_the_name_inside_a_longer_word_next_to_the_key_is_kept(tmp_path, rel, line):
    corpus = make_corpus(tmp_path, {rel: f"keep\n{line}\n"})
    ws = do_seal(corpus, tmp_path)
    assert (ws.path / rel).read_text() == f"keep\n{line}\n"


# --- 5. a fold states an answer by the contract's word rule, not by a substring ---------------

FOLD = "tools/probe/README.md"


@pytest.mark.parametrize("text", [
    "HW-DR-0052 current\n",                            # any order (#1384)
    "HW-DR-0052 current.\n",
    "the answer is current  HW-DR-0052\n",             # inside a sentence, a run of spaces
    "the answer is current\nHW-DR-0052\n",             # broken over a line
    "the answer: **current** `HW-DR-0052`\n",          # emphasis and code around the words
    "current current HW-DR-0052\n",                    # the set of the line's words
])
def test_a_fold_stating_an_answer_is_refused(tmp_path, text):
    corpus = make_corpus(tmp_path, {FOLD: f"{TITLE}\n{text}"}, folds=(FOLD,))
    with pytest.raises(SealError, match="is a fold but states the answer"):
        do_seal(corpus, tmp_path)


@pytest.mark.parametrize("text", [
    "concurrent HW-DR-0052s were reviewed\n",            # a substring, not the words
    "The probe asks whether HW-DR-0052 is current or superseded.\n",
])
def test_a_fold_that_does_not_state_an_answer_is_kept(tmp_path, text):
    corpus = make_corpus(tmp_path, {FOLD: f"{TITLE}\n{text}"}, folds=(FOLD,))
    ws = do_seal(corpus, tmp_path)
    assert ws.folds_kept == [FOLD]


# --- 6. links --------------------------------------------------------------------------------

def test_a_link_on_the_probe_shelf_is_removed(tmp_path):
    corpus = make_corpus(tmp_path, {})
    (corpus / "docs/probes/alias.md").symlink_to("status-of-0052.md")
    ws = do_seal(corpus, tmp_path)
    assert not os.path.lexists(ws.path / "docs/probes/alias.md")
    assert ws.removed["docs/probes/alias.md"] == "on the probe shelf docs/probes/"


@pytest.mark.parametrize("rel, target, why", [
    ("docs/see.md", "probes/status-of-0052.md", "a link to the probe"),
    ("tools/k.md", "../docs/notes/status-answer.md", "a link to an answer key of the probe"),
    ("docs/p", "probes", "a link into the probe shelf docs/probes/"),
    ("head", ".git/HEAD", "a link into .git, which is never copied"),
])
def test_a_link_to_the_probe_an_answer_key_or_a_shelf_is_removed(tmp_path, rel, target, why):
    corpus = make_corpus(tmp_path, {".git/HEAD": "ref: x\n"})
    (corpus / rel).parent.mkdir(parents=True, exist_ok=True)
    (corpus / rel).symlink_to(target)
    ws = do_seal(corpus, tmp_path)
    assert not os.path.lexists(ws.path / rel)
    assert ws.removed[rel] == why


def test_a_link_to_a_removed_file_is_removed(tmp_path):
    corpus = make_corpus(tmp_path, {"src/mentions.md": f"see {PID}\n"})
    (corpus / "src/alias.md").symlink_to("mentions.md")
    ws = do_seal(corpus, tmp_path)
    assert not os.path.lexists(ws.path / "src/alias.md")
    assert ws.removed["src/alias.md"] == "a link to src/mentions.md, which is removed (names the probe)"


def test_a_directory_link_is_copied_as_a_link(tmp_path):
    corpus = make_corpus(tmp_path, {"src/a.md": "a\n"})
    (corpus / "lib").symlink_to("src")
    ws = do_seal(corpus, tmp_path)
    assert (ws.path / "lib").is_symlink() and os.readlink(ws.path / "lib") == "src"
    assert (ws.path / "lib/a.md").read_text() == "a\n"
    assert "lib" not in ws.removed


def test_the_arm_removes_a_directory_link_and_says_so(tmp_path):
    corpus = make_corpus(tmp_path, {"shared/skills/s/SKILL.md": "skill\n"})
    (corpus / ".claude").mkdir()
    (corpus / ".claude/skills").symlink_to("../shared/skills")
    ws = do_seal(corpus, tmp_path, arm="absent")
    assert not os.path.lexists(ws.path / ".claude/skills")
    assert ws.removed[".claude/skills"] == "removed by the absent arm"


def test_an_absolute_link_inside_the_corpus_leads_into_the_workspace(tmp_path):
    corpus = make_corpus(tmp_path, {"src/a.md": "a\n"})
    (corpus / "src/abs.md").symlink_to(corpus.resolve() / "src/a.md")
    ws = do_seal(corpus, tmp_path)
    assert os.readlink(ws.path / "src/abs.md") == "a.md"


# --- 7. lines are split at line feeds only ---------------------------------------------------

@pytest.mark.parametrize("data, expected", [
    (b"a\x0bdocs/notes/status-answer.md\nkeep\n", b"keep\n"),
    (b"a\x0cdocs/notes/status-answer.md\nkeep\n", b"keep\n"),
    (b"one\rdocs/notes/status-answer.md\ntwo\n", b"two\n"),
    ("one\u2028docs/notes/status-answer.md\ntwo\n".encode(), b"two\n"),
    (b"x\r\ndocs/notes/status-answer.md\r\nkeep\r\n", b"x\r\nkeep\r\n"),
    (b"x\ndocs/notes/status-answer.md", b"x\n"),
    (b"\xff\xfe binary docs/notes/status-answer.md\n\xff\n", b"\xff\n"),
])
def test_lines_are_split_at_line_feeds_only(tmp_path, data, expected):
    corpus = make_corpus(tmp_path, {"src/a.txt": data})
    ws = do_seal(corpus, tmp_path)
    assert (ws.path / "src/a.txt").read_bytes() == expected


def test_a_link_to_a_fold_is_removed_not_refused(tmp_path):
    # folds: declares a path; another path leading to the same bytes is a file folds: does not
    # declare, so it goes as one would (before, it was copied and then refused the workspace)
    corpus = make_corpus(tmp_path, {FOLD: f"{TITLE} is explained here.\n"}, folds=(FOLD,))
    (corpus / "tools/alias.md").symlink_to("probe/README.md")
    ws = do_seal(corpus, tmp_path)
    assert ws.removed["tools/alias.md"] == "names the probe"
    assert ws.folds_kept == [FOLD]


def test_a_loop_of_links_refuses_the_workspace_with_a_reason(tmp_path):
    corpus = make_corpus(tmp_path, {})
    (corpus / "a").symlink_to("b")
    (corpus / "b").symlink_to("a")
    with pytest.raises(SealError, match="cannot be followed"):
        do_seal(corpus, tmp_path)


def test_a_top_level_git_file_is_not_copied(tmp_path):
    corpus = make_corpus(tmp_path, {".git": "gitdir: /elsewhere/.git/worktrees/x\n"})
    ws = do_seal(corpus, tmp_path)
    assert not (ws.path / ".git").exists()


# --- 8. answer keys and shelves declared through a linked directory --------------------------

def test_an_answer_key_declared_through_a_linked_directory_is_removed_at_both_paths(tmp_path):
    corpus = make_corpus(tmp_path, {"src/a.md": "keep\nsee notes-src/status-answer.md\n"}, keys=())
    write(corpus, ".headwater/probe.yml", config(keys=(KEY,)))
    write(corpus, "notes-src/status-answer.md", "current HW-DR-0052\n")
    write(corpus, "notes-src/other.md", "other\n")
    (corpus / "docs/notes").symlink_to("../notes-src")
    (corpus / "tools").mkdir()
    (corpus / "tools/k.md").symlink_to("../notes-src/status-answer.md")
    ws = do_seal(corpus, tmp_path)
    assert not os.path.lexists(ws.path / "notes-src/status-answer.md")
    assert not os.path.lexists(ws.path / "docs/notes/status-answer.md")
    assert ws.removed["notes-src/status-answer.md"] == "an answer key of the probe"
    assert ws.removed["tools/k.md"] == "a link to an answer key of the probe"
    assert (ws.path / "docs/notes/other.md").read_text() == "other\n"  # the link itself stays
    assert (ws.path / "src/a.md").read_text() == "keep\n"  # a line naming the real path goes


def test_an_answer_key_that_is_a_link_is_removed_with_its_target(tmp_path):
    corpus = make_corpus(tmp_path, {"data/real.md": "current HW-DR-0052\n"}, keys=())
    write(corpus, ".headwater/probe.yml", config(keys=(KEY,)))
    (corpus / "docs/notes").mkdir(parents=True)
    (corpus / KEY).symlink_to("../../data/real.md")
    ws = do_seal(corpus, tmp_path)
    assert not os.path.lexists(ws.path / KEY)
    assert not os.path.lexists(ws.path / "data/real.md")


def test_a_probe_shelf_declared_through_a_linked_directory_is_removed(tmp_path):
    plan = parse_plan({
        "campaign": "c1", "tier": "regression", "model": "m",
        "identity": {"lock": D, "tree": D, "selection": D, "read_set": D, "seed": 1, "harness": "h"},
        "arms": ["present"], "repetitions": 1, "identifier_pattern": r"HW-[A-Z]+-[0-9]{4}",
        "probes": [{"id": PID, "path": PROBE, "title": TITLE, "task": "Say the status.",
                    "answers": ["current HW-DR-0052"], "examines": []},
                   {"id": "HW-PRB-0008", "path": "docs/probes/other.md", "title": "Owner of billing",
                    "task": "Who owns billing?", "answers": ["alice"], "examines": []}]})
    corpus = tmp_path / "corpus"
    write(corpus, "probes-src/status-of-0052.md", f"# {TITLE}\n\n## Task\nSay the status.\n")
    write(corpus, "probes-src/other.md", "# Owner of billing\n\nanswer: alice\n")
    write(corpus, "docs/decisions/HW-DR-0052.md", "Status: current.\n")
    (corpus / "docs/probes").symlink_to("../probes-src")
    ws = seal(corpus, plan, plan.probes[0], "present", tmp_path / "ws")
    assert not os.path.lexists(ws.path / "probes-src/other.md")
    assert not os.path.lexists(ws.path / "docs/probes")
    assert ws.removed["probes-src/other.md"] == "on the probe shelf probes-src/"
    assert files(ws.path) == {"docs/decisions/HW-DR-0052.md"}


# --- 9. the arm applies through a linked .claude ---------------------------------------------

CLAUDE_TREE = {"config/claude/skills/foo/SKILL.md": "---\nname: foo\n---\nskill\n",
               "config/claude/CLAUDE.md": "memory\n",
               "config/claude/hooks/h.sh": "echo hook\n",
               "config/claude/commands/c.md": "a command\n",
               "config/claude/settings.json": '{"hooks": {"Stop": []}, "model": "x"}\n'}


@pytest.mark.parametrize("arm, gone, kept", [
    ("no-skills", [".claude/skills/foo/SKILL.md"],
     [".claude/CLAUDE.md", ".claude/hooks/h.sh", ".claude/commands/c.md"]),
    ("absent", [".claude/skills/foo/SKILL.md", ".claude/CLAUDE.md", ".claude/hooks/h.sh"],
     [".claude/commands/c.md"]),
    ("no-claude-md", [".claude/CLAUDE.md"],
     [".claude/skills/foo/SKILL.md", ".claude/hooks/h.sh"]),
])
def test_the_arm_applies_through_a_linked_claude_directory(tmp_path, arm, gone, kept):
    corpus = make_corpus(tmp_path, CLAUDE_TREE)
    (corpus / ".claude").symlink_to("config/claude")
    ws = do_seal(corpus, tmp_path, arm=arm)
    for rel in gone:
        assert not os.path.lexists(ws.path / rel), rel
    for rel in kept:
        assert (ws.path / rel).is_file(), rel
    if arm in ("no-skills", "absent"):
        # materialised: a directory of its own, the arm applied to the path the session sees
        assert (ws.path / ".claude").is_dir() and not (ws.path / ".claude").is_symlink()
        assert ws.removed[".claude/skills/foo/SKILL.md"] == f"removed by the {arm} arm"
        assert ".claude/commands/c.md" in ws.manifest
    if arm == "absent":
        assert "hooks" not in json.loads((ws.path / ".claude/settings.json").read_text())


def test_a_linked_claude_directory_stays_a_link_where_the_arm_removes_nothing_under_it(tmp_path):
    corpus = make_corpus(tmp_path, CLAUDE_TREE)
    (corpus / ".claude").symlink_to("config/claude")
    ws = do_seal(corpus, tmp_path, arm="present")
    assert (ws.path / ".claude").is_symlink() and os.readlink(ws.path / ".claude") == "config/claude"
    assert (ws.path / ".claude/skills/foo/SKILL.md").is_file()


def test_claude_md_and_mcp_json_reached_through_links_are_removed_by_the_arm(tmp_path):
    corpus = make_corpus(tmp_path, {"guides/CLAUDE.md": "memory\n", "guides/g.md": "guide\n",
                                    "config/mcp.json": '{"mcpServers": {"s": {}}}\n'})
    (corpus / "docs/guide").symlink_to("../guides")
    (corpus / ".mcp.json").symlink_to("config/mcp.json")
    ws = do_seal(corpus, tmp_path, arm="absent")
    assert not os.path.lexists(ws.path / "docs/guide/CLAUDE.md")
    assert not os.path.lexists(ws.path / "guides/CLAUDE.md")
    assert (ws.path / "docs/guide/g.md").read_text() == "guide\n"
    assert not os.path.lexists(ws.path / ".mcp.json")
    assert ws.mcp_servers == []


# --- 10. sealing is linear in a line's length ------------------------------------------------

@pytest.mark.parametrize("unit", ["a/status-answer.md#", "a/status-answer.md?", "a/status-of-0052.md#"])
def test_a_long_line_of_fragments_seals_in_linear_time(tmp_path, unit):
    import time
    line = unit * (1_000_000 // len(unit))
    corpus = make_corpus(tmp_path, {"data/big.txt": line + "\n"})
    t = time.monotonic()
    ws = do_seal(corpus, tmp_path)
    assert time.monotonic() - t < 5
    assert (ws.path / "data/big.txt").read_text() == line + "\n"


def test_a_reference_after_a_fragment_in_a_long_token_is_still_decided(tmp_path):
    # the path part of a token is what resolves; a name in its fragment is not a reference
    line = "x.md#a/status-answer.md#" * 1000 + " ../docs/notes/status-answer.md#top"
    corpus = make_corpus(tmp_path, {"src/a.md": f"keep\n{line}\n", "src/b.md": "keep\nx.md#../docs/notes/status-answer.md\n"})
    ws = do_seal(corpus, tmp_path)
    assert (ws.path / "src/a.md").read_text() == "keep\n"
    assert (ws.path / "src/b.md").read_text() == "keep\nx.md#../docs/notes/status-answer.md\n"


# --- 11. the title's word gap: white space, a line prefix only after a line break ------------

@pytest.mark.parametrize("text", [
    "status | of | hw-dr-0052\n",
    "status - of hw-dr-0052\n",
    "status ### of hw-dr-0052\n",
    "status // of hw-dr-0052\n",
    "status of >hw-dr-0052\n",
    "status of -\nhw-dr-0052\n",          # a prefix before the line break, not after it
    "status\r- of hw-dr-0052\n",          # a lone CR is not a line break
])
def test_a_title_with_punctuation_between_its_words_on_a_line_is_not_the_title(tmp_path, text):
    corpus = make_corpus(tmp_path, {"src/a.md": text.encode()})
    ws = do_seal(corpus, tmp_path)
    assert (ws.path / "src/a.md").read_bytes() == text.encode()


@pytest.mark.parametrize("text", [
    "> Status of\n> HW-DR-0052\n",
    "# Status of\n# HW-DR-0052\n",
    "// Status of\n// HW-DR-0052\n",
    "- Status of\n  - HW-DR-0052\n",
    "> Status of\n>HW-DR-0052\n",
    "> Status\n>\n> of HW-DR-0052\n",
    "Status of\r\n> HW-DR-0052\r\n",
    "> > Status of\n> > HW-DR-0052\n",
])
def test_a_title_wrapped_with_a_line_prefix_after_the_break_names_the_probe(tmp_path, text):
    corpus = make_corpus(tmp_path, {"src/a.md": text})
    ws = do_seal(corpus, tmp_path)
    assert ws.removed["src/a.md"] == "names the probe"


def test_the_final_check_refuses_a_key_or_a_shelf_left_at_its_real_path(tmp_path, monkeypatch):
    # the check reads paths, not only contents: a key's bytes need not name it
    from runner import seal as seal_module
    corpus = make_corpus(tmp_path, {"notes-src/status-answer.md": "current HW-DR-0052\n"}, keys=())
    write(corpus, ".headwater/probe.yml", config(keys=(KEY,)))
    (corpus / "docs/notes").symlink_to("../notes-src")
    monkeypatch.setattr(seal_module._Sealer, "why_path_removed", lambda self, rel: None)
    with pytest.raises(SealError, match="notes-src/status-answer.md is the answer key"):
        do_seal(corpus, tmp_path)


# --- 12. a path names the probe as much as a line does (issue 27, item 4) --------------------

@pytest.mark.parametrize("rel", [
    "docs/notes/HW-PRB-0007-followup.md",  # the id in the file name
    "notes/hw-prb-0007.txt",  # in another case, outside docs/
    "docs/HW-PRB-0007/plan.md",  # in a directory's name
    "tools/Status of HW-DR-0052.md",  # the title, its words apart as on a line
])
def test_a_file_whose_path_names_the_probe_is_removed(tmp_path, rel):
    """"tools/probe/seal.sh removes the probe shelves from the workspace, and every file that names
    the probe", whatever the file holds."""
    corpus = make_corpus(tmp_path, {rel: "Nothing about any probe.\n"})
    ws = do_seal(corpus, tmp_path)
    assert ws.removed[rel] == "names the probe"
    assert rel not in files(ws.path)


@pytest.mark.parametrize("rel", ["docs/notes/HW-PRB-00071.md", "docs/status-of-hw-dr-0052.md", "docs/XHW-PRB-0007.md"])
def test_a_path_holding_a_longer_identifier_or_a_slug_is_kept(tmp_path, rel):
    corpus = make_corpus(tmp_path, {rel: "Nothing.\n"})
    assert rel in files(do_seal(corpus, tmp_path).path)


def test_a_link_whose_name_names_the_probe_is_removed_even_to_a_directory(tmp_path):
    corpus = make_corpus(tmp_path, {"docs/other/x.md": "x\n"})
    os.symlink("other", corpus / "docs/HW-PRB-0007-notes")
    ws = do_seal(corpus, tmp_path)
    assert ws.removed["docs/HW-PRB-0007-notes"] == "names the probe"
    assert not os.path.lexists(ws.path / "docs/HW-PRB-0007-notes")


def test_a_fold_may_name_the_probe_by_its_path(tmp_path):
    """"A fold names the probe by path or title and states no answer": outside docs/ it stays."""
    rel = "tools/HW-PRB-0007-fold.md"
    corpus = make_corpus(tmp_path, {rel: "How to run it.\n"}, folds=(rel,))
    ws = do_seal(corpus, tmp_path)
    assert rel in files(ws.path) and ws.folds_kept == [rel]


def test_the_final_check_refuses_a_path_that_names_the_probe(tmp_path, monkeypatch):
    """"The driver refuses a workspace in which a file still names the probe": the check reads
    every path, not only every line."""
    from runner import seal as sealing
    rel = "docs/notes/HW-PRB-0007-followup.md"
    corpus = make_corpus(tmp_path, {rel: "Nothing.\n"})
    monkeypatch.setattr(sealing._Sealer, "why_removed", lambda self, f: self.why_path_removed(f.rel))
    with pytest.raises(SealError, match=f"{rel} still names the probe"):
        do_seal(corpus, tmp_path)


@pytest.mark.parametrize("rel", ["tools/status-answer.md", "docs/archive/status-answer.md", "docs/status-answer/old.md"])
def test_a_file_whose_path_names_an_answer_key_is_removed(tmp_path, rel):
    """"The driver refuses a workspace in which a file still names the probe or an answer key": a
    copy of the key under another directory names it by its path, as a line naming it would."""
    corpus = make_corpus(tmp_path, {rel: "current HW-DR-0052\n"})
    ws = do_seal(corpus, tmp_path)
    assert ws.removed[rel] == "its path names an answer key" and rel not in files(ws.path)


def test_a_path_holding_the_key_s_name_inside_a_longer_name_is_kept(tmp_path):
    rel = "docs/notes/not-status-answer.md.bak"
    corpus = make_corpus(tmp_path, {rel: "x\n"})
    assert rel in files(do_seal(corpus, tmp_path).path)
