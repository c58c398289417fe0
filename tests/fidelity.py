"""Contract-fidelity campaigns through the real Claude Code CLI (tests/integration/
test_contract_fidelity*.py): a corpus written from a dict, one probe per rule whose task selects
its scenario of the scripted provider, recorded by ``run_sessions`` under bwrap and turned into
transcripts by the transform, exactly as ``probe-runner run`` does."""

from __future__ import annotations

import json
from pathlib import Path

from local_run import run_local
from pydantic import SecretStr

from runner import layout
from runner.demo.provider import ScriptedProvider
from runner.plan import parse_plan
from runner.settings import Settings
from runner.store.file import FileStore
from runner.transform.run import run_transform
from runner.transform.transcript import parse as parse_transcript

IDENTITY = ({k: "sha256:" + c * 64 for k, c in (("lock", "1"), ("tree", "2"), ("selection", "3"), ("read_set", "4"))}
            | {"seed": 7, "harness": "headwater 0.9.1"})


def probe(pid: str, task: str, answers: list[str], title: str | None = None, path: str | None = None) -> dict:
    return {"id": pid, "path": path or f"docs/probes/{pid}.md", "title": title or f"Probe {pid}", "task": task,
            "answers": answers, "examines": ["docs/a.md"]}


def plan_of(campaign: str, probes: list[dict], identifier: str, repetitions: int = 1) -> dict:
    """A one-arm (present) regression plan of these probes."""
    return {"campaign": campaign, "tier": "regression", "model": "claude-sonnet-4-5", "identity": IDENTITY,
            "arms": ["present"], "repetitions": repetitions, "identifier_pattern": identifier, "probes": probes}


def use(name: str, **inp) -> dict:
    """A scenario turn of one tool call."""
    return {"tool_uses": [{"name": name, "input": inp}]}


def write_corpus(corpus: Path, files: dict[str, str | bytes], probes: list[dict]) -> None:
    for rel, text in files.items():
        (corpus / rel).parent.mkdir(parents=True, exist_ok=True)
        (corpus / rel).write_bytes(text if isinstance(text, bytes) else text.encode())
    for p in probes:
        (corpus / p["path"]).parent.mkdir(parents=True, exist_ok=True)
        (corpus / p["path"]).write_text(f"# {p['title']}\n\n## Task\n\n{p['task']}\n")


def record(root: Path, name: str, corpus: Path, plan_doc: dict, scenarios: dict, timeout: int, claude_command: list[str],
           **settings_over) -> dict:
    """Run every session of the plan, then the transform: the store, the plan, the transform's
    report and each arm's transcript text (None where the arm has none)."""
    plan = parse_plan(plan_doc)
    store = FileStore(root / "store")
    with ScriptedProvider(scenarios) as provider:
        settings = Settings(
            store=store.uri, concurrency=2,
            provider={"base_url": provider.base_url, "api_key": SecretStr("test-key")},
            harness={"command": claude_command[0], "env": {"CLAUDE_CODE_MAX_RETRIES": "2"}, "timeout_seconds": timeout},
            local={"workdir": root / "work"}, **settings_over,
        )
        run_local(plan, corpus, store, settings, 2)
    report = run_transform(store, plan)
    texts = {}
    for arm in plan.arms:
        key = layout.transcript_key(name, plan.tier.value, arm.value)
        texts[arm.value] = store.get(key).decode() if store.exists(key) else None
    return {"store": store, "plan": plan, "report": report, "texts": texts, "name": name}


def events(text: str) -> dict:
    return {e["probe"]: e for e in parse_transcript(text).events}


def stream_uses(store, name: str, probe: str, session: str = "present-001") -> list[tuple[dict, str | None]]:
    """(tool input, result text) of each call in the stored stream, as json reads them."""
    uses, results = [], {}
    for line in store.get(layout.SessionKeys(name, probe, session).stream).splitlines():
        obj = json.loads(line)
        message = obj.get("message")  # 2.1.337's system/permission_denied line has a string there
        for block in (message if isinstance(message, dict) else {}).get("content") or []:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                uses.append(block)
            if isinstance(block, dict) and block.get("type") == "tool_result":
                content = block.get("content")
                results[block["tool_use_id"]] = content if isinstance(content, str) else json.dumps(content)
    return [(u["input"], results.get(u["id"])) for u in uses]
