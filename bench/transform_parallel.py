"""The transform on every core (issue 17, item 3): wall throughput of ``transform_campaign``
with 1 and with N worker processes, against the single-core parse floor, measured in one run.

Writes a campaign into a file store: bench/transform.py's realistic streams (long tool
results, heredocs, subagent lines), each under a session of one plan, with the ledger entries,
capture records and seal records a run leaves. Then, in ``--repeat`` rounds (default 3), each
round in turn:

* floor: one process splits every stream into lines and parses each with orjson, the fastest
  JSON parser here (bench/transform.py's floor), reading the same files;
* the contract's least: the floor's parse plus the sha256 of every tool result's bytes, which
  the contract asks of each call's result (the transform spares only reads of sealed documents,
  and these streams read none); no transform that parses with orjson can do less on one core,
  so N times its rate is the most N cores can give;
* the transform with ``workers=1``: what ``probe-runner transform`` does in one process;
* the transform with ``workers=N`` (default: the usable CPUs): the streams parsed by a pool of
  spawned processes.

Rates are MB of streams per wall second (the page cache warm). Each ratio is the median of the
rounds'. The N-worker transcripts and refusals must equal the one-process ones, byte for byte.
Peak RSS is each pool process's own (``VmHWM``) after a pass over every session. The last line is the
verdict against the goal: N-worker wall throughput at least 1.5x the single-core floor.

Usage: ``python3 bench/transform_parallel.py [--size 256MiB] [--workers N] [--repeat 3] [--dir DIR]``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from runner import layout, stream  # noqa: E402
from runner.corpus import load_identifiers  # noqa: E402
from runner.ledger import Ledger  # noqa: E402
from runner.plan import Plan, parse_plan  # noqa: E402
from runner.settings import usable_cpus  # noqa: E402
from runner.store.file import FileStore  # noqa: E402
from runner.transform import run as transform_run  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_transform", ROOT / "bench" / "transform.py")
assert _spec and _spec.loader
streams = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(streams)

GOAL = 1.5
CAMPAIGN = "bench-parallel"


def make_campaign(root: Path, size: int, result_kb: int) -> tuple[FileStore, Plan, list[Path]]:
    """A campaign of one arm whose sessions' streams are bench/transform.py's corpus."""
    scratch = root / "streams"
    scratch.mkdir(parents=True)
    files = streams.generate(scratch, size, result_kb * 1024)
    plan = parse_plan({
        "campaign": CAMPAIGN, "tier": "campaign", "model": "claude-sonnet-4-5",
        "identity": {k: "sha256:" + c * 64 for k, c in (("lock", "1"), ("tree", "2"), ("selection", "3"), ("read_set", "4"))}
        | {"seed": 7, "harness": "headwater 0.9.1"},
        "arms": ["present"], "repetitions": len(files), "identifier_pattern": "HW-[A-Z]+-[0-9]{4}",
        "probes": [{"id": "HW-PRB-0001", "path": "docs/probes/p.md", "title": "Status of HW-DR-0052",
                    "task": "State the status.", "answers": ["current HW-DR-0052"], "examines": []}],
    })
    store = FileStore(root / "store")
    store.put(layout.plan_key(CAMPAIGN), plan.canonical_json())
    store.put(layout.identifiers_key(CAMPAIGN), json.dumps({"identifiers": ["HW-DR-0052"]}).encode())
    ledger = Ledger(store, CAMPAIGN)
    placed = []
    for spec, path in zip(plan.sessions(), files, strict=True):
        keys = layout.SessionKeys(CAMPAIGN, spec.probe, spec.name)
        data = path.read_bytes()
        store.put(keys.stream, data)
        store.put(keys.seal, json.dumps({"manifest": {}}).encode())
        store.put(keys.capture, json.dumps({
            "workspace": streams.WORKSPACE, "config_dir": streams.CONFIG, "executor": "local",
            "started_at": "2026-12-04T10:00:00.000Z", "ended_at": "2026-12-04T10:05:00.000Z",
            "harness": {"allowed_tools": ["Read", "Grep", "Glob", "Edit", "Write", "Bash"]},
            "confinement": "bench", "artifacts": {"changed": {}, "deleted": [], "links": {}, "stored": []},
        }).encode())
        ledger.intent(spec.key, 1, {})
        ledger.start(spec.key, 1)
        ledger.outcome(spec.key, 1, "succeeded", {"stream": {"key": keys.stream, "bytes": len(data),
                                                             "sha256": "sha256:" + hashlib.sha256(data).hexdigest()},
                                                  "exit_code": 0, "timed_out": False})
        placed.append(store.root / keys.stream)
    shutil.rmtree(scratch)
    return store, plan, placed


def floor(files: list[Path]) -> float:
    t = time.perf_counter()
    for p in files:
        with open(p, "rb") as f:
            for line in f:
                orjson.loads(line)
    return time.perf_counter() - t


def least(files: list[Path]) -> float:
    t = time.perf_counter()
    for p in files:
        with open(p, "rb") as f:
            for line in f:
                obj = orjson.loads(line)
                if obj.get("type") == "user" and isinstance(content := obj["message"].get("content"), list):
                    for block in content:
                        if isinstance(block, dict) and block.get("type") == "tool_result":
                            hashlib.sha256(stream.result_bytes(block.get("content"))).digest()
    return time.perf_counter() - t


def transform(store: FileStore, plan: Plan, workers: int) -> tuple[float, transform_run.Transformed]:
    t = time.perf_counter()
    done = transform_run.transform_campaign(store, plan, workers=workers)
    return time.perf_counter() - t, done


def _peak(delay: float) -> tuple[int, int]:
    """(pid, VmHWM in KiB) of the pool process that runs it. VmHWM, not ru_maxrss: a spawned
    process's ru_maxrss starts from its parent's RSS at the fork before its exec."""
    time.sleep(delay)  # so that each process of the pool takes one
    status = Path("/proc/self/status").read_text()
    return os.getpid(), int(status.split("VmHWM:")[1].split()[0])


def worker_peaks(store: FileStore, plan: Plan, workers: int) -> list[int]:
    """Each pool process's peak RSS (MiB) after parsing every session as transform_campaign's
    pool does (the same initializer and task)."""
    keys = [layout.SessionKeys(CAMPAIGN, s.probe, s.name) for s in plan.sessions()]
    with transform_run.parse_pool(store, plan, load_identifiers(store, CAMPAIGN), workers) as pool:
        list(pool.map(transform_run._worker_outcome, keys))
        return sorted(kib // 1024 for kib in dict(pool.map(_peak, [0.3] * workers * 2)).values())


def pool_start(store: FileStore, plan: Plan, workers: int) -> float:
    """What a pool costs before it parses anything: spawning, importing the runner, and
    unpickling the store and plan each process parses against."""
    t = time.perf_counter()
    with transform_run.parse_pool(store, plan, frozenset(), workers) as pool:
        list(pool.map(abs, range(workers * 4)))
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=streams._size, default=256 << 20, help="bytes of streams (default 256MiB)")
    ap.add_argument("--result-kb", type=int, default=20, help="tool result size in KB (default 20)")
    ap.add_argument("--workers", type=int, default=usable_cpus(), help="worker processes (default: the usable CPUs)")
    ap.add_argument("--repeat", type=int, default=3, help="rounds (default 3)")
    ap.add_argument("--dir", type=Path, default=None, help="where to write the campaign (default: a temp dir, removed)")
    args = ap.parse_args()
    own = args.dir is None
    root = Path(tempfile.mkdtemp(prefix="bench-transform-parallel-")) if own else args.dir
    try:
        t = time.perf_counter()
        store, plan, files = make_campaign(root, args.size, args.result_kb)
        total = sum(p.stat().st_size for p in files)
        print(f"campaign: {len(files)} sessions, {total / 1e6:.0f} MB of streams, written in {time.perf_counter() - t:.0f} s; "
              f"{args.workers} workers on {usable_cpus()} usable CPUs")
        floor(files)  # once, so every measurement starts from the page cache
        rounds = []
        for _ in range(args.repeat):
            f, bound = floor(files), least(files)
            one, single = transform(store, plan, 1)
            many, pooled = transform(store, plan, args.workers)
            assert pooled.transcripts == single.transcripts and pooled.report.refusals == single.report.refusals, \
                "the pool's transcripts differ from one process's"
            rounds.append({"floor": f, "least": bound, "one": one, "many": many})
        rate = {k: total / statistics.median(r[k] for r in rounds) / 1e6 for k in ("floor", "least", "one", "many")}
        ratio = {k: statistics.median(r["floor"] / r[k] for r in rounds) for k in ("least", "one", "many")}
        speedup = statistics.median(r["one"] / r["many"] for r in rounds)
        print(f"floor (orjson, one process)        {rate['floor']:7.1f} MB/s")
        print(f"parse + result digests (the least) {rate['least']:7.1f} MB/s   {ratio['least']:.2f}x floor: at most "
              f"{args.workers * ratio['least']:.2f}x floor on {args.workers} cores, whatever else the transform did")
        print(f"transform, 1 process               {rate['one']:7.1f} MB/s   {ratio['one']:.2f}x floor, "
              f"{ratio['one'] / ratio['least']:.2f}x the least")
        print(f"transform, {args.workers} processes             {rate['many']:7.1f} MB/s   {ratio['many']:.2f}x floor, "
              f"{speedup:.2f}x one process")
        each = ", ".join(f"{r['floor'] / r['many']:.2f}" for r in rounds)
        print(f"(medians of {args.repeat} rounds; each round's x floor with {args.workers}: {each}); "
              "transcripts byte-identical in every round")
        print(f"pool processes' peak RSS (VmHWM) after parsing every session: {', '.join(f'{m} MiB' for m in worker_peaks(store, plan, args.workers))}; "
              f"a pool of {args.workers} starts in {pool_start(store, plan, args.workers):.2f} s")
        verdict = "holds" if ratio["many"] >= GOAL else "does not hold"
        print(f"verdict: {args.workers}-process wall throughput {ratio['many']:.2f}x the single-core floor; "
              f"goal >= {GOAL}x {verdict} (the parse and the result digests alone allow at most "
              f"{args.workers * ratio['least']:.2f}x on {args.workers} cores)")
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
