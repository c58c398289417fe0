"""Coverage-guided fuzzing (atheris) of every parser that reads input a user or a session wrote.

Bad input must end in a refusal with a reason, never in a traceback, and never in data lost on
the way to a transcript. One harness covers four targets; the first byte of an input picks one:

0. the plan loader (``load_plan`` over a ``.json`` or ``.yml`` file): only ``UserError``;
1. ``.headwater/probe.yml`` (``load_probe_config``): only ``UserError``;
2. the stream parser and the transform: no exception at all, and every event the transform
   derives renders to a transcript that intake accepts and reads back unchanged (so nothing
   the stream gave is lost or altered between the event and the file);
3. the transcript parser and intake's confirmations (``intake.confirm``): no exception.

Any other exception is a crasher. The harness records it and carries on, so one run collects
every distinct crash site (deduplicated by exception type and the innermost frame of
``runner``) instead of stopping at the first. Crashers land in ``--crashers`` (default
``tests/data/fuzz/``) as ``<target>-<hash>.bin``; ``tests/unit/test_fuzz_regressions.py``
replays every file there.

Usage: ``nice -n 19 python3 bench/fuzz.py --minutes 10`` (extra arguments go to libFuzzer). At
the end libFuzzer prints ``Done N runs in S second(s)`` and its final stats; each crasher is
printed as it is found (``CRASHER name: exception at site``).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # tests/fuzz_targets.py: the fuzz targets


def _seeds() -> list[bytes]:
    """Valid inputs of each target, so mutation starts from the real formats."""
    plan = (ROOT / "runner/demo/plan.json").read_bytes()
    probe_yml = (ROOT / "runner/demo/corpus/.headwater/probe.yml").read_bytes()
    seeds = [bytes([0]) + plan, bytes([1]) + probe_yml]
    streams = sorted((ROOT / "tests/data").rglob("*.jsonl"))
    seeds += [bytes([2]) + p.read_bytes()[:200_000] for p in streams]
    import fuzz_targets

    seeds.append(bytes([3]) + fuzz_targets.sample_transcript().encode())
    return seeds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--crashers", type=Path, default=ROOT / "tests/data/fuzz")
    ap.add_argument("--corpus", type=Path, default=None, help="working corpus directory (default: a temp dir)")
    args, rest = ap.parse_known_args()

    import atheris

    with atheris.instrument_imports(include=["runner"]):
        import fuzz_targets

    args.crashers.mkdir(parents=True, exist_ok=True)
    corpus = args.corpus or Path(tempfile.mkdtemp(prefix="fuzz-corpus-"))
    corpus.mkdir(parents=True, exist_ok=True)
    for seed in _seeds():
        (corpus / hashlib.sha256(seed).hexdigest()[:16]).write_bytes(seed)
    scratch = Path(tempfile.mkdtemp(prefix="fuzz-scratch-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    seen: set[tuple] = set()

    def one(data: bytes) -> None:
        if not data:
            return
        target = fuzz_targets.TARGETS[data[0] % len(fuzz_targets.TARGETS)]
        try:
            fuzz_targets.run(target, data[1:], scratch)
        except Exception as e:  # noqa: BLE001 - a crasher is exactly an unexpected exception
            frames = [f for f in traceback.extract_tb(e.__traceback__) if "/runner/" in f.filename]
            site = (target, type(e).__name__, (frames[-1].filename, frames[-1].lineno) if frames else None)
            if site in seen:
                return
            seen.add(site)
            name = f"{target}-{hashlib.sha256(data).hexdigest()[:16]}.bin"
            (args.crashers / name).write_bytes(data)
            print(f"CRASHER {name}: {type(e).__name__}: {str(e)[:200]} at {site[2]}", flush=True)

    seconds = int(args.minutes * 60)
    argv = [sys.argv[0], str(corpus), f"-max_total_time={seconds}", "-timeout=20", "-rss_limit_mb=4096",
            "-max_len=65536", "-print_final_stats=1", *rest]
    atheris.Setup(argv, one)
    atheris.Fuzz()  # exits the process when the time is up, printing libFuzzer's final stats


if __name__ == "__main__":
    main()
