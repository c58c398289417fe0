"""The hostile session of the real-node tier (tests/node/test_hostile_on_node.py): its probe, the
scripted provider's scenarios for it, its corpus (with tests/integration/hostile_attack.py as
tools/hostile.py) and its plan, shared with tests/node/conftest.py, which serves the scenarios;
the corpus and plan builders serve the channel attacks too."""

from __future__ import annotations

import shutil
from pathlib import Path

MODEL = "claude-sonnet-4-5"
ATTACK = Path(__file__).parent / "integration" / "hostile_attack.py"
# Its title is one the attack script does not name: the seal removes every file naming the probe.
PROBE = {"id": "HW-PRB-0102", "path": "docs/probes/hostile.md", "title": "Gateway refusals",
         "task": "TASK-HOSTILE: try every route past the gateway.", "answers": ["held"], "examines": ["docs/a.md"]}
CLI_USAGE = {"input_tokens": 1200, "output_tokens": 80}  # each of the CLI's own calls
SIDE_USAGE = {"input_tokens": 100, "output_tokens": 10}  # each call of the session's Bash the gateway forwards
SCENARIOS = [
    {"name": "hostile", "match": "TASK-HOSTILE", "model": MODEL, "usage": CLI_USAGE,
     "turns": [{"tool_uses": [{"name": "Bash", "input": {"command": "python3 tools/hostile.py --scan 8080"}}]},
               {"text": "Every route tried.\nheld"}]},
    {"name": "hostile-side", "match": "HOSTILE side", "model": MODEL, "usage": SIDE_USAGE, "turns": [{"text": "side"}]},
]


def corpus(root: Path, probe: dict = PROBE, script: Path = ATTACK, name: str = "hostile.py") -> Path:
    """A corpus with ``probe`` (one document it examines) and ``script`` at tools/``name``: what
    the session's Bash runs (also the channel attacks' corpus, tests/integration/test_channel.py)."""
    (root / "docs/probes").mkdir(parents=True)
    (root / "docs/a.md").write_text("# A\n")
    (root / probe["path"]).write_text(f"# {probe['title']}\n\n## Task\n\n{probe['task']}\n")
    (root / "tools").mkdir()
    shutil.copyfile(script, root / "tools" / name)
    return root


def plan_data(campaign: str, probe: dict = PROBE) -> dict:
    """The plan as a user writes it, of ``probe`` alone (the real-node tier submits it)."""
    return {
        "campaign": campaign, "tier": "regression", "model": MODEL,
        "identity": {k: "sha256:" + "5" * 64 for k in ("lock", "tree", "selection", "read_set")}
        | {"seed": 1, "harness": "headwater 0.9.1"},
        "arms": ["present"], "repetitions": 1, "identifier_pattern": "HW-[A-Z]+-[0-9]{4}", "probes": [probe],
    }
