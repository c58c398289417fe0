"""Contract fidelity 3 (issue 27), through the real Claude Code CLI.

Each rule is held by a session the real CLI ran against the scripted provider, recorded under
bwrap and turned into a transcript by the transform, as ``probe-runner run`` does (tests/
fidelity.py). One campaign holds one probe per rule; a second campaign is an arm whose every
session the time limit ends.
"""

from __future__ import annotations

import base64
import json
import math
from decimal import Decimal

import pytest
from fidelity import events, plan_of, probe, record, stream_uses, use, write_corpus

from runner import digest, layout
from runner.budget import books
from runner.harnesses import CLAUDE_CODE
from runner.harnesses.claude_code.command import tool_names
from runner.ledger import Ledger
from runner.transform.transcript import parse as parse_transcript
from tests.support.clis import qualified_versions


@pytest.fixture(scope="module", params=qualified_versions())
def claude_command(request, qualified_cli):
    """This module's suite runs on every qualified CLI version, the pinned one first."""
    return qualified_cli(request.param)

IDENT = "HW-[A-Z]+-[0-9]{4}"
ANSWERS = ["current HW-DR-0052", "superseded HW-DR-0052"]
DOC = "# HW-DR-0052\n\nStatus: current.\n"
CRLF = b"# Notes\r\n\r\nOn HW-DR-0052.\r\n"
# a 1x1 PNG, which the CLI passes through as it is
PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC")
NOTEBOOK = json.dumps({"cells": [{"cell_type": "code", "source": ["print(1)"], "metadata": {}, "outputs": [], "execution_count": None}],
                       "metadata": {}, "nbformat": 4, "nbformat_minor": 5}) + "\n"
CORPUS: dict[str, str | bytes] = {
    "CLAUDE.md": "# Guide\n",
    "docs/a.md": DOC,
    "docs/crlf.md": CRLF,
    "docs/img.png": PNG,
    "docs/nb.ipynb": NOTEBOOK,
    "docs/bin.dat": bytes(range(256)),
    # named by its path alone: the probe HW-PRB-0399's id is in its file name, its text is innocent
    "docs/notes/HW-PRB-0399-followup.md": "A follow-up on the shelf.\n",
    "docs/notes/kept.md": "Kept.\n",
}
PROBES = [
    probe("HW-PRB-0301", "FID3-READS: read after writes.", ANSWERS),
    probe("HW-PRB-0302", "FID3-STRIP: name the workspace.", ANSWERS),
    probe("HW-PRB-0303", "FID3-OUTSIDE: walk around.", ANSWERS),
    probe("HW-PRB-0399", "FID3-SEAL: list the corpus.", ANSWERS),
    probe("HW-PRB-0305", "FID3-TOOLS: delegate.", ANSWERS),
]
AFTER_EDIT = DOC.replace("current", "moot")
AFTER_SED = DOC.replace("current", "gone")
# What the CLI answers a Read of a binary file: the start is common to 2.1.197 and 2.1.337, the
# advice after it differs (2.1.197: "Please use appropriate tools for binary file analysis.",
# 2.1.337: "Use a skill for this file type if one is available, ..."), so the test takes the
# answer from the stream and holds the transcript to it.
BINARY_ERROR_START = "<tool_use_error>This tool cannot read binary files. The file appears to be a binary .dat file. "
# without git, a.md would be left "changed"
GIT = ("git init -q && git add docs/a.md && git -c user.email=r@x -c user.name=r commit -qm x; "
       "printf 'changed\\n' > docs/a.md; git checkout -q -- docs/a.md")
STRIP = ["cat {cwd}//docs/a.md", "find {cwd}/ -name a.md", "ls \"{cwd}/\"'docs'", "grep -r --include=*.md Status {cwd}/./docs/"]
OUTSIDE = ["echo '~/notes' \"~/x\"", "cd docs && cat ../CLAUDE.md", "cat ../CLAUDE.md", "ln -s ../CLAUDE.md docs/guide.md",
           "cat ~/.profile", "cd /tmp", "cat ../etc/hostname"]
