"""The ledger's group commit (issue 32, item 2) on both product stores, the file backend and S3
through moto's server over real HTTP: appends that arrive together are written as one batch
object, each caller answered alone, and the chain stays whole whatever fails."""

from __future__ import annotations

import json
import threading
import time

import boto3
import pytest

from runner import digest, layout
from runner.ledger import GENESIS, Ledger, LedgerEntry, LedgerError, canonical
from runner.settings import S3Settings
from runner.store import Store, StoreError
from runner.store.file import FileStore
from runner.store.s3 import S3Store

DECL = {"probe": "p", "arm": "present", "repetition": 1}
PREFIX = layout.ledger_prefix("c")


@pytest.fixture(params=["file", "s3"])
def store(request, tmp_path, moto_endpoint, monkeypatch) -> Store:
    if request.param == "file":
        return FileStore(tmp_path / "store")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    bucket = f"g-{abs(hash(str(tmp_path))) % 10**8}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    return S3Store(bucket, "runs", S3Settings(endpoint_url=moto_endpoint, region="us-east-1", backoff_seconds=0),
                   spool_dir=tmp_path / "spool")


def objects(store: Store) -> list[list[dict[str, object]]]:
    """Each ledger object's entries, in key order."""
    return [[json.loads(line) for line in store.get(k).splitlines()] for k in store.list(PREFIX)]


class Gate:
    """Holds the ledger's next batch write until released, so callers queue behind it and the
    batch after it is known: the test arranges what one batch holds."""

    def __init__(self, store: Store, monkeypatch: pytest.MonkeyPatch):
        self.entered, self.release = threading.Event(), threading.Event()
        real = store.put

        def put(key: str, data: bytes, *, create_only: bool = False) -> None:
            if create_only and not self.entered.is_set():
                self.entered.set()
                assert self.release.wait(30)
            real(key, data, create_only=create_only)

        monkeypatch.setattr(store, "put", put)


def calls(ledger: Ledger, entries: list[LedgerEntry], gate: Gate) -> list[LedgerEntry | Exception]:
    """Append the first entry (held at the gate), queue the others behind it in order, release:
    the others are one batch. Each caller's answer: its entry or its exception."""
    answers: list[LedgerEntry | Exception] = [GENESIS] * len(entries)  # type: ignore[list-item]

    def call(i: int) -> None:
        try:
            answers[i] = ledger.append(entries[i])
        except Exception as e:
            answers[i] = e

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(entries))]
    threads[0].start()
    assert gate.entered.wait(30)
    for i, t in enumerate(threads[1:], start=1):
        t.start()
        deadline = time.monotonic() + 30
        while len(ledger._queue) < i and time.monotonic() < deadline:  # queued in this order
            time.sleep(0.001)
    gate.release.set()
    for t in threads:
        t.join(30)
    return answers


def test_concurrent_appends_each_get_their_own_durable_entry_in_batches(store, monkeypatch):
    """200 callers at once: each gets its own entry, as stored; the seqs run 0..199 with no gap;
    the chain verifies; and the entries went out in far fewer objects than entries (one lock
    around every append wrote 200)."""
    real = store.put

    def slow(key: str, data: bytes, *, create_only: bool = False) -> None:
        time.sleep(0.02)  # a store round trip long enough for callers to queue behind it
        real(key, data, create_only=create_only)

    monkeypatch.setattr(store, "put", slow)
    ledger = Ledger(store, "c")
    n = 200
    start = threading.Barrier(n)
    got: dict[int, LedgerEntry] = {}

    def call(i: int) -> None:
        start.wait()
        got[i] = ledger.intent(f"p/s-{i:03d}", 1, DECL)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [got[i]["session"] for i in range(n)] == [f"p/s-{i:03d}" for i in range(n)]
    assert sorted(e["seq"] for e in got.values()) == list(range(n))
    stored = [e for batch in objects(store) for e in batch]
    assert stored == sorted(got.values(), key=lambda e: e["seq"])
    assert len(objects(store)) < n / 4
    fresh = Ledger(store, "c")
    assert fresh.verify() == [] and fresh.entries == stored


