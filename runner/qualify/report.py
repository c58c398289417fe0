"""A qualification's report and its verdict, from what was observed: pure, no I/O.

Each finding names what differs from what is qualified and what must happen before the
version is: a beta with no class in the harness's table, a header, body key, route or query
string the gateway does not pass, a model sent in place of the one asked for, an output size
above what the gateway lets through, a conformance session whose events are not the expected
ones, or a price that the gateway's table lacks or states otherwise than the CLI."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from runner import harnesses
from runner.gateway import policy
from runner.harnesses.contract import Qualified
from runner.qualify.observe import LONG
from runner.settings import ModelPrice, price_of

TABLE = "runner/harnesses/claude_code/betas.py"
QUALIFIED = "runner/harnesses/claude_code/qualified.py"
REGENERATE = f"keep the report in docs/qualification/ and write {QUALIFIED} from the reports (python -m runner.qualify.table docs/qualification/*.json)"
PRICES = "gateway.prices (runner/settings.py DEFAULT_PRICES)"


@dataclass(frozen=True)
class Finding:
    """One difference; ``blocking``: the version is not qualified until it is resolved."""

    model: str | None  # None: of the version as a whole
    what: str
    todo: str
    blocking: bool = True
    table: bool = False  # a difference from the harness's table alone: writing the table from the report resolves it

    def record(self) -> dict[str, Any]:
        return {"model": self.model, "what": self.what, "todo": self.todo, "blocking": self.blocking, "table": self.table}


@dataclass
class ModelResult:
    """What one model's qualification found: what was sent, the CLI's rates, the conformance."""

    model: str
    sent: dict[str, Any]  # observe.Sent.record()
    rates: dict[str, Decimal | None]  # the CLI's own US dollars per million tokens, by kind
    long_usd: Decimal | None = None  # the CLI's stated cost of observe.LONG (a prompt over 200k tokens)
    conformance: dict[str, Any] = field(default_factory=dict)  # conformance.Result.record()


def _plain(d: Decimal | None) -> str | None:
    return None if d is None else format(d.normalize(), "f")


def findings(version: str, results: list[ModelResult], prices: Mapping[str, ModelPrice]) -> list[Finding]:
    """Every difference between what was observed and what is qualified."""
    h = harnesses.HARNESS
    calls = h.calls
    known: Qualified | None = h.qualified.get(version)
    out: list[Finding] = []
    for r in results:
        s = r.sent
        m = r.model
        if s["ended"] != "success":
            out.append(Finding(m, f"the observed session did not end in success: {s['ended']}", "look at the CLI's stream"))
        for beta in s["betas"]:
            classed = calls.betas.get(beta)
            if classed is None:
                out.append(Finding(m, f"beta {beta!r} has no class", f"class it in {TABLE}: allowed, priced (with its "
                                   "premium) or refused (server tools, MCP connector, code execution, files, an unpriced "
                                   "context or speed premium)"))
            elif classed.kind == "refused":
                out.append(Finding(m, f"beta {beta!r} is sent and refused ({classed.why})",
                                   "every session on this model would be refused: not qualified"))
        for header in s["headers"]:
            if header not in calls.headers and not header.startswith(calls.header_prefixes):
                out.append(Finding(m, f"header {header!r} is not passed by the gateway", "add it to ProviderCalls.headers "
                                   "(runner/harnesses/claude_code/api.py) once reviewed, or the provider never sees it",
                                   blocking=False))
        for key in s["keys"]:
            if key not in calls.request_keys:
                out.append(Finding(m, f"body key {key!r} is refused by the gateway", "review what it makes the provider "
                                   "do, then add it to ProviderCalls.request_keys"))
        for route in s["routes"]:
            method, _, path = route.partition(" ")
            if method == "HEAD":  # a reachability check: the gateway answers HEAD / itself, another path 404, either is fine
                continue
            if (method, path) not in calls.routes:
                out.append(Finding(m, f"route {route} is refused by the gateway", "add it to ProviderCalls.routes"))
        for query in s["queries"]:
            if query not in calls.queries:
                out.append(Finding(m, f"query string {query!r} is refused by the gateway", "add it to ProviderCalls.queries"))
        for other in sorted(set(s["models"]) - {m}):
            out.append(Finding(m, f"its requests name {other!r} in place of {m!r}",
                               f"the table records it (the gateway then lets a campaign on {m} call it): {REGENERATE}",
                               blocking=False))
        sends = known.sends(m) if known is not None and m in known.models else None
        if sends is None:
            out.append(Finding(m, f"{version} is not in the table with {m}", REGENERATE, table=True))
        else:
            if set(s["betas"]) != set(sends.betas):
                out.append(Finding(m, f"betas differ from the table: +{sorted(set(s['betas']) - sends.betas)} "
                                   f"-{sorted(sends.betas - set(s['betas']))}", REGENERATE, table=True))
            if (s["max_tokens"], s["context_window"]) != (sends.max_tokens, sends.context_window) or set(s["models"]) - {sends.model}:
                out.append(Finding(m, f"max_tokens {s['max_tokens']}, context window {s['context_window']}, models {s['models']} "
                                   f"differ from the table ({sends.max_tokens}, {sends.context_window}, {sends.model})",
                                   REGENERATE, table=True))
        out += _price_findings(r, prices)
        for name, failure in (r.conformance.get("failures") or {}).items():
            out.append(Finding(m, f"conformance session {name}: {failure}", "the recorder's rules do not hold for this "
                               "version: fix the harness package or the transform before it is qualified"))
    return out


def _price_findings(r: ModelResult, prices: Mapping[str, ModelPrice]) -> list[Finding]:
    sent = r.sent["models"][0] if r.sent["models"] else r.model
    price = price_of(prices, sent)
    if any(v is None for v in r.rates.values()):
        return [Finding(r.model, "the CLI's own rates could not be read (no stated cost)", "check the result line")]
    if price is None:
        return [Finding(r.model, f"{sent} has no price at the gateway; the CLI's own: "
                        + ", ".join(f"{k} {_plain(v)}" for k, v in r.rates.items()),
                        f"add it to {PRICES}; until then a budgeted campaign on it is refused at submit")]
    ours = {"input": price.input, "output": price.output, "cache_write": price.cache_write, "cache_read": price.cache_read}
    wrong = [f"{k}: CLI {_plain(v)}, gateway {_plain(ours[k])}" for k, v in r.rates.items() if v is not None and v != ours[k]]
    metered = policy.cost(price, LONG)
    if r.long_usd is not None and abs(metered - r.long_usd) > Decimal("0.000001"):
        wrong.append(f"a prompt over 200k tokens ({LONG}): CLI ${_plain(r.long_usd)}, gateway ${_plain(metered)} "
                     "(a long-context premium: ModelPrice.long_context)")
    return [Finding(r.model, f"{sent}'s price differs from the CLI's arithmetic ({'; '.join(wrong)})",
                    f"correct {PRICES}, or say why the CLI is wrong")] if wrong else []


def report(version: str, cli: str, results: list[ModelResult], prices: Mapping[str, ModelPrice]) -> dict[str, Any]:
    """The whole report: what each model sent, the CLI's rates, the conformance, the findings, the verdict."""
    found = findings(version, results, prices)
    blocked = {f.model for f in found if f.blocking}
    return {
        "version": version,
        "cli": cli,
        "qualified": not blocked,  # with every model asked for
        "models": {r.model: {"qualified": r.model not in blocked and None not in blocked, "sent": r.sent,
                             "cli_rates": {k: _plain(v) for k, v in r.rates.items()},
                             "cli_long_prompt_usd": _plain(r.long_usd), "conformance": r.conformance} for r in results},
        "findings": [f.record() for f in found],
    }


