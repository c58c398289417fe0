"""What a CLI build sends its provider with one model: it runs under the harness's real flags
and environment (``Harness.flags``, ``Harness.environment``) straight against the scripted
provider, whose record holds every request as it arrived, and the record is summed up
(``Sent``). Straight, not through the gateway: the gateway would refuse what is not qualified
yet, and that is what qualification must see. Each run also answers once with known token
counts, so the CLI's stated cost shows its own price of the model (``rates``)."""

from __future__ import annotations

import json
import subprocess
import tempfile
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from runner import harnesses
from runner.demo.provider import ScriptedProvider
from runner.harnesses.contract import Reach
from runner.plan import Plan
from runner.settings import Settings

# Headers of the connection, not of the request: the gateway's HTTP client sets its own.
TRANSPORT = frozenset({"host", "connection", "content-length", "accept-encoding", "transfer-encoding", "keep-alive"})
KEY = "qualify-key"
TASK = "Read a.md, then answer."
RUN_SECONDS = 120.0  # the most one observation's CLI may run
# One answer of each kind of token alone, TOKENS of it (under any long-context threshold): the
# CLI's stated cost times MILLION / TOKENS is then its rate for that kind, in US dollars per
# million tokens. One more answer (LONG) has a prompt over 200k tokens: what a long-context
# premium changes, the gateway's meter must state alike.
KINDS = {"input": "input_tokens", "output": "output_tokens", "cache_write": "cache_creation_input_tokens",
         "cache_read": "cache_read_input_tokens"}
TOKENS = 50_000
MILLION = 1_000_000
LONG = {"input_tokens": 150_000, "cache_read_input_tokens": 100_000, "output_tokens": 20_000}


@dataclass
class Sent:
    """What the CLI sent with one model, summed over its requests."""

    model: str  # the model it was run with
    models: set[str] = field(default_factory=set)  # the models its requests named
    routes: set[tuple[str, str]] = field(default_factory=set)
    queries: set[str] = field(default_factory=set)
    headers: set[str] = field(default_factory=set)  # lower case, the connection's own left out
    keys: set[str] = field(default_factory=set)  # the bodies' top-level keys
    betas: set[str] = field(default_factory=set)
    max_tokens: int = 0
    context_window: int | None = None  # the model's, as the result line's modelUsage states it
    requests: int = 0
    ended: str | None = None  # the result line's subtype, or why there was none

    def add(self, rec: dict[str, Any]) -> None:
        self.requests += 1
        self.routes.add((rec["method"], rec["path"]))
        self.queries.add(rec.get("query") or "")
        headers = rec.get("headers") or {}
        self.headers |= {h for h in headers if h not in TRANSPORT and h not in ("x-api-key", "authorization")}
        self.betas |= {b.strip() for b in str(headers.get("anthropic-beta", "")).split(",") if b.strip()}
        body = rec.get("body")
        if isinstance(body, dict):
            self.keys |= set(body)
            if isinstance(body.get("model"), str):
                self.models.add(body["model"])
            if type(body.get("max_tokens")) is int:
                self.max_tokens = max(self.max_tokens, body["max_tokens"])

    def record(self) -> dict[str, Any]:
        return {"models": sorted(self.models), "routes": sorted(" ".join(r) for r in self.routes),
                "queries": sorted(self.queries), "headers": sorted(self.headers), "keys": sorted(self.keys),
                "betas": sorted(self.betas), "max_tokens": self.max_tokens, "context_window": self.context_window,
                "requests": self.requests, "ended": self.ended}


def _plan(model: str) -> Plan:
    from runner.plan import parse_plan

    ident = {k: "sha256:" + "0" * 64 for k in ("lock", "tree", "selection", "read_set")} | {"seed": 1, "harness": "qualify"}
    return parse_plan({"campaign": "qualify", "tier": "regression", "model": model, "identity": ident, "arms": ["present"],
                       "repetitions": 1, "identifier_pattern": "HW-[A-Z]+-[0-9]{4}",
                       "probes": [{"id": "HW-PRB-0001", "path": "p.md", "title": "t", "task": TASK, "answers": [], "examines": []}]},
                      "qualify")


def _run(cli: Path, model: str, settings: Settings, usage: dict[str, int], record: Path) -> tuple[dict[str, Any] | None, str]:
    """One session of the CLI against a scripted provider recording to ``record``: the result
    line (or None) and the stream's last words where it has none."""
    doc = {"scenarios": [{"name": "observe", "usage": {"input_tokens": 0, "output_tokens": 0}, "turns": [
        {"tool_uses": [{"name": "Read", "input": {"file_path": "{cwd}/a.md"}}]},
        {"text": "Done.", "usage": usage}]}]}
    with tempfile.TemporaryDirectory(prefix="qualify-ws-") as ws, tempfile.TemporaryDirectory(prefix="qualify-cfg-") as cfg:
        (Path(ws) / "a.md").write_text("# A\n\nA line.\n")
        with ScriptedProvider(doc, record_path=record, api_key=KEY) as provider:
            h = harnesses.HARNESS
            env = h.environment(Reach(config_dir=cfg, base_url=provider.base_url, token=KEY))
            argv = [str(cli), *h.flags(_plan(model), settings)]
            try:
                done = subprocess.run(argv, input=TASK.encode(), cwd=ws, env=env, capture_output=True, timeout=RUN_SECONDS)
            except subprocess.TimeoutExpired:
                return None, f"the CLI did not end within {RUN_SECONDS:.0f} s"
    results = [obj for obj in map(_json, done.stdout.splitlines()) if obj.get("type") == "result"]
    if not results:
        return None, f"no result line (exit {done.returncode}): {done.stderr.decode(errors='replace')[-300:]}"
    return results[-1], ""


def _json(line: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(line)
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}


def observe(cli: Path, model: str) -> tuple[Sent, dict[str, Decimal | None], Decimal | None]:
    """What the CLI sends with ``model``, its own rate of each kind of token (None where its
    stated cost could not be read), and its stated cost of LONG."""
    settings = Settings.model_validate({"store": "file:///nonexistent",
                                        "provider": {"base_url": "http://127.0.0.1:9", "api_key": SecretStr(KEY)}})
    sent = Sent(model)
    rates: dict[str, Decimal | None] = {}
    with tempfile.TemporaryDirectory(prefix="qualify-rec-") as tmp:
        for n, (kind, usage) in enumerate([*((k, {u: TOKENS}) for k, u in KINDS.items()), ("long", LONG)]):
            record = Path(tmp) / f"{n}.jsonl"
            result, why = _run(cli, model, settings, usage, record)
            if n == 0:
                for line in record.read_text().splitlines() if record.exists() else []:
                    sent.add(json.loads(line))
                sent.ended = str(result.get("subtype")) if result is not None else why
                windows = [u.get("contextWindow") for u in ((result or {}).get("modelUsage") or {}).values() if isinstance(u, dict)]
                sent.context_window = max((w for w in windows if type(w) is int and w > 0), default=None)
            cost = result.get(harnesses.HARNESS.stated_cost) if result is not None else None
            stated = Decimal(str(cost)) if isinstance(cost, int | float) else None
            scale = MILLION // TOKENS if kind != "long" else 1
            rates[kind] = None if stated is None else (stated * scale).quantize(Decimal("0.000001")).normalize()
    long = rates.pop("long")
    return sent, rates, long
