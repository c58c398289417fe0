"""The hash-chained campaign ledger on a FileStore."""

from __future__ import annotations

import json
import threading
import time

import pytest

from runner import digest, layout
from runner.clock import now, timestamp
from runner.ledger import GENESIS, Ledger, LedgerError, canonical, sessions_digest
from runner.store.file import FileStore

DECL = {"probe": "p1", "arm": "present", "repetition": 1}
S = "p1/present-001"


@pytest.fixture
def store(tmp_path):
    return FileStore(tmp_path / "store")


def ledger(store):
    return Ledger(store, "c1")


def keys(store):
    return store.list(layout.ledger_prefix("c1"))


def test_intent_start_outcome(store):
    lg = ledger(store)
    e0 = lg.intent(S, 1, DECL)
    assert lg.state(S).status == "intended"
    e1 = lg.start(S, 1)
    assert lg.state(S).status == "started"
    e2 = lg.outcome(S, 1, "succeeded", {"event": True})
    st = lg.state(S)
    assert st.status == "succeeded" and st.attempt == 1 and st.declaration == DECL and st.detail == {"event": True}
    assert [e["seq"] for e in (e0, e1, e2)] == [0, 1, 2]
    assert e0["prev"] == GENESIS and e1["prev"] == e0["hash"] and e2["prev"] == e1["hash"]
    assert len(keys(store)) == 3
    # a fresh Ledger reads the same state from the store
    assert ledger(store).state(S).status == "succeeded"


def test_exact_retry_returns_same_entry(store):
    lg = ledger(store)
    e0 = lg.intent(S, 1, DECL)
    again = lg.intent(S, 1, DECL)
    assert again == e0
    assert len(keys(store)) == 1
    lg.start(S, 1)
    assert lg.start(S, 1)["seq"] == 1
    assert len(keys(store)) == 2


def test_changed_retry_rejected(store):
    lg = ledger(store)
    lg.intent(S, 1, DECL)
    with pytest.raises(LedgerError):
        lg.intent(S, 1, {**DECL, "repetition": 2})
    assert len(keys(store)) == 1


def test_start_without_intent_rejected(store):
    with pytest.raises(LedgerError):
        ledger(store).start(S, 1)
    assert keys(store) == []


def test_outcome_twice_rejected(store):
    lg = ledger(store)
    lg.intent(S, 1, DECL)
    lg.start(S, 1)
    lg.outcome(S, 1, "succeeded")
    with pytest.raises(LedgerError):
        lg.outcome(S, 1, "failed")
    assert len(keys(store)) == 3


def test_unknown_outcome_rejected(store):
    lg = ledger(store)
    lg.intent(S, 1, DECL)
    with pytest.raises(LedgerError):
        lg.outcome(S, 1, "bogus")


def build(store):
    lg = ledger(store)
    lg.intent(S, 1, DECL)
    lg.start(S, 1)
    lg.outcome(S, 1, "succeeded")
    lg.intent("p2/present-001", 1, DECL)
    return lg


def test_verify_empty_on_good_chain(store):
    assert build(store).verify() == []


def test_verify_detects_modified_entry(store):
    build(store)
    k = keys(store)[1]
    path = store.root / k
    e = json.loads(path.read_bytes())
    e["attempt"] = 2
    path.write_bytes(canonical(e) + b"\n")
    problems = ledger(store).verify()
    assert any("entry 1 was modified" in p for p in problems)


def test_verify_detects_deleted_middle_entry(store):
    lg = build(store)
    (store.root / keys(store)[1]).unlink()
    problems = lg.verify()
    assert problems and "entry 1 is missing" in problems[0]


def test_verify_detects_deleted_entry_from_fresh_ledger(store):
    # removing entry 2 of 4 must be reported even by a fresh Ledger object
    build(store)
    (store.root / keys(store)[2]).unlink()
    assert ledger(store).verify()