DELEGATE = {"subagent_type": "general-purpose", "description": "look", "prompt": "Read the docs"}

SCENARIOS = {"scenarios": [
    {"name": "reads", "match": "FID3-READS", "turns": [
        use("Read", file_path="{cwd}/docs/a.md"),                                        # 1: the sealed document
        use("Edit", file_path="{cwd}/docs/a.md", old_string="current", new_string="moot"),
        use("Read", file_path="{cwd}/docs/a.md"),                                        # 3: as the Edit left it
        use("Read", file_path="{cwd}/docs/a.md", offset=2, limit=1),                     # 4: a part, after a change
        use("Bash", command="sed -i 's/moot/gone/' docs/a.md"),
        use("Read", file_path="{cwd}/docs/a.md"),                                        # 6: as sed left it
        use("Bash", command="printf 'copied\\n' > docs/a.md"),
        use("Read", file_path="{cwd}/docs/a.md"),                                        # 8: as the redirect left it
        use("Bash", command=GIT),
        use("Read", file_path="{cwd}/docs/a.md"),                                        # 10: as git checkout left it
        use("Write", file_path="{cwd}/docs/new.md", content="new\n"),
        use("Read", file_path="{cwd}/docs/new.md"),                                      # 12: as the Write left it
        use("Read", file_path="{cwd}/docs/new.md"),                                      # 13: "file unchanged"
        use("Read", file_path="{cwd}/docs/crlf.md"),                                     # 14: CRLF: the bytes, not the view
        use("Read", file_path="{cwd}/docs/img.png"),                                     # 15: an image's own bytes
        use("Read", file_path="{cwd}/docs/nb.ipynb"),                                    # 16: cells, of a notebook left as sealed
        use("Read", file_path="{cwd}/docs/bin.dat"),                                     # 17: refused: what it returned
        {"text": "HW-DR-0052 current"}]},
    {"name": "strip", "match": "FID3-STRIP", "turns": [*(use("Bash", command=c) for c in STRIP), {"text": "HW-DR-0052 current"}]},
    {"name": "outside", "match": "FID3-OUTSIDE", "turns": [*(use("Bash", command=c) for c in OUTSIDE), {"text": "HW-DR-0052 current"}]},
    {"name": "seal", "match": "FID3-SEAL", "turns": [use("Bash", command="find . -type f | sort"), {"text": "HW-DR-0052 current"}]},
    {"name": "tools", "match": "FID3-TOOLS", "turns": [
        use("Task", **DELEGATE), use("Agent", **DELEGATE), use("TaskCreate", subject="s", description="d"),
        use("CronCreate", cron="* * * * *", prompt="x"), {"text": "HW-DR-0052 current"}]},
]}


@pytest.fixture(scope="module")
def fidelity3(tmp_path_factory, claude_command):
    root = tmp_path_factory.mktemp("fidelity3")
    corpus = root / "corpus"
    write_corpus(corpus, CORPUS, PROBES)
    out = record(root, "fidelity3", corpus, plan_of("fidelity3", PROBES, IDENT), SCENARIOS, 120, claude_command)
    assert out["texts"]["present"], out["report"]
    out["events"] = events(out["texts"]["present"])
    return out


