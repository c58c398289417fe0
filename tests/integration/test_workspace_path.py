"""Every session sees its workspace at one path, so identical calls return identical results.

Two sessions of one campaign run the real Claude Code CLI under the local executor against the
scripted provider, with the same task: a Bash ``pwd``, a Grep over the workspace (both modes)
and an Edit of a file that does not exist (the harness's error message names its working
directory). The executor seals each session's workspace in a scratch directory of its own on
the host; when the sandbox showed the workspace there, ``pwd`` printed that directory and the
error message named it, so the two sessions' result digests differed for the same call (2.1.197
prints Grep's matches relative to the working directory, so those did not). Inside the sandbox
the workspace is ``/workspace`` for every session, as in the Kubernetes executor's session pod.
"""

from __future__ import annotations

import json

import pytest
from local_run import run_local
from pydantic import SecretStr

from runner import layout
from runner.demo.provider import ScriptedProvider
from runner.plan import parse_plan
from runner.sandbox import CONFIG_DIR, WORKSPACE
from runner.settings import Settings
from runner.store.file import FileStore
from runner.transform.run import run_transform
from runner.transform.transcript import parse as parse_transcript
from tests.support.campaigns import write_corpus

CAMPAIGN = "iwspath"
PROBE = {"id": "HW-PRB-0201", "path": "docs/probes/HW-PRB-0201.md", "title": "Workspace path",
         "task": "TASK-WHERE: say where you are and what mentions the status.",
         "answers": ["current HW-DR-0052"], "examines": ["docs/a.md"]}
SCENARIOS = {"scenarios": [{"name": "where", "match": "TASK-WHERE", "turns": [
    {"tool_uses": [{"name": "Bash", "input": {"command": "pwd"}}]},
    {"tool_uses": [{"name": "Grep", "input": {"pattern": "Status"}}]},
    {"tool_uses": [{"name": "Grep", "input": {"pattern": "Status", "output_mode": "content"}}]},
    {"tool_uses": [{"name": "Edit", "input": {"file_path": "{cwd}/docs/missing.md", "old_string": "a", "new_string": "b"}}]},
    {"text": "Found it.\nHW-DR-0052 current."}]}]}


@pytest.fixture(scope="module")
def campaign(tmp_path_factory, claude_command):
    root = tmp_path_factory.mktemp("wspath")
    corpus = write_corpus(root / "corpus", [PROBE])
    plan = parse_plan({
        "campaign": CAMPAIGN, "tier": "regression", "model": "claude-sonnet-4-5",
        "identity": {k: "sha256:" + "6" * 64 for k in ("lock", "tree", "selection", "read_set")}
        | {"seed": 3, "harness": "headwater 0.9.1"},
        "arms": ["present"], "repetitions": 2, "identifier_pattern": "HW-[A-Z]+-[0-9]{4}", "probes": [PROBE],
    })
    store = FileStore(root / "store")
    with ScriptedProvider(SCENARIOS) as provider:
        settings = Settings(
            store=store.uri, concurrency=2,
            provider={"base_url": provider.base_url, "api_key": SecretStr("test-key")},
            harness={"command": claude_command[0], "timeout_seconds": 120}, local={"workdir": root / "work"},
        )
        run_local(plan, corpus, store, settings, 2)
    run_transform(store, plan)
    keys = [layout.SessionKeys(CAMPAIGN, spec.probe, spec.name) for spec in plan.sessions()]
    assert [k.session for k in keys] == ["present-001", "present-002"]
    text = store.get(layout.transcript_key(CAMPAIGN, "regression", "present")).decode()
    return {"store": store, "keys": keys, "root": root,
            "events": {e["session"]: e for e in parse_transcript(text).events}}


def _tool_results(raw: bytes) -> dict[str, list[str]]:
    """Tool name -> the texts its calls returned, in order, from the stored stream."""
    names, results = {}, {}
    for line in raw.splitlines():
        o = json.loads(line)
        for b in (o.get("message") or {}).get("content") or []:
            if not isinstance(b, dict):
                continue
            if b.get("type") == "tool_use":
                names[b["id"]] = b["name"]
            elif b.get("type") == "tool_result":
                c = b["content"]
                results[b["tool_use_id"]] = c if isinstance(c, str) else "".join(x.get("text", "") for x in c)
    by_tool: dict[str, list[str]] = {}
    for i, name in names.items():
        by_tool.setdefault(name, []).append(results[i])
    return by_tool


def test_the_capture_record_names_the_paths_the_session_saw(campaign):
    for k in campaign["keys"]:
        capture = json.loads(campaign["store"].get(k.capture))
        assert capture["workspace"] == WORKSPACE == "/workspace"
        assert capture["config_dir"] == CONFIG_DIR == "/run/probe/config"


def test_identical_calls_of_two_sessions_have_identical_results(campaign):
    events = campaign["events"]
    assert set(events) == {"present-001", "present-002"}, events
    one, two = events["present-001"]["calls"], events["present-002"]["calls"]
    assert [c["tool"] for c in one] == ["Bash", "Grep", "Grep", "Edit"], one
    assert all("result" in c for c in one + two), (one, two)
    assert one == two  # tool, argument and the digest of what the call returned
    assert events["present-001"]["answer"] == events["present-002"]["answer"] == "current HW-DR-0052"


def test_the_shell_and_grep_see_the_workspace_at_its_fixed_path(campaign):
    host_root = str(campaign["root"])
    for k in campaign["keys"]:
        raw = campaign["store"].get(k.stream)
        assert host_root.encode() not in raw, k.session  # no host path of the run reaches the session
        init = json.loads(raw.split(b"\n")[0])
        assert init["type"] == "system" and init["cwd"] == "/workspace", init
        by_tool = _tool_results(raw)
        assert [r.strip() for r in by_tool["Bash"]] == ["/workspace"], by_tool
        files, content = by_tool["Grep"]
        assert "docs/a.md" in files.split("\n"), files
        assert "Status: current." in content, content
        [error] = by_tool["Edit"]
        assert "File does not exist" in error and "working directory is /workspace." in error, error
