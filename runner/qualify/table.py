"""The harness's table of qualified versions (runner/harnesses/claude_code/qualified.py) written
from kept qualification reports, so that what the gateway allows is exactly what was observed:
``python -m runner.qualify.table docs/qualification/*.json > runner/harnesses/claude_code/qualified.py``.
A model enters a version's table only where its report found nothing blocking for it."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path
from typing import Any

from runner.harnesses.contract import Sends

HEADER = '''"""What each qualified CLI version sends its provider with each model it was qualified with,
as its qualification report found it (docs/qualification/VERSION.json, `probe-runner harness
qualify`), written by ``python -m runner.qualify.table docs/qualification/*.json``: edit the
reports' source, not this file (tests/unit/test_qualified.py holds the two equal). The gateway
reads it through ``Harness.qualified``. Pure: no I/O."""

from __future__ import annotations

from runner.harnesses.contract import Qualified, Sends


def _sends(model: str, max_tokens: int, context_window: int | None, *betas: str) -> Sends:
    return Sends(model, frozenset(betas), max_tokens, context_window)


QUALIFIED: dict[str, Qualified] = {
'''


def sends_of(doc: dict[str, Any]) -> dict[str, Sends]:
    """The models a report qualifies, each with what it sent."""
    blocked = {f["model"] for f in doc["findings"] if f["blocking"] and not f.get("table")}
    return {model: Sends(m["sent"]["models"][0], frozenset(m["sent"]["betas"]), m["sent"]["max_tokens"], m["sent"]["context_window"])
            for model, m in sorted(doc["models"].items()) if model not in blocked and None not in blocked and m["sent"]["models"]}


def render(docs: list[dict[str, Any]]) -> str:
    out = [HEADER]
    for doc in sorted(docs, key=lambda d: [int(x) for x in d["version"].split(".")], reverse=True):
        out.append(f'    "{doc["version"]}": Qualified("{doc["version"]}", {{\n')
        for model, s in sends_of(doc).items():
            betas = textwrap.wrap(", ".join(f'"{b}"' for b in sorted(s.betas)), 120, initial_indent=" " * 12,
                                  subsequent_indent=" " * 12, break_on_hyphens=False, break_long_words=False)
            out.append(f'        "{model}": _sends("{s.model}", {s.max_tokens}, {s.context_window},\n'
                       + "\n".join(betas) + "),\n")
        out.append("    }),\n")
    out.append("}\n")
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print("usage: python -m runner.qualify.table REPORT.json ...", file=sys.stderr)
        return 2
    sys.stdout.write(render([json.loads(Path(p).read_text()) for p in paths]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