def test_a_read_is_the_digest_of_the_document_as_that_read_saw_it(fidelity3):
    """"result on a call is the content digest of the document … never the bytes returned": after
    an Edit, a sed -i, a redirect and a git checkout each Read is the document those left; a read of
    a line range after a change proves no bytes and has no result; a CRLF document is its bytes, not
    the CLI's LF view; an image its own bytes; a notebook the session never changed its sealed bytes;
    a refused read what it returned."""
    e = fidelity3["events"]["HW-PRB-0301"]
    uses = stream_uses(fidelity3["store"], "fidelity3", "HW-PRB-0301")
    binary_error = uses[16][1]  # what the CLI answered the refused read
    assert binary_error.startswith(BINARY_ERROR_START) and binary_error.endswith("</tool_use_error>"), binary_error
    results = [c.get("result") for c in e["calls"]]
    reads = {i + 1: r for i, (c, r) in enumerate(zip(e["calls"], results, strict=True)) if c["tool"] == "Read"}
    assert reads == {
        1: digest.of_text(DOC),
        3: digest.of_text(AFTER_EDIT),
        4: None,
        6: digest.of_text(AFTER_SED),
        8: digest.of_text("copied\n"),
        10: digest.of_text("copied\n"),
        12: digest.of_text("new\n"),
        13: digest.of_text("new\n"),
        14: digest.of_bytes(CRLF),
        15: digest.of_bytes(PNG),
        16: digest.of_text(NOTEBOOK),
        17: digest.of_text(binary_error),
    }
    assert "result" not in e["calls"][3]  # the three-state rule: no key, not a guess
    # call 13 re-reads an unchanged file: 2.1.197 answers a "Wasted call ..." stub instead of the content,
    # 2.1.337 the content again; either way the transcript holds the document's digest (above)
    assert uses[12][1].startswith("Wasted call") or uses[12][1] == uses[11][1], uses[12][1]
    assert "the Read of docs/a.md (call 4) has no result: the stream shows only part of it" in fidelity3["texts"]["present"]


def test_a_workspace_path_in_a_command_is_a_word_that_still_names_the_file(fidelity3):
    """"A path inside the workspace is written relative to it": the prefix goes, the word stays."""
    e = fidelity3["events"]["HW-PRB-0302"]
    assert [c["argument"] for c in e["calls"]] == [
        "cat docs/a.md", "find . -name a.md", "ls \"\"'docs'", "grep -r --include=*.md Status docs/"]
    uses = stream_uses(fidelity3["store"], "fidelity3", "HW-PRB-0302")
    assert "# HW-DR-0052" in uses[0][1] and uses[1][1] == "/workspace/docs/a.md"  # the commands named real files


def test_only_paths_the_shell_resolves_outside_the_workspace_are_counted(fidelity3):
    """"counts the paths outside the workspace that the session named": a quoted ~ is no home;
    cd docs carries into the next call (the CLI keeps the shell's directory), so ../CLAUDE.md is the
    workspace's; a relative link target is read from the link's directory; cd /tmp is put back at
    the workspace after its call, so ../etc/hostname is outside. Three paths: ~/.profile, /tmp,
    ../etc/hostname."""
    uses = stream_uses(fidelity3["store"], "fidelity3", "HW-PRB-0303")
    assert uses[2][1] == "# Guide"  # `cat ../CLAUDE.md` from docs/: the workspace's CLAUDE.md
    assert "HW-PRB-0303 present-001: 3" in fidelity3["texts"]["present"]


def test_a_file_whose_path_names_the_probe_is_sealed_away(fidelity3):
    """"removes … every file that names the probe": docs/notes/HW-PRB-0399-followup.md names
    HW-PRB-0399 by its path, and the session of that probe never sees it."""
    ((_, listing),) = stream_uses(fidelity3["store"], "fidelity3", "HW-PRB-0399")
    assert "./docs/notes/kept.md" in listing and "HW-PRB-0399" not in listing
    sealed = json.loads(fidelity3["store"].get(layout.SessionKeys("fidelity3", "HW-PRB-0399", "present-001").seal))
    assert sealed["removed"]["docs/notes/HW-PRB-0399-followup.md"] == "names the probe"