@pytest.mark.parametrize("removed", [1, 2])
def test_verify_detects_the_last_entries_deleted(store, removed):
    """The chain without its last entries is still a chain: the anchored head tells (issue 28)."""
    build(store)
    n = len(keys(store))
    for k in keys(store)[-removed:]:
        (store.root / k).unlink()
    assert ledger(store).verify() == [f"the chain ends at entry {n - removed - 1}, but entry {n - 1} was its head: entries were removed"]


def test_verify_detects_a_chain_rewritten_from_an_entry_on(store):
    """Entries from some point on replaced by a chain of their own (each hash right, each prev
    right): the head anchored by the last append is no longer in it."""
    lg = build(store)
    last = keys(store)[-1]
    e = json.loads((store.root / last).read_bytes())
    e["at"] = "2026-01-01T00:00:00.000Z"
    e["hash"] = digest.of_bytes(canonical({k: v for k, v in e.items() if k != "hash"}))
    (store.root / last).write_bytes(canonical(e) + b"\n")
    assert lg.verify() == [f"entry {e['seq']} is not the head that was anchored: the chain was rewritten"]


def test_export_canonical_jsonl_and_digest(store):
    lg = build(store)
    data, sha = lg.export()
    assert sha == digest.of_bytes(data)
    rows = data.split(b"\n")
    assert rows[-1] == b""
    rows = rows[:-1]
    assert len(rows) == 4
    for i, row in enumerate(rows):
        e = json.loads(row)
        assert row == canonical(e)
        assert e["seq"] == i
        assert row + b"\n" == store.get(keys(store)[i])


def test_export_refuses_broken_chain(store):
    lg = build(store)
    (store.root / keys(store)[1]).unlink()
    with pytest.raises(LedgerError):
        lg.export()


def test_two_ledgers_concurrently_do_not_overwrite(store):
    a, b = ledger(store), ledger(store)
    n = 20
    errors = []

    def work(lg, prefix):
        try:
            for i in range(n):
                lg.intent(f"{prefix}/s{i}", 1, DECL)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    ta = threading.Thread(target=work, args=(a, "A"))
    tb = threading.Thread(target=work, args=(b, "B"))
    ta.start()
    tb.start()
    ta.join()
    tb.join()
    assert errors == []
    fresh = ledger(store)
    assert len(fresh.entries) == 2 * n
    sessions = {e["session"] for e in fresh.entries}
    assert sessions == {f"A/s{i}" for i in range(n)} | {f"B/s{i}" for i in range(n)}
    assert fresh.verify() == []


def test_stale_ledger_object_appends_after_reload(store):
    a, b = ledger(store), ledger(store)
    a.intent("x", 1, DECL)
    e = b.intent("y", 1, DECL)  # b has not seen a's entry: create-only makes it retry as seq 1
    assert e["seq"] == 1
    assert ledger(store).verify() == []


@pytest.mark.parametrize("status", ["interrupted", "failed"])
def test_resume_allowed_after_interrupted_or_failed(store, status):
    lg = ledger(store)
    lg.intent(S, 1, DECL)
    lg.start(S, 1)
    lg.outcome(S, 1, status)
    lg.intent(S, 2, DECL)
    st = lg.state(S)
    assert st.attempt == 2 and st.status == "intended"
    lg.start(S, 2)
    lg.outcome(S, 2, "succeeded")
    assert lg.state(S).status == "succeeded"


@pytest.mark.parametrize("status", ["succeeded", "refused", "cancelled"])
def test_resume_refused_after_other_outcomes(store, status):
    lg = ledger(store)
    lg.intent(S, 1, DECL)
    lg.start(S, 1)
    lg.outcome(S, 1, status)
    with pytest.raises(LedgerError):
        lg.intent(S, 2, DECL)


def test_resume_refused_while_started_or_intended(store):
    lg = ledger(store)
    lg.intent(S, 1, DECL)
    with pytest.raises(LedgerError):
        lg.intent(S, 2, DECL)
    lg.start(S, 1)
    with pytest.raises(LedgerError):
        lg.intent(S, 2, DECL)


