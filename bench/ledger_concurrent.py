"""Ledger appends per second at 2,000 concurrent writers (issue 32, item 2), on the file store
and on S3 (a moto server in a process of its own, over HTTP): each writer is one session's
thread journaling its intent, start and outcome, all released at once. Two ways in the same run:
one append at a time (``max_batch=1``: two store round trips per append, in turn, as the ledger
did before group commit) and group commit (each batch one object and one head put), and their
ratio. Each run's chain is verified and its entries counted before its figure is printed.

    python bench/ledger_concurrent.py [--writers 2000] [--stores file,s3]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from runner.ledger import Ledger
from runner.settings import S3Settings
from runner.store import Store
from runner.store.file import FileStore
from runner.store.s3 import S3Store

DECL = {"probe": "HW-PRB-0001", "arm": "present", "repetition": 1, "plan": "sha256:" + "1" * 64, "corpus": "sha256:" + "2" * 64}


def run(store: Store, campaign: str, writers: int, max_batch: int) -> dict[str, float]:
    """Every writer's three appends at once; appends per second from the release to the last
    return, each append's latency, and the objects the ledger wrote."""
    ledger = Ledger(store, campaign, max_batch=max_batch)
    go = threading.Barrier(writers + 1)
    waits: list[float] = []
    errors: list[BaseException] = []

    def writer(i: int) -> None:
        session = f"HW-PRB-0001/present-{i:05d}"
        go.wait()
        try:
            for step in (lambda: ledger.intent(session, 1, DECL), lambda: ledger.start(session, 1),
                         lambda: ledger.outcome(session, 1, "succeeded", {"cost_usd": "0.01"})):
                t = time.monotonic()
                step()
                waits.append(time.monotonic() - t)
        except BaseException as e:  # counted and raised below: a bench that hides a failure measures nothing
            errors.append(e)

    threading.stack_size(256 * 1024)
    threads = [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    go.wait()
    start = time.monotonic()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - start
    if errors:
        raise RuntimeError(f"{len(errors)} appends failed, the first: {errors[0]!r}")
    fresh = Ledger(store, campaign)
    problems = fresh.verify()
    assert not problems and len(fresh.entries) == 3 * writers, (problems, len(fresh.entries))
    waits.sort()
    return {"rate": 3 * writers / elapsed, "seconds": elapsed, "objects": len(store.list(fresh.prefix)),
            "p50": statistics.median(waits), "p99": waits[int(0.99 * (len(waits) - 1))]}


def moto() -> tuple[subprocess.Popen[bytes], str]:
    """A moto server in its own process, so its CPU is not the writers' interpreter's."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("the moto server did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--writers", type=int, default=2000)
    ap.add_argument("--stores", default="file,s3")
    args = ap.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    print(f"{args.writers} writers at once, 3 appends each ({3 * args.writers} appends per run)")
    for name in args.stores.split(","):
        with tempfile.TemporaryDirectory() as d:
            proc = None
            if name == "file":
                store: Store = FileStore(Path(d))
            else:
                import boto3

                proc, endpoint = moto()
                boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="bench")
                store = S3Store("bench", "ledger", S3Settings(endpoint_url=endpoint, region="us-east-1"))
            try:
                rows = {way: run(store, f"bench-{way}", args.writers, batch)
                        for way, batch in (("one at a time", 1), ("group commit", 10_000))}
            finally:
                if proc is not None:
                    proc.terminate()
                    proc.wait()
        for way, r in rows.items():
            print(f"  {name:4} {way:13} {r['rate']:8.0f} appends/s  ({r['seconds']:6.2f} s, {r['objects']:>5} objects, "
                  f"append p50 {r['p50'] * 1000:7.1f} ms, p99 {r['p99'] * 1000:7.1f} ms)")
        print(f"  {name:4} group commit / one at a time: {rows['group commit']['rate'] / rows['one at a time']['rate']:.1f}x")


if __name__ == "__main__":
    main()
