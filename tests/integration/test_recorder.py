"""The whole recorder against the real Claude Code CLI: plan -> sealed sessions under bwrap ->
stdout in the store -> transform -> transcripts confirmed as the engine would.

One campaign holds one probe per rule under test (each probe's task selects its scenario), so
the CLI runs once per rule. Rules whose trigger our driver forbids by construction (plugins,
MCP servers from flags, bypassPermissions) are provoked by running the real CLI directly with
those flags and handing its stream to the transform.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from local_run import run_local
from pydantic import SecretStr

from runner import digest, layout
from runner.harnesses.claude_code import stream
from runner.plan import parse_plan
from runner.settings import Settings
from runner.store.file import FileStore
from runner.transform.events import SessionFacts, session_event
from runner.transform.run import run_transform
from runner.transform.transcript import parse as parse_transcript

IDENT = re.compile("HW-[A-Z]+-[0-9]{4}")
DOC_A = "# HW-DR-0052\n\nStatus: current.\n"
ANSWERS = ["current HW-DR-0052", "superseded HW-DR-0052"]


def _probe(pid: str, task: str, answers=ANSWERS) -> dict:
    return {"id": pid, "path": f"docs/probes/{pid}.md", "title": f"Probe {pid}", "task": task,
            "answers": answers, "examines": ["docs/a.md"]}


SCENARIOS = {"scenarios": [
    {"name": "read", "match": "TASK-READ", "turns": [
        {"tool_uses": [{"name": "Read", "input": {"file_path": "{cwd}/docs/a.md"}}]},
        {"tool_uses": [{"name": "Grep", "input": {"pattern": "Status", "path": "{cwd}/docs"}}]},
        {"text": "The file states it on its own line.\nHW-DR-0052 current."}]},
    {"name": "write", "match": "TASK-WRITE", "turns": [
        {"tool_uses": [{"name": "Write", "input": {"file_path": "{cwd}/out/w.md", "content": "Cites HW-DR-0061.\n"}}]},
        {"tool_uses": [{"name": "Read", "input": {"file_path": "{cwd}/docs/a.md"}}]},
        {"tool_uses": [{"name": "Edit", "input": {"file_path": "{cwd}/docs/a.md", "old_string": "current", "new_string": "current, see HW-DR-0099"}}]},
        {"tool_uses": [{"name": "MultiEdit", "input": {"file_path": "{cwd}/docs/m.md", "edits": []}}]},
        {"text": "**current** HW-DR-0052"}]},
    {"name": "bash", "match": "TASK-BASH", "turns": [
        {"tool_uses": [{"name": "Bash", "input": {"command": "echo HW-DR-0061 > report.txt"}}]},
        {"text": "0052 current HW-DR-0052"}]},
    {"name": "nocall", "match": "TASK-NOCALL", "turns": [{"text": "current hw-dr-0052"}]},
    {"name": "outside", "match": "TASK-OUTSIDE", "turns": [
        {"tool_uses": [{"name": "Read", "input": {"file_path": "/etc/hostname"}}]},
        {"tool_uses": [{"name": "Bash", "input": {"command": "cat /etc/os-release | head -1"}}]},
        {"text": "I do not know."}]},
    {"name": "memory", "match": "TASK-MEMORY", "turns": [{"text": "current HW-DR-0052"}]},
]}


def _run_campaign(root: Path, name: str, probes: list[dict], claude_command, extra_files=None):
    corpus = root / f"corpus-{name}"
    (corpus / "docs/probes").mkdir(parents=True)
    (corpus / "docs/a.md").write_text(DOC_A)
    for p in probes:
        (corpus / p["path"]).write_text(f"# {p['title']}\n\n## Task\n\n{p['task']}\n")
    for rel, content in (extra_files or {}).items():
        (corpus / rel).parent.mkdir(parents=True, exist_ok=True)
        (corpus / rel).write_text(content)
    plan = parse_plan({
        "campaign": name, "tier": "regression", "model": "claude-sonnet-4-5",
        "identity": {k: "sha256:" + c * 64 for k, c in (("lock", "1"), ("tree", "2"), ("selection", "3"), ("read_set", "4"))}
        | {"seed": 7, "harness": "headwater 0.9.1"},
        "arms": ["present"], "repetitions": 1, "identifier_pattern": IDENT.pattern, "probes": probes,
    })
    store = FileStore(root / "store")
    from runner.demo.provider import ScriptedProvider

    with ScriptedProvider(SCENARIOS) as provider:
        settings = Settings(
            store=store.uri, concurrency=2,
            provider={"base_url": provider.base_url, "api_key": SecretStr("test-key")},
            harness={"command": claude_command[0], "env": {"CLAUDE_CODE_MAX_RETRIES": "2"}, "timeout_seconds": 120},
            local={"workdir": root / "work"},
        )
        run_local(plan, corpus, store, settings, 2, ["report.txt"])
    report = run_transform(store, plan)
    key = layout.transcript_key(name, "regression", "present")
    text = store.get(key).decode() if store.exists(key) else ""
    events = {e["probe"]: e for e in parse_transcript(text).events} if text else {}
    return {"store": store, "plan": plan, "report": report, "text": text, "events": events, "name": name}


@pytest.fixture(scope="module")
def campaign(tmp_path_factory, claude_command):
    probes = [
        _probe("HW-PRB-0001", "TASK-READ: state the status."),
        _probe("HW-PRB-0002", "TASK-WRITE: write and edit."),
        _probe("HW-PRB-0003", "TASK-BASH: write through the shell."),
        _probe("HW-PRB-0004", "TASK-NOCALL: answer at once."),
        _probe("HW-PRB-0005", "TASK-OUTSIDE: look around.", answers=[]),
    ]
    return _run_campaign(tmp_path_factory.mktemp("recorder"), "itest", probes, claude_command)


@pytest.fixture(scope="module")
def memory_campaign(tmp_path_factory, claude_command):
    # A workspace setting that moves the auto-memory directory out of the configuration dir.
    files = {".claude/settings.local.json": json.dumps({"autoMemoryDirectory": "/tmp/elsewhere-memory"})}
    return _run_campaign(tmp_path_factory.mktemp("memory"), "imemory",
                         [_probe("HW-PRB-0006", "TASK-MEMORY: a workspace that moves memory.")], claude_command, files)


def test_reads_are_document_digests_and_the_answer_is_the_final_line(campaign):
    e = campaign["events"]["HW-PRB-0001"]
    assert e["calls"][0] == {"tool": "Read", "argument": "docs/a.md", "result": digest.of_text(DOC_A)}
    assert e["calls"][1]["tool"] == "Grep" and e["calls"][1]["argument"] == "Status docs"  # the pattern and what it searched
    assert e["produced"] == []
    assert e["answer"] == "current HW-DR-0052"  # word order, case and the trailing period do not matter


def test_structured_writes_are_produced_once_with_digest_and_cites(campaign):
    e = campaign["events"]["HW-PRB-0002"]
    assert [c["tool"] for c in e["calls"]] == ["Write", "Read", "Edit", "MultiEdit"]
    produced = {p["path"]: p for p in e["produced"]}
    # MultiEdit does not exist in this CLI: the call is in the log, it failed, and produced nothing.
    assert list(produced) == ["out/w.md", "docs/a.md"]
    # HW-DR-0061 and HW-DR-0099 are identifiers no file of this corpus carries: not cited
    assert produced["out/w.md"] == {"path": "out/w.md", "result": digest.of_text("Cites HW-DR-0061.\n"), "cites": []}
    edited = DOC_A.replace("current", "current, see HW-DR-0099")
    assert produced["docs/a.md"] == {"path": "docs/a.md", "result": digest.of_text(edited), "cites": ["HW-DR-0052"]}
    assert all("findings" not in p for p in e["produced"])  # nothing checked them
    assert e["answer"] is None  # Markdown emphasis is part of the word


def test_a_bash_write_is_produced_only_because_the_driver_named_it(campaign):
    e = campaign["events"]["HW-PRB-0003"]
    assert e["calls"][0]["argument"] == "echo HW-DR-0061 > report.txt"
    assert e["produced"] == [{"path": "report.txt", "result": digest.of_text("HW-DR-0061\n"), "cites": []}]
    assert e["answer"] is None  # an extra word gives no value


def test_a_session_with_no_calls_records_empty_lists(campaign):
    e = campaign["events"]["HW-PRB-0004"]
    assert e == {"probe": "HW-PRB-0004", "session": "present-001", "calls": [], "produced": [], "answer": "current HW-DR-0052"}


def test_paths_outside_the_workspace_are_counted_in_prose(campaign):
    e = campaign["events"]["HW-PRB-0005"]
    assert e["calls"][0]["argument"] == "/etc/hostname"
    assert e["answer"] is None  # the probe declares no answers: watched, so null
    assert "HW-PRB-0005 present-001: 2" in campaign["text"]


def test_a_memory_path_outside_the_configuration_directory_is_refused(memory_campaign):
    assert memory_campaign["events"] == {}
    reasons = [r["reason"] for r in memory_campaign["report"].refusals if r.get("probe") == "HW-PRB-0006"]
    assert any("memory path '/tmp/elsewhere-memory/'" in r for r in reasons), reasons
    stored = json.loads(memory_campaign["store"].get(layout.refusals_key("imemory")))
    assert any(r.get("probe") == "HW-PRB-0006" for r in stored["refusals"])


def test_identity_and_cost(campaign):
    text = campaign["text"]
    identity = yaml.safe_load(text.split("## Run identity")[1].split("```yaml")[1].split("```")[0])
    assert list(identity) == ["model", "served_version", "tree", "lock", "selection", "read_set", "seed",
                              "harness", "tier", "arm", "at", "cost_cents"]
    store, plan = campaign["store"], campaign["plan"]
    total = Decimal(0)
    for spec in plan.sessions():
        parsed = stream.parse(store.iter_lines(layout.SessionKeys("itest", spec.probe, spec.name).stream))
        total += parsed.cost_usd
    assert identity["cost_cents"] == int((total * 100).to_integral_value(rounding="ROUND_CEILING"))
    assert "Network egress was not confined" in text
    assert "does not compare with a rate from those batches" in text


def test_only_the_memory_probe_loaded_a_foreign_setting(campaign):
    for probe in ("HW-PRB-0001", "HW-PRB-0004"):
        line = campaign["store"].get(layout.SessionKeys("itest", probe, "present-001").stream).split(b"\n")[0]
        init = json.loads(line)
        # builtin plugins (2.1.337 lists four, "<name>@builtin" at path "builtin") are the CLI's own
        assert init["permissionMode"] == "dontAsk" and [p for p in init["plugins"] if p.get("path") != "builtin"] == []


# --- rules the driver forbids by construction: the real CLI run directly with the trigger ---

def _direct(claude_command, provider_url, tmp_path, extra_args, extra_env=None, files=None):
    ws, cfg = tmp_path / "ws", tmp_path / "cfg"
    ws.mkdir()
    cfg.mkdir()
    for rel, content in (files or {}).items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(content)
    env = {"PATH": os.environ["PATH"], "HOME": str(cfg), "CLAUDE_CONFIG_DIR": str(cfg), "ANTHROPIC_API_KEY": "k",
           "ANTHROPIC_BASE_URL": provider_url, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", **(extra_env or {})}
    out = subprocess.run([*claude_command, "-p", "TASK-NOCALL", "--output-format", "stream-json", "--verbose",
                          "--setting-sources", "project,local", *extra_args],
                         cwd=ws, env=env, capture_output=True, timeout=120)
    parsed = stream.parse(out.stdout.splitlines(keepends=True))
    facts = SessionFacts(probe="HW-PRB-0004", session="present-001", workspace=str(ws), config_dir=str(cfg),
                         manifest={}, final_file=lambda rel: None, identifiers=frozenset(),
                         declared_mcp_servers=frozenset(json.loads((files or {}).get(".mcp.json", '{"mcpServers": {}}'))["mcpServers"]))
    return session_event(parsed, facts, ANSWERS, IDENT)


@pytest.fixture
def provider_url(scripted_provider):
    return scripted_provider(SCENARIOS).base_url


def test_bypass_permissions_is_refused(claude_command, provider_url, tmp_path):
    out = _direct(claude_command, provider_url, tmp_path, ["--permission-mode", "bypassPermissions"], {"IS_SANDBOX": "1"})
    assert out.event is None
    assert any("bypassPermissions" in r for r in out.refusals), out.refusals


def test_a_plugin_is_refused(claude_command, provider_url, tmp_path):
    plugin = tmp_path / "plug"
    (plugin / ".claude-plugin").mkdir(parents=True)
    (plugin / ".claude-plugin/plugin.json").write_text('{"name": "localplug"}')
    out = _direct(claude_command, provider_url, tmp_path, ["--permission-mode", "dontAsk", "--plugin-dir", str(plugin)])
    assert out.event is None
    assert any("plugin 'localplug'" in r and "not builtin" in r for r in out.refusals), out.refusals


def test_an_undeclared_mcp_server_is_refused_and_a_declared_one_is_not(claude_command, provider_url, tmp_path):
    server = {"command": "python3", "args": ["-c", "import sys; sys.stdin.read()"]}
    declared = json.dumps({"mcpServers": {"declared": server}})
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps({"mcpServers": {"extra": server}}))
    out = _direct(claude_command, provider_url, tmp_path, ["--permission-mode", "dontAsk", "--mcp-config", str(extra)],
                  files={".mcp.json": declared})
    assert out.event is None
    assert any("MCP server 'extra'" in r for r in out.refusals), out.refusals
    assert not any("'declared'" in r for r in out.refusals), out.refusals


def test_the_transform_in_parallel_processes_makes_the_same_bytes(campaign, monkeypatch):
    """Issue 17: the streams parsed by a pool of spawned processes give the transcripts and
    refusals of one process, byte for byte."""
    from concurrent.futures import ProcessPoolExecutor

    from runner.transform import run as transform_run

    pools = []

    class Counted(ProcessPoolExecutor):
        def __init__(self, *a, **kw):
            pools.append(a[0] if a else kw.get("max_workers"))
            super().__init__(*a, **kw)

    one = transform_run.transform_campaign(campaign["store"], campaign["plan"])
    monkeypatch.setattr(transform_run, "ProcessPoolExecutor", Counted)
    done: list[tuple[int, int]] = []
    two = transform_run.transform_campaign(campaign["store"], campaign["plan"], lambda n, total: done.append((n, total)), workers=2)
    assert pools == [2]
    assert two.transcripts == one.transcripts and two.transcripts["present"] == campaign["text"]
    assert two.report.refusals == one.report.refusals
    assert [(r.spec, r.outcome, r.recorded) for r in two.sessions] == [(r.spec, r.outcome, r.recorded) for r in one.sessions]
    assert done == [(n, 5) for n in range(1, 6)]


def test_a_transform_process_that_dies_is_one_clear_error_and_nothing_is_written(campaign):
    from local_run import DyingInPool

    from runner.errors import UserError

    store = DyingInPool(campaign["store"].root)
    before = {k: store.get(k) for k in store.list(layout.transcripts_prefix("itest"))}
    with pytest.raises(UserError, match="a transform process died .* RUNNER_TRANSFORM__WORKERS=1"):
        run_transform(store, campaign["plan"], workers=2)
    assert {k: store.get(k) for k in store.list(layout.transcripts_prefix("itest"))} == before