def test_a_refused_entry_in_a_batch_fails_only_its_caller_and_each_is_checked_after_the_ones_before(store, monkeypatch):
    """One batch of seven: a start with no intent and a changed intent are refused to their
    callers alone; an exact retry gets the entry already journaled; a start and an outcome
    whose intent came earlier in the same batch are allowed, and a retry of that intent gets
    the batch's own entry. The five written entries are one object after the held one."""
    ledger = Ledger(store, "c")
    gate = Gate(store, monkeypatch)
    answers = calls(ledger, [
        {"type": "intent", "session": "p/a", "attempt": 1, "declaration": DECL},  # held: batch 1
        {"type": "start", "session": "p/b", "attempt": 1},  # no intent: refused
        {"type": "intent", "session": "p/b", "attempt": 1, "declaration": DECL},
        {"type": "start", "session": "p/b", "attempt": 1},  # after the intent before it in the batch
        {"type": "intent", "session": "p/a", "attempt": 1, "declaration": DECL},  # exact retry
        {"type": "intent", "session": "p/a", "attempt": 1, "declaration": {**DECL, "repetition": 2}},  # changed
        {"type": "intent", "session": "p/b", "attempt": 1, "declaration": DECL},  # retry of this batch's entry
        {"type": "outcome", "session": "p/b", "attempt": 1, "status": "succeeded", "detail": {}},
    ], gate)
    assert isinstance(answers[1], LedgerError) and "not allowed while it is pending" in str(answers[1])
    assert isinstance(answers[5], LedgerError) and "a different intent entry" in str(answers[5])
    assert answers[4] == answers[0] and answers[6] == answers[2]
    assert [(a["type"], a["seq"]) for a in (answers[0], answers[2], answers[3], answers[7])] == [
        ("intent", 0), ("intent", 1), ("start", 2), ("outcome", 3)]
    assert objects(store) == [[answers[0]], [answers[2], answers[3], answers[7]]]
    assert Ledger(store, "c").verify() == [] and Ledger(store, "c").state("p/b").status == "succeeded"


def test_a_batch_whose_write_fails_tells_each_caller_and_leaves_no_gap(store, monkeypatch):
    """The second batch's object put fails: each of its callers gets the error, nothing of it
    is stored, and the ledger goes on from the same seq: the next append is seq 1, the chain
    verifies, and the failed callers' retries are journaled after it."""
    ledger = Ledger(store, "c")
    gate = Gate(store, monkeypatch)
    held = store.put
    failing = {"on": True}

    def put(key: str, data: bytes, *, create_only: bool = False) -> None:
        if create_only and key.endswith("0000000001.json") and failing["on"]:
            raise StoreError(f"{key}: the store went away")
        held(key, data, create_only=create_only)

    monkeypatch.setattr(store, "put", put)
    batch = [{"type": "intent", "session": f"p/s{i}", "attempt": 1, "declaration": DECL} for i in range(5)]
    answers = calls(ledger, batch, gate)  # type: ignore[arg-type]
    assert answers[0]["seq"] == 0  # type: ignore[index]
    assert [str(a) for a in answers[1:]] == [f"{PREFIX}0000000001.json: the store went away"] * 4, answers
    assert objects(store) == [[answers[0]]] and ledger.verify() == [] and len(ledger.entries) == 1
    assert ledger.state("p/s1").status == "pending"  # nothing of the failed batch was applied
    failing["on"] = False
    again = [ledger.append(e) for e in batch[1:]]  # type: ignore[arg-type]
    assert [e["seq"] for e in again] == [1, 2, 3, 4] and again[0]["prev"] == answers[0]["hash"]  # type: ignore[index]
    assert Ledger(store, "c").verify() == []