def test_resume_refused_after_close(store):
    lg = ledger(store)
    lg.intent(S, 1, DECL)
    lg.start(S, 1)
    lg.outcome(S, 1, "interrupted")
    lg.close(S, 1)
    assert lg.state(S).status == "cancelled"
    with pytest.raises(LedgerError):
        lg.intent(S, 2, DECL)


def test_attempt_skipping_refused(store):
    lg = ledger(store)
    lg.intent(S, 1, DECL)
    lg.start(S, 1)
    lg.outcome(S, 1, "failed")
    with pytest.raises(LedgerError):
        lg.intent(S, 3, DECL)


def _started(lg, session):
    lg.intent(session, 1, DECL)
    lg.start(session, 1)
    return layout.SessionKeys("c1", *session.split("/"))


def test_recover_keeps_a_partial_stream_as_incomplete_and_says_what_each_session_left(store):
    lg = ledger(store)
    cut = _started(lg, "p1/present-001")  # its runner died while the stream was being written
    w = store.writer(cut.stream)
    w.write(b'{"type":"system","subtype":"init"}\n{"type":"assis')
    w.abort()
    whole = _started(lg, "p1/present-002")  # died after committing the stream, before the outcome
    store.put(whole.stream, b'{"type":"result"}\n')
    _started(lg, "p1/absent-001")  # died before the harness wrote a byte
    lg.intent("p1/absent-002", 1, DECL)  # never started: not recover's business

    marked = {s: d for s, _, d in ledger(store).recover()}

    assert sorted(marked) == ["p1/absent-001", "p1/present-001", "p1/present-002"]
    kept = marked["p1/present-001"]["stream_incomplete"]
    assert kept["key"] == cut.partial_stream and kept["bytes"] == 49
    assert store.get(cut.partial_stream) == b'{"type":"system","subtype":"init"}\n{"type":"assis'
    assert not store.exists(cut.stream) and not store.exists(cut.stream + ".partial")
    assert marked["p1/present-002"]["stream"]["bytes"] == 18 and not store.exists(whole.partial_stream)
    assert "no byte of its stream was captured" in marked["p1/absent-001"]["reason"]
    assert all(d["reason"].startswith("recovered: started with no outcome") for d in marked.values())
    again = ledger(store)
    assert {s: again.state(s).status for s in marked} == dict.fromkeys(marked, "interrupted")
    assert again.state("p1/absent-002").status == "intended"
    assert again.recover() == [] and again.verify() == []


def test_a_stamp_reads_back_as_the_moment_it_names():
    assert timestamp("2026-12-04T19:47:08.602Z") == 1796413628.602
    before = time.time()
    assert before - 0.002 <= timestamp(now()) <= time.time()


def test_the_sessions_digest_moves_with_what_a_transform_reads_and_nothing_else(store):
    lg = ledger(store)
    other = "p1/present-002"
    seen = []

    def said():
        seen.append(sessions_digest(ledger(store).sessions(), [S, other]))

    said()
    lg.intent(S, 1, DECL)
    said()
    lg.start(S, 1)
    said()
    lg.outcome(S, 1, "interrupted", {"reason": "killed"})
    said()
    lg.append({"type": "note", "text": "an operator's remark"})  # no session's state changes
    said()
    assert seen[-1] == seen[-2]
    lg.intent(S, 2, DECL)  # resumed: a new attempt of the same session
    said()
    lg.intent(other, 1, DECL)
    lg.start(other, 1)
    lg.outcome(other, 1, "interrupted", {"reason": "killed"})
    said()
    lg.close(other, 1)  # cancelled
    said()
    assert len(set(seen)) == len(seen) - 1 and all(digest.is_digest(d) for d in seen)
    assert sessions_digest(ledger(store).sessions(), [other, S]) == seen[-1]  # however the keys come
    assert sessions_digest(ledger(store).sessions(), [S]) != seen[-1]  # every planned session counts
