"""A small campaign as the integration tests write one to run with the real CLI: probes whose
files say their task, a corpus with the document they examine, and the plan over them as a user
writes it (the identity of a fixed headwater selection)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

DOC_A = "# HW-DR-0052\n\nStatus: current.\n"  # docs/a.md: the document the probes examine
IDENTITY = {k: "sha256:" + c * 64 for k, c in (("lock", "1"), ("tree", "2"), ("selection", "3"), ("read_set", "4"))} \
    | {"seed": 7, "harness": "headwater 0.9.1"}


def write_corpus(corpus: Path, probes: Sequence[dict[str, Any]], doc_a: str = DOC_A) -> Path:
    """docs/a.md and each probe's file (its title and task) under ``corpus``."""
    (corpus / "docs/probes").mkdir(parents=True)
    (corpus / "docs/a.md").write_text(doc_a)
    for p in probes:
        (corpus / p["path"]).write_text(f"# {p['title']}\n\n## Task\n\n{p['task']}\n")
    return corpus


def plan_data(campaign: str, probes: Sequence[dict[str, Any]], arms: Sequence[str] = ("present", "absent"),
              repetitions: int = 1, identity: dict[str, Any] = IDENTITY) -> dict[str, Any]:
    """The plan of ``probes`` as a user writes it (plan.json)."""
    return {"campaign": campaign, "tier": "regression", "model": "claude-sonnet-4-5", "identity": identity,
            "arms": list(arms), "repetitions": repetitions, "identifier_pattern": "HW-[A-Z]+-[0-9]{4}",
            "probes": list(probes)}