def test_a_batch_stored_though_its_put_reported_failure_is_found_by_the_retry(store, monkeypatch):
    """The object is stored but its put raises (a reply lost after the write, the retry policy
    run out): the callers get the error; their retries find their entries journaled, not new
    ones, and the chain verifies."""
    ledger = Ledger(store, "c")
    real = store.put

    def put(key: str, data: bytes, *, create_only: bool = False) -> None:
        real(key, data, create_only=create_only)
        if create_only:
            raise StoreError(f"{key}: no reply")

    monkeypatch.setattr(store, "put", put)
    with pytest.raises(StoreError):
        ledger.intent("p/s", 1, DECL)
    monkeypatch.setattr(store, "put", real)
    first = ledger.intent("p/s", 1, DECL)
    assert first["seq"] == 0 and len(ledger.entries) == 1 and ledger.verify() == []
    assert ledger.start("p/s", 1)["seq"] == 1


def test_two_ledgers_with_many_callers_each_on_one_store_lose_nothing(store):
    """Two writers (two Ledger objects, as two controllers), 40 callers each at once: every
    entry is journaled once, at the seq its caller was told, and the chain verifies."""
    a, b = Ledger(store, "c"), Ledger(store, "c")
    n = 40
    start = threading.Barrier(2 * n)
    got: dict[str, LedgerEntry] = {}

    def call(ledger: Ledger, name: str) -> None:
        start.wait()
        got[name] = ledger.intent(name, 1, DECL)

    threads = [threading.Thread(target=call, args=(lg, f"p/{w}-{i}")) for i in range(n) for lg, w in ((a, "a"), (b, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    fresh = Ledger(store, "c")
    assert fresh.verify() == []
    assert sorted(e["seq"] for e in fresh.entries) == list(range(2 * n))
    assert {e["session"]: e for e in fresh.entries} == got


def _chained(entries: list[dict[str, object]]) -> list[dict[str, object]]:
    out, prev = [], GENESIS
    for seq, e in enumerate(entries):
        full = {**e, "at": "2026-12-01T00:00:00.000Z", "seq": seq, "prev": prev}
        full["hash"] = prev = digest.of_bytes(canonical(full))
        out.append(full)
    return out


def test_a_ledger_written_one_object_per_entry_reads_verifies_and_grows(store):
    """A ledger as the ledger wrote it before group commit (one object per entry, its head
    anchored) is read, verifies, takes a batch on top and exports every entry in order."""
    old = _chained([{"type": "intent", "session": "p/s", "attempt": 1, "declaration": DECL},
                    {"type": "start", "session": "p/s", "attempt": 1}])
    for e in old:
        store.put(f"{PREFIX}{e['seq']:010d}.json", canonical(e) + b"\n", create_only=True)
    store.put(layout.ledger_head_key("c"), canonical({"seq": 1, "hash": old[1]["hash"]}) + b"\n")
    ledger = Ledger(store, "c")
    assert ledger.entries == old and ledger.state("p/s").status == "started" and ledger.verify() == []
    assert ledger.outcome("p/s", 1, "succeeded")["prev"] == old[1]["hash"]
    data, _ = ledger.export()
    assert [json.loads(r)["seq"] for r in data.splitlines()] == [0, 1, 2]


def test_verify_finds_an_entry_cut_from_a_batch_object(store, monkeypatch):
    """The batch object's own break: its last line removed. The next object then starts one
    seq past where the chain ends; with that object gone too, the head tells."""
    ledger = Ledger(store, "c")
    gate = Gate(store, monkeypatch)
    calls(ledger, [{"type": "intent", "session": f"p/s{i}", "attempt": 1, "declaration": DECL} for i in range(4)], gate)  # type: ignore[misc]
    ledger.intent("p/last", 1, DECL)
    keys = store.list(PREFIX)
    assert [len(b) for b in objects(store)] == [1, 3, 1]
    store.put(keys[1], b"".join(store.get(keys[1]).splitlines(keepends=True)[:2]))
    removed = "the chain ends at entry 2, but entry 4 was its head: entries were removed"
    assert Ledger(store, "c").verify() == ["entry 3 is missing (found 0000000004.json in its place)", removed]
    store.delete(keys[2])
    assert Ledger(store, "c").verify() == [removed]