def test_a_tool_outside_the_one_list_does_not_run(fidelity3):
    """"Every arm runs in the permission mode dontAsk, with one list of allowed tools": the CLI
    offers the listed tools and no others, so a subagent (Task, Agent), TaskCreate and CronCreate
    are refused by the CLI itself, and the session is an event with those calls refused."""
    store = fidelity3["store"]
    init = next(json.loads(x) for x in store.get(layout.SessionKeys("fidelity3", "HW-PRB-0305", "present-001").stream).splitlines()
                if json.loads(x).get("subtype") == "init")
    assert set(init["tools"]) <= set(tool_names(list(CLAUDE_CODE.allowed_tools)))
    uses = stream_uses(store, "fidelity3", "HW-PRB-0305")
    assert all("No such tool available" in r for _, r in uses), uses
    e = fidelity3["events"]["HW-PRB-0305"]
    assert [c["tool"] for c in e["calls"]] == ["Task", "Agent", "TaskCreate", "CronCreate"]
    assert not [r for r in fidelity3["report"].refusals if r.get("probe") == "HW-PRB-0305"]


# --- item 5: an arm whose every session the time limit ends ----------------------------------------

# The Bash call outlasts the time limit. Not a standalone `sleep`: 2.1.337 refuses one itself
# ("Blocked: standalone sleep 600 ..."), at once, and the session would end with its answer.
SLOW = {"scenarios": [{"name": "slow", "turns": [
    use("Read", file_path="{cwd}/docs/a.md"), use("Bash", command="tail -f /dev/null", timeout=600000), {"text": "HW-DR-0052 current"}]}]}


def test_an_arm_the_time_limit_cut_everywhere_costs_what_the_gateway_metered(tmp_path, claude_command):
    """"cost_cents: the realized cost, as a whole number of cents" and "Every one of the twelve is
    required": no session of the arm reaches its result line, yet the gateway metered each answer,
    so the arm has its transcript and its cost is the books' to the cent."""
    corpus = tmp_path / "corpus"
    probes = [probe("HW-PRB-0311", "FID3-SLOW: run out of time.", ANSWERS)]
    write_corpus(corpus, {"docs/a.md": DOC}, probes)
    out = record(tmp_path, "slow", corpus, plan_of("slow", probes, IDENT, repetitions=2), SLOW, 25, claude_command)
    assert out["texts"]["present"] is not None, out["report"].refusals
    identity = parse_transcript(out["texts"]["present"]).identity
    metered = [json.loads(out["store"].get(layout.SessionKeys("slow", "HW-PRB-0311", s).capture))["gateway"]
               for s in ("present-001", "present-002")]
    assert all(m["calls"] >= 2 and Decimal(m["cost_usd"]) > 0 for m in metered)  # both answers before the blocking call
    total = sum(Decimal(m["cost_usd"]) for m in metered)
    assert identity["cost_cents"] == math.ceil(total * 100) > 0
    spent = books(Ledger(out["store"], "slow")).spent
    assert spent == total  # the books settled each attempt at the same meter
    assert "The time limit ended 2 session(s)" in out["texts"]["present"]


def test_an_arm_whose_cost_nobody_knows_is_refused_with_the_reason(tmp_path, claude_command):
    """"Every one of the twelve is required" and "A run that recorded no cost leaves the cost of the
    instrument to a guess": without a gateway nothing metered the cut sessions, so the arm is
    refused, and the refusal says why."""
    corpus = tmp_path / "corpus"
    probes = [probe("HW-PRB-0312", "FID3-SLOW: run out of time, unmetered.", ANSWERS)]
    write_corpus(corpus, {"docs/a.md": DOC}, probes)
    out = record(tmp_path, "unmetered", corpus, plan_of("unmetered", probes, IDENT), SLOW, 20, claude_command, gateway={"enabled": False})
    assert out["texts"]["present"] is None
    (refusal,) = [r for r in out["report"].refusals if r["scope"] == "transcript"]
    assert refusal["reason"] == ("identity: the run identity lacks cost_cents (the cost of none of its 1 "
                                 "captured sessions is known: each ended without a result line and no provider gateway metered it)")
