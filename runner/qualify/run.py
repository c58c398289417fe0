"""A whole qualification: the CLI found (a path, or a version fetched from the npm registry),
each model observed and its conformance campaign run, a few models at once, then the report
(runner/qualify/report.py) written where asked."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from runner import harnesses
from runner.errors import UserError
from runner.qualify import conformance, fetch, observe, report
from runner.settings import Settings


def resolve(cli: str) -> tuple[Path, str]:
    """The CLI's executable and the version it reports: ``cli`` is a path to one, or a version
    the npm registry serves (fetched into the cache once)."""
    path = Path(cli)
    if not (path.is_file() and os.access(path, os.X_OK)):
        if os.sep in cli or not fetch.VERSION.match(cli):
            raise UserError(f"--cli {cli!r} is neither an executable file nor a version like {harnesses.HARNESS.version}")
        path = fetch.fetch(cli)
    try:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60,
                             env={"PATH": "/usr/bin:/bin", "HOME": "/tmp", "DISABLE_AUTOUPDATER": "1"})
    except (OSError, subprocess.TimeoutExpired) as e:
        raise UserError(f"{path} --version did not answer: {e}") from None
    version = out.stdout.split()[0] if out.returncode == 0 and out.stdout.split() else ""
    if not fetch.VERSION.match(version):
        raise UserError(f"{path} --version said {out.stdout.strip()[:80]!r} (exit {out.returncode}): not a Claude Code CLI")
    return path.resolve(), version


def qualify(settings: Settings, cli: str, models: list[str], jobs: int, conform: bool,
            say: Callable[[str], None]) -> dict[str, Any]:
    """The report of qualifying ``cli`` with ``models`` (default: every model a qualified
    version knows), ``jobs`` models at once; ``say`` is told of each model as it ends."""
    path, version = resolve(cli)
    wanted = models or harnesses.HARNESS.models()
    say(f"qualifying Claude Code {version} ({path}) with {len(wanted)} model(s): {', '.join(wanted)}")

    def one(model: str) -> report.ModelResult:
        sent, rates, long = observe.observe(path, model)
        result = report.ModelResult(model, sent.record(), rates, long)
        if conform:
            try:
                result.conformance = conformance.run(path, model, sorted(sent.models)).record()
            except UserError as e:  # the run refused before a session ran: a finding, not the end of the others
                result.conformance = {"sessions": 0, "passed": 0, "failures": {"(campaign)": str(e)}}
        c = result.conformance
        say(f"  {model}: {len(sent.betas)} betas, ended {sent.ended}"
            + (f"; conformance {c['passed']}/{c['sessions']}" if c else ""))
        return result

    with ThreadPoolExecutor(max_workers=max(1, jobs), thread_name_prefix="qualify") as pool:
        results = list(pool.map(one, wanted))
    return report.report(version, str(path), results, settings.gateway.prices)


def write(doc: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, out)
