"""Ledger appends stay flat as a campaign grows: the CPU of the last 1,000 sessions' appends
(intent, start, outcome) of an N-session campaign against that of the first 1,000, in the
same run, on the file store. A ledger that rescans its chain per append shows a ratio near
N/1000 (8.5 s vs 0.2 s per 1,000 sessions were measured here before the fix); a flat one, 1.

    python bench/ledger.py [--sessions 5000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from runner.ledger import Ledger
from runner.store.file import FileStore

BLOCK = 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=5000)
    n = max(2 * BLOCK, ap.parse_args().sessions)
    with tempfile.TemporaryDirectory() as d:
        ledger = Ledger(FileStore(Path(d)), "bench")
        blocks = []
        t = time.process_time()
        for i in range(n):
            key = f"HW-PRB-0001/present-{i:05d}"
            ledger.intent(key, 1, {"repetition": i})
            ledger.start(key, 1)
            ledger.outcome(key, 1, "succeeded", {})
            if (i + 1) % BLOCK == 0:
                now = time.process_time()
                blocks.append(now - t)
                t = now
        print(f"{n} sessions, {len(ledger.entries)} entries")
        for j, cpu in enumerate(blocks):
            print(f"  sessions {j * BLOCK + 1:>6}-{(j + 1) * BLOCK:<6} CPU {cpu:6.2f} s")
        print(f"last / first 1,000 sessions: {blocks[-1] / blocks[0]:.2f}x (flat: 1)")


if __name__ == "__main__":
    main()
