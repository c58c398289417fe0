"""The recorder's conformance sessions through the gateway: a campaign of one session per
probe of ``conformance.json`` over the bundled demo corpus, run as `probe-runner run` runs one
(the local executor under bubblewrap, this run's own gateway in front of the scripted
provider), transformed, and each session's event held to what the contract makes of its
scenario: the calls with their arguments and results, what it produced with digests and
cites, its answer, a session the time limit ended, one the turns ran out on, and one whose
stated cost the gateway's meter must agree with."""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

from pydantic import SecretStr

from runner import digest, harnesses, layout
from runner.demo import CORPUS, PLAN
from runner.demo.provider import ScriptedProvider
from runner.plan import Plan, parse_plan
from runner.settings import Settings
from runner.store import open_store
from runner.transform.transcript import parse as parse_transcript

SPEC = Path(__file__).parent / "conformance.json"
KEY = "qualify-key"
ARM = "present"
SESSION = f"{ARM}-001"


@dataclass
class Result:
    """What the conformance campaign of one model came to."""

    sessions: int = 0
    passed: int = 0
    failures: dict[str, str] = field(default_factory=dict)  # probe id -> what differed

    def record(self) -> dict[str, Any]:
        return {"sessions": self.sessions, "passed": self.passed, "failures": dict(self.failures)}


def spec() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(SPEC.read_text())
    return doc


def _plan(doc: dict[str, Any], model: str, campaign: str) -> Plan:
    base = json.loads(PLAN.read_text())
    probes = [{"id": p["id"], "path": f"docs/probes/{p['id'].lower()}.md", "title": p["task"].split(":")[0],
               "task": p["task"], "answers": p["answers"], "examines": []} for p in doc["probes"]]
    return parse_plan({**base, "campaign": campaign, "tier": "regression", "model": model, "arms": [ARM], "repetitions": 1,
                       "probes": probes}, "conformance")


def _scenarios(doc: dict[str, Any]) -> dict[str, Any]:
    return {"scenarios": [{"name": p["id"], "match": p["task"].split(":")[0], "usage": {"input_tokens": 0, "output_tokens": 0},
                           "turns": p["turns"]} for p in doc["probes"]]}


def _corpus(root: Path, plan: Plan) -> Path:
    corpus = root / "corpus"
    shutil.copytree(CORPUS, corpus)
    for p in plan.probes:
        (corpus / p.path).write_text(f"# {p.title}\n\n## Task\n\n{p.task}\n")
    return corpus


def run(cli: Path, model: str, sent: list[str]) -> Result:
    """The conformance campaign of ``model`` with the CLI at ``cli``, checked. ``sent``: the
    models its requests were seen to name, which its sessions may call (a CLI may send another
    than the one asked for). The sessions run as `probe-runner run` runs them, but for the
    check of the (version, model) pair, which is what this qualifies."""
    from runner.campaign import run_sessions
    from runner.executors.local import LocalExecutor
    from runner.transform.run import run_transform

    doc = spec()
    with tempfile.TemporaryDirectory(prefix="qualify-conformance-") as tmp:
        root = Path(tmp)
        campaign = "qualify-" + model.replace(".", "-")[:40]
        plan = _plan(doc, model, campaign)
        corpus = _corpus(root, plan)
        with ScriptedProvider(_scenarios(doc), api_key=KEY) as provider:
            settings = Settings.model_validate({
                "store": f"file://{root / 'store'}", "concurrency": len(plan.probes),
                "provider": {"base_url": provider.base_url, "api_key": SecretStr(KEY)},
                "harness": {"command": str(cli), "timeout_seconds": doc["timeout_seconds"], "max_turns": doc["max_turns"],
                            "env": {"CLAUDE_CODE_MAX_RETRIES": "2"}},
                "gateway": {"models": sorted(set(sent) - {model})},
                "local": {"workdir": root / "work"}})
            store = open_store(settings.store, settings)
            executor = LocalExecutor(settings)
            try:
                run_sessions(plan, corpus, store, executor, settings.local.workdir, len(plan.probes), list(doc["produced"]))
            finally:
                executor.close()
        report = run_transform(store, plan)
        return check(doc, plan, corpus, store, report.refusals)


