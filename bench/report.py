"""The campaign report at scale: how long ``probe-runner report`` takes to write the page and
how long Debian's headless Chromium takes to load and draw it, for a campaign of ``--sessions``
sessions against one of 8 (the demo's size) as the baseline, measured in the same run.

Both campaigns are written into file stores from bench/transform.py's stream generator (short
sessions of ``--session-kb`` each, one arm), with the ledger entries, capture and seal records
a run leaves (bench/transform_parallel.py's ``make_campaign``). For each, in ``--repeat`` rounds:

* write: ``probe-runner report`` as a user runs it (a child process, the install's settings);
* load: Chromium opens the file (Playwright); the time until all four charts are drawn. Any
  console error or page error fails the run.

Prints the page's size, the medians, and the ratios to the baseline.

Usage: ``python3 bench/report.py [--sessions 900] [--session-kb 100] [--repeat 3]``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("transform_parallel", ROOT / "bench" / "transform_parallel.py")
assert _spec and _spec.loader
campaigns = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(campaigns)

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def write(store: Path, out: Path) -> float:
    t = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "runner", "report", campaigns.CAMPAIGN, "--store", store.as_uri(),
                           "--out", str(out)], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode != 0:
        raise SystemExit(f"report failed: {done.stderr}")
    return time.perf_counter() - t


def load(browser, page_file: Path) -> float:
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    t = time.perf_counter()
    page.goto(page_file.as_uri(), wait_until="load")
    for chart in ("outcomes", "cost", "duration", "calls"):
        page.locator(f"#chart-{chart} .main-svg").first.wait_for(state="visible", timeout=120_000)
    took = time.perf_counter() - t
    page.close()
    if problems:
        raise SystemExit(f"{page_file}: {problems}")
    return took


def main() -> None:
    from playwright.sync_api import sync_playwright

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=900, help="sessions of the large campaign (default 900, at most 999)")
    ap.add_argument("--session-kb", type=int, default=100, help="stream size of one session in KB (default 100)")
    ap.add_argument("--repeat", type=int, default=3, help="rounds (default 3)")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-report-"))
    try:
        campaigns.streams.SESSION_BYTES = args.session_kb * 1000
        stores = {}
        for name, n in (("baseline", 8), ("large", args.sessions)):
            campaigns.make_campaign(root / name, n * args.session_kb * 1000 - 1, 5)
            stores[name] = root / name / "store"
        times: dict[str, dict[str, list[float]]] = {name: {"write": [], "load": []} for name in stores}
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            for _ in range(args.repeat):
                for name, store in stores.items():
                    out = root / f"{name}.html"
                    times[name]["write"].append(write(store, out))
                    times[name]["load"].append(load(browser, out))
            browser.close()
        med = {name: {k: statistics.median(v) for k, v in t.items()} for name, t in times.items()}
        for name, store in stores.items():
            streams = list((store / "campaigns" / campaigns.CAMPAIGN / "sessions").glob("*/*/stream.jsonl"))
            size = (root / f"{name}.html").stat().st_size
            print(f"{name:>9}: {len(streams):4d} sessions ({sum(p.stat().st_size for p in streams) / 1e6:.0f} MB of streams), "
                  f"page {size / 1e6:.1f} MB, write {med[name]['write']:.2f} s, "
                  f"load and draw {med[name]['load']:.2f} s")
        print(f"large / baseline: write {med['large']['write'] / med['baseline']['write']:.2f}x, "
              f"load and draw {med['large']['load'] / med['baseline']['load']:.2f}x (medians of {args.repeat} rounds; "
              "no console or page error in any)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
