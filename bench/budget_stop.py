"""How the real Claude Code CLI stops at --max-budget-usd (issue 15, item 4: "measure how the
CLI 2.1.197 stops at its limit"): the campaign's reservation per session is the session limit
plus the most one call can add past it, so that figure must come from the CLI itself.

The scripted provider (runner/demo/provider.py) answers every main-loop call with the same
usage, so each call costs the same known amount at the CLI's own prices; the CLI runs with
several limits, and each run prints the calls made, the realized cost (the result line's
total_cost_usd), how far past the limit it went, and that overshoot as a fraction of one call.

    python bench/budget_stop.py                      # 100k input + 1k output tokens a call
    python bench/budget_stop.py --input 1200 --output 80
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from decimal import Decimal
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runner.demo.provider import ScriptedProvider  # noqa: E402

MODEL = "claude-sonnet-4-5-20250929"


def one(limit: str, usage: dict[str, int], calls: int) -> tuple[int, Decimal, str]:
    doc = {"scenarios": [{"name": "glob", "model": MODEL, "usage": usage,
                          "turns": [{"tool_uses": [{"name": "Glob", "input": {"pattern": f"*{i}"}}]} for i in range(calls)]
                          + [{"text": "done"}]}]}
    with ScriptedProvider(doc) as provider, tempfile.TemporaryDirectory() as home:
        work = Path(home) / "w"
        work.mkdir()
        env = {"PATH": os.environ["PATH"], "HOME": home, "CLAUDE_CONFIG_DIR": f"{home}/config",
               "ANTHROPIC_BASE_URL": provider.base_url, "ANTHROPIC_API_KEY": "k", "DISABLE_AUTOUPDATER": "1"}
        out = subprocess.run([shutil.which("claude") or "claude", "-p", "list the files", "--output-format", "stream-json",
                              "--verbose", "--model", MODEL, "--allowedTools", "Glob", "--max-budget-usd", limit],
                             cwd=work, env=env, capture_output=True, text=True, timeout=600)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        return len(provider.main_loop_requests()), Decimal(str(result["total_cost_usd"])), result["subtype"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", type=int, default=100_000, help="input tokens per call (default 100000)")
    ap.add_argument("--output", type=int, default=1_000, help="output tokens per call (default 1000)")
    ap.add_argument("--limits", default="0.0001,0.3,0.315,0.62,0.95", help="comma-separated --max-budget-usd values")
    args = ap.parse_args()
    usage = {"input_tokens": args.input, "output_tokens": args.output}
    n, cost, _ = one("1000", usage, 1)  # one call and a final answer: the cost of one call is the first's
    per_call = cost / n
    print(f"claude {subprocess.run(['claude', '--version'], capture_output=True, text=True).stdout.strip()}; "
          f"one call of {args.input} input + {args.output} output tokens of {MODEL} costs ${per_call:.6f}")
    print("| limit | calls | realized | past the limit | as a share of one call | result |")
    print("| --- | --- | --- | --- | --- | --- |")
    for limit in args.limits.split(","):
        calls, realized, subtype = one(limit, usage, 12)
        past = realized - Decimal(limit)
        print(f"| ${limit} | {calls} | ${realized:.6f} | ${past:.6f} | {past / per_call:.3f} | {subtype} |")


if __name__ == "__main__":
    main()