def text(doc: dict[str, Any]) -> str:
    """The report as a reader wants it on a terminal: one line a model, then each finding."""
    ok = [m for m, v in doc["models"].items() if v["qualified"]]
    verdict = "QUALIFIED" if doc["qualified"] else f"NOT QUALIFIED with {len(doc['models']) - len(ok)} of {len(doc['models'])} models"
    lines = [f"Claude Code {doc['version']} ({doc['cli']}): {verdict}"]
    for model, m in doc["models"].items():
        c = m["conformance"]
        conf = "not run" if not c else f"{c.get('passed', 0)}/{c.get('sessions', 0)} conformance sessions as expected"
        lines.append(f"  {'ok ' if m['qualified'] else 'NO '} {model}: sends {', '.join(m['sent']['models']) or '?'}, "
                     f"{len(m['sent']['betas'])} betas, max_tokens {m['sent']['max_tokens']}; {conf}")
    if doc["findings"]:
        lines.append("findings:")
    for f in doc["findings"]:
        lines.append(f"  {'BLOCKS' if f['blocking'] else 'note  '} {f['model'] or '(all)'}: {f['what']}\n"
                     f"         -> {f['todo']}")
    return "\n".join(lines)


def results_of(doc: dict[str, Any]) -> list[ModelResult]:
    """A kept report's observations, to compare again against the table and prices as they are
    now (``report(doc["version"], doc["cli"], results_of(doc), prices)``)."""
    def dec(v: str | None) -> Decimal | None:
        return None if v is None else Decimal(v)

    return [ModelResult(model, m["sent"], {k: dec(v) for k, v in m["cli_rates"].items()}, dec(m.get("cli_long_prompt_usd")),
                        m["conformance"]) for model, m in doc["models"].items()]
