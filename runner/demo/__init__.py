"""The bundled demo: a small corpus, a plan over it (2 probes x 2 arms x 2 repetitions) and
the scenarios the scripted provider plays, so `probe-runner demo` shows a whole campaign with
the real Claude Code CLI and no account.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from runner.plan import Plan, parse_plan
from runner.settings import Settings

HERE = Path(__file__).parent
CORPUS = HERE / "corpus"
PLAN = HERE / "plan.json"
SCENARIOS = HERE / "scenarios.json"


def run_demo(settings: Settings, run: Callable[[Settings, Plan, Path], int]) -> int:
    """``run(settings, plan, corpus)`` runs the campaign: the CLI's one path of every command that runs sessions."""
    from pydantic import SecretStr

    from runner.demo.provider import ScriptedProvider

    data = json.loads(PLAN.read_text())
    data["campaign"] = "demo-" + datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    plan = parse_plan(data, str(PLAN))
    with ScriptedProvider(json.loads(SCENARIOS.read_text()), api_key="demo-key") as provider:
        demo_settings = settings.model_copy(update={
            "provider": settings.provider.model_copy(update={"base_url": provider.base_url, "api_key": SecretStr("demo-key"),
                                                             "credentials_file": None}),
        })
        print(f"demo: campaign {plan.campaign}, scripted provider at {provider.base_url}, store {settings.store}")
        return run(demo_settings, plan, CORPUS)
