"""The scripted provider, exercised by the real Claude Code CLI.

Each CLI run uses the harness invocation of docs/design.md ("The harness"): ``-p`` with
stream-json, ``--setting-sources project,local``, ``--permission-mode dontAsk``, the allowed
and disallowed tool lists, an environment cleared except PATH/HOME/CLAUDE_CONFIG_DIR (a fresh
directory), a dummy key, ``ANTHROPIC_BASE_URL`` pointing at the provider and
``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1``. A run takes one to three seconds.

The last group pins down how 2.1.197 reports things the recorder must refuse (bypass mode,
non-builtin plugins, MCP servers, workspace skills, memory outside the config directory,
hooks before the init line), with the exact recipe that makes the real CLI produce each.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runner.demo.provider import (
    AUXILIARY_TEXT,
    ScenarioError,
    ScriptedProvider,
    load_scenarios,
)

SERVED_MODEL = "claude-sonnet-4-5-20250929"
ALLOWED = ["Read", "Grep", "Glob", "Edit", "Write", "MultiEdit", "Bash"]


# --------------------------------------------------------------------------------------
# Running the CLI
# --------------------------------------------------------------------------------------


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    lines: list[dict[str, Any]]
    workspace: Path
    config_dir: Path

    def of(self, type_: str, subtype: str | None = None) -> list[dict[str, Any]]:
        return [
            l for l in self.lines
            if l.get("type") == type_ and (subtype is None or l.get("subtype") == subtype)
        ]

    @property
    def init(self) -> dict[str, Any]:
        inits = self.of("system", "init")
        assert len(inits) == 1, f"expected one init line:\n{self.stdout}\n{self.stderr}"
        return inits[0]

    @property
    def result(self) -> dict[str, Any]:
        results = self.of("result")
        assert len(results) == 1, f"expected one result line:\n{self.stdout}\n{self.stderr}"
        return results[0]

    def tool_uses(self) -> list[dict[str, Any]]:
        return [
            b for l in self.of("assistant") for b in l["message"]["content"]
            if b.get("type") == "tool_use"
        ]

    def tool_results(self) -> dict[str, dict[str, Any]]:
        return {
            b["tool_use_id"]: b for l in self.of("user")
            for b in (l["message"]["content"] if isinstance(l["message"]["content"], list) else [])
            if isinstance(b, dict) and b.get("type") == "tool_result"
        }

    def texts(self) -> list[str]:
        return [
            b["text"] for l in self.of("assistant") for b in l["message"]["content"]
            if b.get("type") == "text"
        ]


def run_claude(
    command: list[str],
    provider: ScriptedProvider,
    tmp_path: Path,
    task: str = "What is the status?",
    *,
    workspace_name: str = "workspace",
    setup: Callable[[Path, Path], None] | None = None,
    mode: tuple[str, ...] = ("--permission-mode", "dontAsk"),
    extra_args: tuple[str, ...] = (),
    extra_env: dict[str, str | None] | None = None,
    timeout: float = 30,
) -> Run:
    workspace = tmp_path / workspace_name
    config_dir = tmp_path / "config"
    workspace.mkdir(parents=True, exist_ok=True)
    config_dir.mkdir(parents=True, exist_ok=True)
    if setup is not None:
        setup(workspace, config_dir)
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(config_dir),
        "CLAUDE_CONFIG_DIR": str(config_dir),
        "ANTHROPIC_API_KEY": "dummy",
        "ANTHROPIC_BASE_URL": provider.base_url,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        # Bound a failing run: the default is 10 retries with exponential back-off.
        "CLAUDE_CODE_MAX_RETRIES": "3",
        **(extra_env or {}),
    }
    env = {k: v for k, v in env.items() if v is not None}  # None: leave the variable unset
    argv = [
        *command, "-p", task, "--output-format", "stream-json", "--verbose",
        "--setting-sources", "project,local", *mode,
        "--allowedTools", *ALLOWED, "--disallowedTools", "WebSearch", "WebFetch",
        *extra_args,
    ]
    proc = subprocess.run(
        argv, cwd=workspace, env=env, capture_output=True, text=True, timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    lines = []
    for raw in proc.stdout.splitlines():
        if raw.strip():
            lines.append(json.loads(raw))
    return Run(proc.returncode, proc.stdout, proc.stderr, lines, workspace, config_dir)


def _read_write_answer_doc() -> dict[str, Any]:
    return {"scenarios": [{
        "name": "read-write-answer",
        "model": SERVED_MODEL,
        "usage": {"input_tokens": 100, "output_tokens": 20},
        "turns": [
            {"tool_uses": [{"name": "Read", "input": {"file_path": "{cwd}/docs/a.md"}}]},
            {"tool_uses": [{"name": "Write",
                            "input": {"file_path": "{cwd}/out.md",
                                      "content": "Cites HW-DR-0052.\n"}}]},
            {"text": "The status is below.\nHW-DR-0052 current."},
        ],
    }]}


def _docs(workspace: Path, _config: Path) -> None:
    (workspace / "docs").mkdir()
    (workspace / "docs" / "a.md").write_text("# doc HW-DR-0052\n")


# --------------------------------------------------------------------------------------
# The real CLI against the provider
# --------------------------------------------------------------------------------------


def test_read_write_answer(claude_command, claude_version, scripted_provider, tmp_path):
    provider = scripted_provider(_read_write_answer_doc())
    run = run_claude(claude_command, provider, tmp_path, setup=_docs)
    assert run.returncode == 0, run.stderr

    assert run.lines[0]["type"] == "system" and run.lines[0]["subtype"] == "init"
    init = run.init
    assert init["claude_code_version"] == claude_version
    assert Path(init["cwd"]).resolve() == run.workspace.resolve()
    assert init["permissionMode"] == "dontAsk"
    # 2.1.337 lists its builtin plugins ("<name>@builtin" at path "builtin"); 2.1.197 none
    assert [p for p in init["plugins"] if p.get("path") != "builtin"] == [] and init["mcp_servers"] == []
    assert "MultiEdit" not in init["tools"]  # absent from 2.1.x tool lists

    uses = run.tool_uses()
    assert [u["name"] for u in uses] == ["Read", "Write"]
    ws = str(run.workspace)
    assert uses[0]["input"] == {"file_path": f"{ws}/docs/a.md"}
    assert uses[1]["input"]["file_path"] == f"{ws}/out.md"
    results = run.tool_results()
    assert "HW-DR-0052" in str(results[uses[0]["id"]]["content"])
    assert not results[uses[1]["id"]].get("is_error")
    assert (run.workspace / "out.md").read_text() == "Cites HW-DR-0052.\n"

    for line in run.of("assistant"):
        assert line["message"]["model"] == SERVED_MODEL
        assert line["message"]["usage"]["input_tokens"] == 100
        assert line["message"]["usage"]["output_tokens"] == 20
    assert run.texts() == ["The status is below.\nHW-DR-0052 current."]

    result = run.result
    assert run.lines[-1] is result
    assert result["subtype"] == "success" and result["is_error"] is False
    assert result["result"] == "The status is below.\nHW-DR-0052 current."
    assert result["num_turns"] == 3
    assert isinstance(result["total_cost_usd"], float) and result["total_cost_usd"] > 0
    assert result["usage"]["input_tokens"] == 300 and result["usage"]["output_tokens"] == 60
    assert result["modelUsage"], result
    assert sum(m["costUSD"] for m in result["modelUsage"].values()) == pytest.approx(
        result["total_cost_usd"])

    main = provider.main_loop_requests()
    assert [r["turn"] for r in main] == [0, 1, 2]
    assert all(r["cwd"] == ws for r in main)
    assert provider.unknown_paths == []
    recorded = [json.loads(l) for l in provider.record_path.read_text().splitlines()]
    assert len(recorded) == len(provider.requests)
    for rec in recorded:
        assert "x-api-key" not in rec["headers"] and "authorization" not in rec["headers"]


def test_every_edit_tool_and_bash(claude_command, scripted_provider, tmp_path):
    """Edit and Bash run for real; MultiEdit does not exist in 2.1.197 (an error result)."""
    doc = {"scenarios": [{"name": "tools", "turns": [
        {"tool_uses": [{"name": "Write", "input": {"file_path": "{cwd}/f.md",
                                                   "content": "one\ntwo\n"}}]},
        {"tool_uses": [{"name": "Edit", "input": {"file_path": "{cwd}/f.md",
                                                  "old_string": "one", "new_string": "ONE"}}]},
        {"tool_uses": [{"name": "MultiEdit", "input": {
            "file_path": "{cwd}/f.md", "edits": [{"old_string": "two", "new_string": "TWO"}]}}]},
        {"tool_uses": [{"name": "Bash", "input": {"command": "cat f.md", "description": "show"}},
                       {"name": "Grep", "input": {"pattern": "ONE", "path": "{cwd}"}}]},
        {"text": "Done."},
    ]}]}
    provider = scripted_provider(doc)
    run = run_claude(claude_command, provider, tmp_path)
    assert run.returncode == 0, run.stderr
    uses = run.tool_uses()
    assert [u["name"] for u in uses] == ["Write", "Edit", "MultiEdit", "Bash", "Grep"]
    results = run.tool_results()
    multi = results[uses[2]["id"]]
    assert multi["is_error"] is True
    assert "No such tool available: MultiEdit" in str(multi["content"])
    assert results[uses[3]["id"]]["content"] == "ONE\ntwo"
    assert (run.workspace / "f.md").read_text() == "ONE\ntwo\n"
    assert run.result["subtype"] == "success" and run.result["result"] == "Done."


def test_error_turn_is_retried_and_session_completes(claude_command, scripted_provider, tmp_path):
    doc = {"scenarios": [{"name": "rate-limited", "turns": [
        {"tool_uses": [{"name": "Read", "input": {"file_path": "{cwd}/docs/a.md"}}]},
        {"error": {"status": 429, "type": "rate_limit_error", "message": "slow down"},
         "times": 1},
        {"text": "Answer after a retry."},
    ]}]}
    provider = scripted_provider(doc)
    run = run_claude(claude_command, provider, tmp_path, setup=_docs)
    assert run.returncode == 0, run.stderr
    retries = run.of("system", "api_retry")
    assert len(retries) == 1
    assert retries[0]["error_status"] == 429 and retries[0]["error"] == "rate_limit"
    assert retries[0]["attempt"] == 1 and retries[0]["max_retries"] == 3
    # The retry line comes after the Read's result and before the final answer.
    kinds = [(l["type"], l.get("subtype")) for l in run.lines]
    assert kinds.index(("system", "api_retry")) > kinds.index(("user", None))
    assert run.texts() == ["Answer after a retry."]
    assert run.result["subtype"] == "success" and run.result["is_error"] is False
    assert run.result["result"] == "Answer after a retry."

    main = provider.main_loop_requests()
    assert [(r["assistant_messages"], r["status"]) for r in main] == [(0, 200), (1, 429), (1, 200)]


def test_errors_beyond_the_retry_budget_end_the_session(claude_command, scripted_provider,
                                                       tmp_path):
    """A failed API call ends as subtype success with is_error true (a synthetic message)."""
    doc = {"scenarios": [{"name": "down", "turns": [
        {"error": {"status": 429, "message": "slow down"}, "times": 5},
        {"text": "never"},
    ]}]}
    provider = scripted_provider(doc)
    run = run_claude(claude_command, provider, tmp_path,
                     extra_env={"CLAUDE_CODE_MAX_RETRIES": "1"})
    assert run.returncode == 1
    assert len(run.of("system", "api_retry")) == 1
    assert run.of("assistant")[-1]["message"]["model"] == "<synthetic>"
    result = run.result
    assert result["subtype"] == "success" and result["is_error"] is True
    assert result["api_error_status"] == 429
    assert "slow down" in result["result"]


def test_no_tool_call_and_scenario_matching(claude_command, scripted_provider, tmp_path):
    doc = {"scenarios": [
        {"name": "default", "turns": [{"text": "default scenario"}]},
        {"name": "plain", "match": "Say hello", "model": SERVED_MODEL,
         "turns": [{"text": "Hello."}]},
    ]}
    provider = scripted_provider(doc)
    run = run_claude(claude_command, provider, tmp_path, task="Say hello, please.")
    assert run.returncode == 0, run.stderr
    assert run.tool_uses() == []
    assert run.texts() == ["Hello."]
    assert run.result["num_turns"] == 1 and run.result["result"] == "Hello."
    assert [r["scenario"] for r in provider.main_loop_requests()] == ["plain"]


def test_cwd_templating_with_a_space_in_the_path(claude_command, scripted_provider, tmp_path):
    doc = {"scenarios": [{"name": "cwd", "turns": [
        {"tool_uses": [
            {"name": "Read", "input": {"file_path": "{cwd}/notes/n.txt"}},
            {"name": "Bash", "input": {"command": "ls '{cwd}/notes'", "description": "list"}},
        ]},
        {"text": "seen {cwd} verbatim in text"},
    ]}]}

    def setup(ws: Path, _cfg: Path) -> None:
        (ws / "notes").mkdir()
        (ws / "notes" / "n.txt").write_text("templated\n")

    provider = scripted_provider(doc)
    run = run_claude(claude_command, provider, tmp_path, workspace_name="work space", setup=setup)
    assert run.returncode == 0, run.stderr
    ws = str(run.workspace)
    read, bash = run.tool_uses()
    assert read["input"]["file_path"] == f"{ws}/notes/n.txt"
    assert bash["input"]["command"] == f"ls '{ws}/notes'"
    results = run.tool_results()
    assert "templated" in str(results[read["id"]]["content"])
    assert results[bash["id"]]["content"] == "n.txt"
    # Only tool inputs are templated; the final text is sent as written.
    assert run.texts() == ["seen {cwd} verbatim in text"]


def test_title_side_query_does_not_disturb_the_scenario(claude_command, scripted_provider,
                                                       tmp_path):
    """Without DISABLE_NONESSENTIAL_TRAFFIC, 2.1.197 also asks for a session title (2.1.337 -p
    was not seen asking for one, but preconnects with ``HEAD /api/hello``)."""
    provider = scripted_provider(_read_write_answer_doc())
    run = run_claude(claude_command, provider, tmp_path, setup=_docs,
                     extra_env={"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": None})
    assert run.returncode == 0, run.stderr
    assert [u["name"] for u in run.tool_uses()] == ["Read", "Write"]
    assert run.result["result"] == "The status is below.\nHW-DR-0052 current."
    # The side query costs nothing: the total is the scenario's three answers.
    assert run.result["usage"]["input_tokens"] == 300
    aux = [r for r in provider.requests if r.get("kind") == "auxiliary"]
    assert len(aux) <= 1  # 2.1.197: one title query; 2.1.337: none
    assert provider.unknown_paths == []
    for r in aux:
        assert r["body"]["tools"] == []
        assert json.loads(r["response"]["content"][0]["text"]) == {"title": AUXILIARY_TEXT}
    assert [r["turn"] for r in provider.main_loop_requests()] == [0, 1, 2]


# --------------------------------------------------------------------------------------
# How 2.1.197 reports what the recorder must refuse (recipes for its test scenarios)
# --------------------------------------------------------------------------------------

_MCP_SERVER = textwrap.dedent('''
    import json, sys
    for line in sys.stdin:
        msg = json.loads(line)
        if "id" not in msg:
            continue
        m = msg.get("method")
        if m == "initialize":
            res = {"protocolVersion": msg["params"].get("protocolVersion", "2024-11-05"),
                   "capabilities": {"tools": {}}, "serverInfo": {"name": "t", "version": "0"}}
        elif m == "tools/list":
            res = {"tools": [{"name": "ping", "description": "pong",
                              "inputSchema": {"type": "object", "properties": {}}}]}
        else:
            res = {}
        print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": res}), flush=True)
''')


def _mcp_server(tmp_path: Path) -> dict[str, Any]:
    script = tmp_path / "mcp_server.py"
    script.write_text(_MCP_SERVER)
    return {"command": sys.executable, "args": [str(script)]}


def _plugin(root: Path, name: str = "localplug") -> Path:
    (root / ".claude-plugin").mkdir(parents=True)
    (root / ".claude-plugin" / "plugin.json").write_text(json.dumps({"name": name,
                                                                     "version": "0.1.0"}))
    (root / "skills" / "plugskill").mkdir(parents=True)
    (root / "skills" / "plugskill" / "SKILL.md").write_text(
        "---\nname: plugskill\ndescription: A plugin skill.\n---\nBody.\n")
    return root


def _settings(ws: Path, name: str, obj: dict[str, Any]) -> None:
    (ws / ".claude").mkdir(exist_ok=True)
    (ws / ".claude" / name).write_text(json.dumps(obj))


PLAIN = {"scenarios": [{"name": "plain", "turns": [{"text": "Hello."}]}]}


def test_bypass_permissions_in_init(claude_command, scripted_provider, tmp_path):
    # As root, bypassPermissions is refused ("--dangerously-skip-permissions cannot be used
    # with root/sudo privileges") unless IS_SANDBOX=1; as another user it works without it.
    run = run_claude(claude_command, scripted_provider(PLAIN), tmp_path,
                     mode=("--permission-mode", "bypassPermissions"),
                     extra_env={"IS_SANDBOX": "1"})
    assert run.returncode == 0, run.stderr
    assert run.init["permissionMode"] == "bypassPermissions"


def test_workspace_cannot_override_the_permission_flag(claude_command, scripted_provider,
                                                      tmp_path):
    run = run_claude(claude_command, scripted_provider(PLAIN), tmp_path,
                     setup=lambda ws, _: _settings(ws, "settings.json", {
                         "permissions": {"defaultMode": "bypassPermissions"}}),
                     extra_env={"IS_SANDBOX": "1"})
    assert run.init["permissionMode"] == "dontAsk"


def test_plugin_mcp_skill_memory_hook_in_init(claude_command, scripted_provider, tmp_path):
    """One run showing every refusable init feature at once (each recipe also works alone)."""
    plugin = _plugin(tmp_path / "plugin")
    extra_mcp = tmp_path / "extra-mcp.json"
    extra_mcp.write_text(json.dumps({"mcpServers": {"extra": _mcp_server(tmp_path)}}))
    memory = tmp_path / "elsewhere-memory"

    def setup(ws: Path, _cfg: Path) -> None:
        (ws / ".mcp.json").write_text(json.dumps({"mcpServers": {"declared":
                                                                 _mcp_server(tmp_path)}}))
        (ws / ".claude" / "skills" / "wsskill").mkdir(parents=True)
        (ws / ".claude" / "skills" / "wsskill" / "SKILL.md").write_text(
            "---\nname: wsskill\ndescription: A workspace skill.\n---\nBody.\n")
        _settings(ws, "settings.local.json", {"autoMemoryDirectory": str(memory)})
        _settings(ws, "settings.json", {"hooks": {"SessionStart": [
            {"matcher": "", "hooks": [{"type": "command", "command": "echo started"}]}]}})

    run = run_claude(claude_command, scripted_provider(PLAIN), tmp_path, setup=setup,
                     extra_args=("--plugin-dir", str(plugin), "--mcp-config", str(extra_mcp)))
    assert run.returncode == 0, run.stderr
    kinds = [(l["type"], l.get("subtype")) for l in run.lines]
    assert kinds[:3] == [("system", "hook_started"), ("system", "hook_response"),
                         ("system", "init")]
    assert run.lines[0]["hook_event"] == "SessionStart"
    assert run.lines[0]["hook_name"] == "SessionStart:startup"
    assert run.lines[1]["stdout"] == "started\n" and run.lines[1]["outcome"] == "success"
    init = run.init
    # 2.1.337 also lists its builtin plugins and adds the manifest's "version" to each entry
    assert [{k: v for k, v in p.items() if k != "version"} for p in init["plugins"]
            if p.get("path") != "builtin"] == [{"name": "localplug", "path": str(plugin),
                                                "source": "localplug@inline"}]
    assert "localplug:plugskill" in init["skills"]
    assert "wsskill" in init["skills"]
    # 2.1.337 adds each server's "source" ("project" for .mcp.json, "dynamic" for --mcp-config)
    assert sorted(({"name": s["name"], "status": s["status"]} for s in init["mcp_servers"]),
                  key=lambda s: s["name"]) == [
        {"name": "declared", "status": "connected"}, {"name": "extra", "status": "connected"}]
    assert {"mcp__declared__ping", "mcp__extra__ping"} <= set(init["tools"])
    assert init["memory_paths"] == {"auto": f"{memory}/"}


# --------------------------------------------------------------------------------------
# The provider on its own (HTTP, validation, command line)
# --------------------------------------------------------------------------------------


def _post(url: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _sse_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for chunk in raw.decode().split("\n\n"):
        if chunk.strip():
            name, data = chunk.split("\n")
            events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


def _main_body(messages: list[dict[str, Any]], stream: bool = True) -> dict[str, Any]:
    return {"model": "claude-opus-4-8", "max_tokens": 64000, "stream": stream,
            "system": [{"type": "text", "text": "# Environment\n - Primary working directory: /w"}],
            "tools": [{"name": "Read", "input_schema": {"type": "object"}}],
            "messages": messages}


def test_sse_shape_and_stateless_turns(tmp_path):
    doc = {"scenarios": [{"name": "s", "model": SERVED_MODEL, "turns": [
        {"text": "Looking.", "tool_uses": [{"name": "Read", "input": {"file_path": "{cwd}/a"}}]},
        {"error": {"status": 529, "type": "overloaded_error", "message": "busy"}, "times": 2},
        {"text": "Final."},
    ]}]}
    user = {"role": "user", "content": [{"type": "text", "text": "task"}]}
    with ScriptedProvider(doc) as p:
        url = p.base_url + "/v1/messages?beta=true"
        status, raw = _post(url, _main_body([user]))
        assert status == 200
        events = _sse_events(raw)
        assert [e for e, _ in events] == [
            "message_start", "ping",
            "content_block_start", "content_block_delta", "content_block_stop",
            "content_block_start", "content_block_delta", "content_block_delta",
            "content_block_stop", "message_delta", "message_stop"]
        assert events[0][1]["message"]["model"] == SERVED_MODEL
        assert events[5][1]["content_block"]["name"] == "Read"
        partial = "".join(d["delta"]["partial_json"] for e, d in events
                          if d.get("delta", {}).get("type") == "input_json_delta")
        assert json.loads(partial) == {"file_path": "/w/a"}
        assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
        assert events[-2][1]["usage"]["output_tokens"] == 20
        # A retry of the same request gets the same turn.
        assert _sse_events(_post(url, _main_body([user]))[1])[5][1]["content_block"]["name"] \
            == "Read"

        history = [user, {"role": "assistant", "content": [{"type": "text", "text": "x"}]},
                   {"role": "user", "content": [{"type": "text", "text": "r"}]}]
        # Side queries in between neither advance nor consume the error turn.
        aux = {"model": "m", "max_tokens": 64000, "tools": [], "messages": history,
               "output_config": {"format": {"type": "json_schema", "schema": {
                   "type": "object", "properties": {"title": {"type": "string"}},
                   "required": ["title"]}}}}
        status, raw = _post(url, aux)
        assert status == 200 and json.loads(json.loads(raw)["content"][0]["text"]) == {
            "title": AUXILIARY_TEXT}
        for _ in range(2):
            status, raw = _post(url, _main_body(history), {"x-claude-code-session-id": "a"})
            assert status == 529
            assert json.loads(raw) == {"type": "error", "error": {"type": "overloaded_error",
                                                                  "message": "busy"}}
        # Error counters are per CLI session.
        assert _post(url, _main_body(history), {"x-claude-code-session-id": "b"})[0] == 529
        status, raw = _post(url, _main_body(history, stream=False),
                            {"x-claude-code-session-id": "a"})
        assert status == 200
        message = json.loads(raw)
        assert message["content"] == [{"type": "text", "text": "Final."}]
        assert message["stop_reason"] == "end_turn"

        status, raw = _post(p.base_url + "/v1/messages/count_tokens", _main_body([user]))
        assert status == 200 and json.loads(raw)["input_tokens"] > 0
        status, _ = _post(p.base_url + "/v1/elsewhere", {})
        assert status == 404 and p.unknown_paths == ["POST /v1/elsewhere"]


@pytest.mark.parametrize("doc, message", [
    ({}, "document.scenarios: must be a non-empty list"),
    ({"scenarios": [{"name": "a", "turns": []}]}, "scenarios[0] (a).turns: must be a non-empty"),
    ({"scenarios": [{"name": "a", "turns": [{"error": {"status": 200}}]}]},
     "scenarios[0] (a).turns[0].error.status: must be an HTTP error status"),
    ({"scenarios": [{"name": "a", "turns": [{"txt": "x"}]}]}, "unknown key(s) ['txt']"),
    ({"scenarios": [{"name": "a", "turns": [{"tool_uses": [{"input": {}}]}]}]},
     "turns[0].tool_uses[0].name: must be a non-empty string"),
    ({"scenarios": [{"name": "a", "turns": [{"text": "x", "times": 2}]}]},
     "only an error turn can repeat"),
    ({"scenarios": [{"name": "a", "turns": [{"text": "x"}]},
                    {"name": "b", "turns": [{"text": "y"}]}]}, "more than one default"),
])
def test_bad_scenarios_are_refused_with_a_location(doc, message):
    with pytest.raises(ScenarioError) as exc:
        load_scenarios(doc)
    assert message in str(exc.value)


def test_command_line_serves_until_sigterm(tmp_path):
    scenarios = tmp_path / "s.json"
    scenarios.write_text(json.dumps(PLAIN))
    record = tmp_path / "r.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner.demo.provider", "--scenarios", str(scenarios),
         "--record", str(record)],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2],
    )
    try:
        base_url = proc.stdout.readline().strip()
        assert base_url.startswith("http://127.0.0.1:")
        status, raw = _post(base_url + "/v1/messages", _main_body(
            [{"role": "user", "content": "hi"}], stream=False))
        assert status == 200 and json.loads(raw)["content"][0]["text"] == "Hello."
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert json.loads(record.read_text().splitlines()[0])["kind"] == "main"

    bad = tmp_path / "bad.json"
    bad.write_text("{\"scenarios\": 3}")
    out = subprocess.run([sys.executable, "-m", "runner.demo.provider", "--scenarios",
                          str(bad)], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 2 and "document.scenarios: must be a non-empty list" in out.stderr
