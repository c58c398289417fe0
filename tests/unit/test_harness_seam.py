"""The harness seam (issue 30, item 1: "Done when a version bump is one package plus its
fixtures"): a fake next version of the CLI (tests/support/harness_next.py), put in place as
``runner.harnesses.HARNESS`` and nowhere else, reaches every place the run path used to know
the CLI itself: the version doctor wants, both executors' command lines and environments, the
stream parser and the transform's reading of it, the arm that removes memory files, what the
gateway lets through. Each test also shows the current version refusing or missing what the
next one brings, so none of them can pass without the seam."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from runner import doctor, harnesses
from runner.errors import UserError
from runner.executors.local import harness_argv, harness_env
from runner.gateway import policy
from runner.k8s import manifests
from runner.plan import parse_plan
from runner.seal import seal
from runner.settings import GatewaySettings, Settings
from runner.transform.events import SessionFacts, session_event
from tests.support import harness_next
from tests.support.harness_next import NEXT

CAPTURE = Path(__file__).parents[1] / "data" / "claude-code-2.1.197" / "read-write-answer.jsonl"
D = "sha256:" + "a" * 64


@pytest.fixture
def next_version(monkeypatch):
    monkeypatch.setattr(harnesses, "HARNESS", NEXT)


def plan():
    return parse_plan({
        "campaign": "c1", "tier": "regression", "model": "claude-sonnet-4-5",
        "identity": {"lock": D, "tree": D, "selection": D, "read_set": D, "seed": 1, "harness": "h"},
        "arms": ["present", "no-claude-md"], "repetitions": 1, "identifier_pattern": r"HW-DR-\d{4}",
        "probes": [{"id": "HW-PR-0001", "path": "docs/probes/status.md", "title": "The status probe",
                    "task": "Say the status.", "answers": ["current HW-DR-0052"]}],
    })


def _fake_cli(tmp_path: Path, version: str) -> str:
    exe = tmp_path / "claude"
    exe.write_text(f"#!/bin/sh\necho '{version} (Claude Code)'\n")
    exe.chmod(0o755)
    return str(exe)


def test_doctor_wants_the_version_of_the_harness_in_use(tmp_path, next_version):
    settings = Settings(store="file:///tmp/s", harness={"command": _fake_cli(tmp_path, "2.2.0")})
    assert doctor._harness_version(settings).endswith("is 2.2.0, the pinned version")
    old = Settings(store="file:///tmp/s", harness={"command": _fake_cli(tmp_path, "2.1.197")})
    with pytest.raises(UserError, match=re.escape("qualified with 2.2.0 (pinned 2.2.0): npm install -g @anthropic-ai/claude-code@2.2.0")):
        doctor._harness_version(old)


def test_both_executors_run_the_command_line_and_environment_of_the_harness_in_use(monkeypatch):
    settings = Settings(store="file:///tmp/s")
    route = manifests.Route("http://10.96.0.20:8080", token="prt1.claims.mac")
    before = (harness_argv(plan(), settings), harness_env(settings),
              manifests.session_pod(settings, plan(), "HW-PR-0001", "present-001", 1, "task", route))
    assert harness_next.FLAG not in before[0] and "CLAUDE_CODE_STRICT_STREAM" not in before[1]
    monkeypatch.setattr(harnesses, "HARNESS", NEXT)
    argv, env = harness_argv(plan(), settings), harness_env(settings)
    assert argv == [*before[0], harness_next.FLAG]
    assert env == {**before[1], "CLAUDE_CODE_STRICT_STREAM": "1"}
    pod = manifests.session_pod(settings, plan(), "HW-PR-0001", "present-001", 1, "task", route)
    harness = pod["spec"]["containers"][1]
    assert harness["args"] == [*before[2]["spec"]["containers"][1]["args"], harness_next.FLAG]
    names = [e["name"] for e in harness["env"]]
    probe = ["PROBE_TASK", "PROBE_SOCKET_DIR", "PROBE_TIMEOUT_SECONDS"]  # the entry point's own, last
    assert names == [e["name"] for e in before[2]["spec"]["containers"][1]["env"]][:-3] + ["CLAUDE_CODE_STRICT_STREAM"] + probe
    assert {"name": "CLAUDE_CODE_STRICT_STREAM", "value": "1"} in harness["env"]


def _event(parsed):
    facts = SessionFacts(probe="HW-PR-0001", session="present-001", workspace="/workspace", config_dir="/session/config",
                         manifest={}, final_file=lambda rel: None, identifiers=frozenset())
    return session_event(parsed, facts, ["current HW-DR-0052"], re.compile(r"HW-DR-\d{4}"))


def test_the_transform_reads_the_stream_of_the_harness_in_use(next_version):
    """The same session written by 2.2.0 is the same observation: the same calls, results, cost
    and event; 2.1.197's parser finds no init line in it (so the bump needs the package)."""
    old_lines = CAPTURE.read_bytes().splitlines(keepends=True)
    new_lines = harness_next.from_2_1_197(old_lines)
    assert not [raw for raw in new_lines if json.loads(raw).get("subtype") == "init" or b'"tool_use_result"' in raw]
    old = harnesses.CLAUDE_CODE.parse(old_lines, False)
    new = harnesses.HARNESS.parse(new_lines, False)
    assert old.complete and new.complete
    assert (new.tool_uses, new.results, new.cost_usd, new.served_models) == (old.tool_uses, old.results, old.cost_usd, old.served_models)
    assert _event(new).event == _event(old).event is not None
    assert "the stream has no init line, so it does not state what the session loaded" in harnesses.CLAUDE_CODE.parse(new_lines, False).problems


