"""Sealing a workspace for (probe, arm)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from runner import digest
from runner.errors import SealError
from runner.plan import parse_plan

D = "sha256:" + "a" * 64
PID = "HW-PR-0001"
TITLE = "The status probe"


def make_plan(answers=("current HW-DR-0052",)):
    return parse_plan({
        "campaign": "c1", "tier": "regression", "model": "m",
        "identity": {"lock": D, "tree": D, "selection": D, "read_set": D, "seed": 1, "harness": "h"},
        "arms": ["present", "absent", "no-hook", "mcp"], "repetitions": 1,
        "identifier_pattern": r"HW-DR-\d{4}",
        "probes": [{"id": PID, "path": "docs/probes/status.md", "title": TITLE, "task": "Say the status.", "answers": list(answers)}],
    })


def write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() or p.is_symlink()}


def do_seal(corpus, tmp_path, arm="present", plan=None):
    from runner.seal import seal

    plan = plan or make_plan()
    return seal(corpus, plan, plan.probes[0], arm, tmp_path / f"ws-{arm}")


@pytest.fixture
def corpus(tmp_path):
    c = tmp_path / "corpus"
    write(c, "docs/probes/status.md", f"# {TITLE}\nid {PID}\n")
    write(c, "docs/probes/other.md", "another probe document\n")
    write(c, "docs/guide.md", f"See {PID} for details.\n")
    write(c, "docs/plain.md", "Nothing to see.\n")
    write(c, "src/readme.txt", f"This mentions {TITLE}.\n")
    write(c, "src/fold.txt", f"Folded: {TITLE} is explained here.\n")
    write(c, "answers/key.md", "current HW-DR-0052\n")
    write(c, "src/index.md", "first line\nsee ../answers/key.md\nsee answers/key.md too\nlast line\n")
    write(c, ".headwater/probe.yml", f"folds:\n  - src/fold.txt\nanswer_keys:\n  {PID}:\n    - answers/key.md\n")
    write(c, ".git/HEAD", "ref: refs/heads/main\n")
    write(c, "README.md", "top level\n")
    return c


def test_seal_exact_workspace_and_manifest(corpus, tmp_path):
    ws = do_seal(corpus, tmp_path)
    assert files(ws.path) == {"docs/plain.md", "src/fold.txt", "src/index.md", "README.md"}
    expected_bytes = {
        "README.md": b"top level\n",
        "docs/plain.md": b"Nothing to see.\n",
        "src/fold.txt": f"Folded: {TITLE} is explained here.\n".encode(),
        "src/index.md": b"first line\nlast line\n",
    }
    assert ws.manifest == {k: digest.of_bytes(v) for k, v in sorted(expected_bytes.items())}
    assert list(ws.manifest) == sorted(ws.manifest)
    for rel, data in expected_bytes.items():
        assert (ws.path / rel).read_bytes() == data
    assert ws.folds_kept == ["src/fold.txt"]
    assert set(ws.removed) == {
        "docs/probes/status.md", "docs/probes/other.md", "docs/guide.md", "src/readme.txt",
        "answers/key.md", ".headwater/probe.yml", "src/index.md#lines",
    }
    assert not (ws.path / ".git").exists()


def test_fold_inside_docs_is_still_removed(corpus, tmp_path):
    write(corpus, ".headwater/probe.yml", f"folds:\n  - src/fold.txt\n  - docs/guide.md\nanswer_keys:\n  {PID}:\n    - answers/key.md\n")
    ws = do_seal(corpus, tmp_path)
    assert "docs/guide.md" not in files(ws.path)


def test_unfolded_file_outside_docs_naming_title_removed(corpus, tmp_path):
    write(corpus, ".headwater/probe.yml", f"answer_keys:\n  {PID}:\n    - answers/key.md\n")
    ws = do_seal(corpus, tmp_path)
    assert "src/fold.txt" not in files(ws.path)
    assert ws.folds_kept == []


def test_fold_stating_answer_refused(corpus, tmp_path):
    write(corpus, "src/fold.txt", f"{TITLE}: the answer is Current HW-DR-0052\n")
    with pytest.raises(SealError) as e:
        do_seal(corpus, tmp_path)
    assert "src/fold.txt" in str(e.value) and "states the answer" in str(e.value)


def test_symlink_out_of_corpus_refused(corpus, tmp_path):
    outside = tmp_path / "secret.txt"
    outside.write_text("secret\n")
    os.symlink(outside, corpus / "src" / "link.txt")
    with pytest.raises(SealError) as e:
        do_seal(corpus, tmp_path)
    assert "leads out of the corpus" in str(e.value)


@pytest.fixture
def arm_corpus(tmp_path):
    c = tmp_path / "armcorpus"
    write(c, "CLAUDE.md", "instructions\n")
    write(c, "sub/CLAUDE.md", "more instructions\n")
    write(c, ".claude/skills/s1/SKILL.md", "a skill\n")
    write(c, ".claude/hooks/pre.sh", "#!/bin/sh\n")
    write(c, ".mcp.json", json.dumps({"mcpServers": {"zeta": {}, "alpha": {}}}))
    write(c, ".claude/settings.json", json.dumps({"hooks": {"PreToolUse": []}, "permissions": {"allow": ["Read"]}, "model": "x"}))
    write(c, "doc.md", "body\n")
    return c


def settings_of(ws):
    return json.loads((ws.path / ".claude/settings.json").read_text())


def test_arm_present_keeps_everything(arm_corpus, tmp_path):
    ws = do_seal(arm_corpus, tmp_path, "present")
    assert files(ws.path) == files(arm_corpus)
    assert "hooks" in settings_of(ws)
    assert ws.mcp_servers == ["alpha", "zeta"]


def test_arm_absent(arm_corpus, tmp_path):
    ws = do_seal(arm_corpus, tmp_path, "absent")
    assert files(ws.path) == {".claude/settings.json", "doc.md"}
    assert settings_of(ws) == {"permissions": {"allow": ["Read"]}, "model": "x"}
    assert ws.mcp_servers == []
    # the manifest describes the bytes the session starts with (hooks already removed)
    assert ws.manifest[".claude/settings.json"] == digest.of_file(ws.path / ".claude/settings.json")


def test_arm_no_hook(arm_corpus, tmp_path):
    ws = do_seal(arm_corpus, tmp_path, "no-hook")
    assert files(ws.path) == {"CLAUDE.md", "sub/CLAUDE.md", ".claude/skills/s1/SKILL.md", ".mcp.json", ".claude/settings.json", "doc.md"}
    assert settings_of(ws) == {"permissions": {"allow": ["Read"]}, "model": "x"}
    assert ws.mcp_servers == ["alpha", "zeta"]


def test_arm_mcp(arm_corpus, tmp_path):
    ws = do_seal(arm_corpus, tmp_path, "mcp")
    assert files(ws.path) == {".mcp.json", ".claude/settings.json", "doc.md"}
    assert settings_of(ws) == {"permissions": {"allow": ["Read"]}, "model": "x"}
    assert ws.mcp_servers == ["alpha", "zeta"]