def check(doc: dict[str, Any], plan: Plan, corpus: Path, store: Any, refusals: list[Any]) -> Result:
    """Each conformance session's event against what is expected of it."""
    result = Result(sessions=len(doc["probes"]))
    key = layout.transcript_key(plan.campaign, plan.tier.value, ARM)
    events: dict[str, dict[str, Any]] = {}
    if store.exists(key):
        parsed = cast(list[dict[str, Any]], parse_transcript(store.get(key).decode()).events)  # the closed key sets, checked
        events = {e["probe"]: e for e in parsed}
    for p in doc["probes"]:
        refused = [str(r.get("reason")) for r in refusals if r.get("probe") == p["id"]]
        event = events.get(p["id"])
        keys = layout.SessionKeys(plan.campaign, p["id"], SESSION)
        capture = json.loads(store.get(keys.capture)) if store.exists(keys.capture) else {}
        if refused or event is None:
            why = "; ".join(refused) or ("no transcript" if not events else "no event")
            result.failures[p["id"]] = f"refused or missing ({why[:300]})"
            continue
        wrong = _differences(p["expect"], event, corpus, capture, store, keys)
        if wrong:
            result.failures[p["id"]] = "; ".join(wrong)
        else:
            result.passed += 1
    return result


def _result_ok(want: str, got: Any, corpus: Path) -> bool:
    if want == "any":
        return digest.is_digest(got)
    if want == "none":
        return got is None
    return bool(got == digest.of_file(corpus / want.removeprefix("digest-of:")))


def _differences(expect: dict[str, Any], event: dict[str, Any], corpus: Path, capture: dict[str, Any], store: Any,
                 keys: layout.SessionKeys) -> list[str]:
    wrong: list[str] = []
    calls = event.get("calls") or []
    if "calls_prefix" in expect:  # the turns ran out: the calls it made until then, each as expected
        want = expect["calls_prefix"]
        if not calls or any((c.get("tool"), c.get("argument")) != (want["tool"], want["argument"]) for c in calls):
            wrong.append(f"calls {[(c.get('tool'), c.get('argument')) for c in calls]} are not repeats of {want['tool']} {want['argument']}")
    else:
        got = [(c.get("tool"), c.get("argument")) for c in calls]
        exp = [(c["tool"], c["argument"]) for c in expect["calls"]]
        if got != exp:
            wrong.append(f"calls {got}, expected {exp}")
        else:
            for c, w in zip(calls, expect["calls"], strict=True):
                if not _result_ok(w["result"], c.get("result"), corpus):
                    wrong.append(f"{c['tool']} {c['argument']}: result {c.get('result')}, expected {w['result']}")
    produced = [(a.get("path"), a.get("result"), a.get("cites") or []) for a in event.get("produced") or []]
    exp_produced = [(a["path"], digest.of_text(a["content"]), a["cites"]) for a in expect["produced"]]
    if produced != exp_produced:
        wrong.append(f"produced {produced}, expected {exp_produced}")
    if event.get("answer") != expect["answer"]:
        wrong.append(f"answer {event.get('answer')!r}, expected {expect['answer']!r}")
    if expect.get("timed_out") and not capture.get("timed_out"):
        wrong.append("the capture record does not say the time limit ended it")
    if expect.get("cost") == "metered":
        wrong += _cost(capture, store, keys)
    return wrong


def _cost(capture: dict[str, Any], store: Any, keys: layout.SessionKeys) -> list[str]:
    """The CLI's stated cost of the session and the gateway's meter of its calls agree."""
    parsed = harnesses.HARNESS.parse(store.get(keys.stream).splitlines(), False)
    meter = capture.get("gateway") or {}
    if parsed.cost_usd is None:
        return ["the stream states no cost"]
    if meter.get("unpriced_models"):  # the report's price finding says so: the meter has nothing to agree with
        return []
    metered = Decimal(str(meter.get("cost_usd", "0")))
    if abs(metered - parsed.cost_usd) > Decimal("0.000001"):
        return [f"the CLI stated ${parsed.cost_usd}, the gateway metered ${metered}"]
    return []