def test_the_memory_arm_removes_the_memory_files_of_the_harness_in_use(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    for rel, text in {"docs/probes/status.md": "# The status probe\nid HW-PR-0001\n", "CLAUDE.md": "memory\n",
                      "AGENTS.md": "memory too\n", "docs/plain.md": "plain\n"}.items():
        (corpus / rel).parent.mkdir(parents=True, exist_ok=True)
        (corpus / rel).write_text(text)
    p = plan()

    def kept(dest: str) -> set[str]:
        return set(seal(corpus, p, p.probes[0], "no-claude-md", tmp_path / dest).manifest)

    assert kept("before") == {"AGENTS.md", "docs/plain.md"}
    monkeypatch.setattr(harnesses, "HARNESS", NEXT)
    assert kept("after") == {"docs/plain.md"}


def test_the_gateway_lets_through_what_the_harness_in_use_sends(monkeypatch):
    body = json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}).encode()
    with pytest.raises(policy.Refused, match="is not qualified"):
        policy.check(GatewaySettings(), None, body, harness_next.BETA, "", False)
    monkeypatch.setattr(harnesses, "HARNESS", NEXT)
    settings = GatewaySettings()  # the harness's table classes the betas: nothing for an operator to add
    assert settings.betas == []
    assert policy.check(settings, None, body, harness_next.BETA, "", False).model == "claude-sonnet-4-5"


def test_a_version_bump_touches_one_package():
    """Nothing outside runner/harnesses/ states the CLI's version, its stream's words or its
    configuration's names (prose may cite what was measured with it): a bump has nowhere else to go (the import contract holds the imports)."""
    root = Path(__file__).parents[2] / "runner"
    needles = [f'"{harnesses.CLAUDE_CODE.version}"', '"tool_use_result"', '"CLAUDE_CONFIG_DIR"', '"ANTHROPIC_API_KEY"',
               '"ANTHROPIC_BASE_URL"', '"api_retry"', '"error_max_turns"', '"error_max_budget_usd"', '"x-claude-code-session-id"',
               '"NODE_EXTRA_CA_CERTS"', '"--max-budget-usd"', '"total_cost_usd"', '"--allowedTools"', '".credentials.json"',
               '"claude"', '"Bash"', '"mcp__"']
    # the scripted provider plays the provider's side of the CLI's calls: test infrastructure shipped for the demo
    found = {str(p.relative_to(root)): n for p in root.rglob("*.py")
             if "harnesses" not in p.parts and p != root / "demo" / "provider.py"
             for n in needles if n in p.read_text()}
    assert found == {}
