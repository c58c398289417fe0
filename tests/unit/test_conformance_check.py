"""The conformance sessions' check (runner/qualify/conformance.py) fails on each way a session's
event can differ from what the contract makes of its scenario: a test that could not fail
would qualify any CLI."""

from __future__ import annotations

import pytest

from runner import digest, layout
from runner.demo import CORPUS
from runner.qualify import conformance

SPEC = {p["id"]: p["expect"] for p in conformance.spec()["probes"]}
READS, WRITES, SLOW, TURNS = "HW-PRB-0101", "HW-PRB-0102", "HW-PRB-0103", "HW-PRB-0104"
KEYS = layout.SessionKeys("c", READS, "present-001")


def _right(probe: str) -> dict:
    expect = SPEC[probe]
    calls = [{"tool": c["tool"], "argument": c["argument"],
              **({} if c["result"] == "none" else {"result": digest.of_bytes(b"x") if c["result"] == "any"
                                                   else digest.of_file(CORPUS / c["result"].removeprefix("digest-of:"))})}
             for c in expect.get("calls", [])]
    produced = [{"path": a["path"], "result": digest.of_text(a["content"]), "cites": a["cites"]} for a in expect["produced"]]
    return {"probe": probe, "calls": calls, "produced": produced, "answer": expect["answer"]}


@pytest.mark.parametrize("probe", [READS, WRITES])
def test_the_expected_event_passes(probe):
    assert conformance._differences(SPEC[probe], _right(probe), CORPUS, {}, None, KEYS) == []


@pytest.mark.parametrize("change, says", [
    (lambda e: e["calls"].pop(), "calls"),
    (lambda e: e["calls"][2].update(argument="docs/a.md"), "calls"),
    (lambda e: e["calls"][2].update(result=digest.of_bytes(b"other")), "result"),
    (lambda e: e["calls"][0].pop("result"), "result"),
    (lambda e: e.update(answer="superseded HW-DR-0052"), "answer"),
    (lambda e: e.update(produced=[{"path": "notes/x.md", "result": digest.of_bytes(b""), "cites": []}]), "produced"),
])
def test_each_difference_of_a_reads_session_fails(change, says):
    event = _right(READS)
    change(event)
    (wrong,) = conformance._differences(SPEC[READS], event, CORPUS, {}, None, KEYS)
    assert says in wrong, wrong


def test_a_writes_session_must_produce_each_artifact_with_its_digest_and_cites():
    event = _right(WRITES)
    event["produced"][1]["cites"] = []
    (wrong,) = conformance._differences(SPEC[WRITES], event, CORPUS, {}, None, KEYS)
    assert wrong.startswith("produced")


def test_the_time_limited_session_must_say_the_limit_ended_it_and_have_no_answer():
    event = _right(SLOW)
    assert conformance._differences(SPEC[SLOW], event, CORPUS, {"timed_out": True}, None, KEYS) == []
    assert conformance._differences(SPEC[SLOW], event, CORPUS, {"timed_out": False}, None, KEYS) == [
        "the capture record does not say the time limit ended it"]
    event["calls"][1]["result"] = digest.of_bytes(b"it ended")
    assert conformance._differences(SPEC[SLOW], event, CORPUS, {"timed_out": True}, None, KEYS)


def test_the_max_turns_session_has_only_its_repeated_call_and_no_answer():
    want = SPEC[TURNS]["calls_prefix"]
    event = {"calls": [dict(want, result=digest.of_bytes(b"x"))] * 7, "produced": [], "answer": None}
    assert conformance._differences(SPEC[TURNS], event, CORPUS, {}, None, KEYS) == []
    assert conformance._differences(SPEC[TURNS], dict(event, answer="current HW-DR-0052"), CORPUS, {}, None, KEYS)
    assert conformance._differences(SPEC[TURNS], dict(event, calls=[]), CORPUS, {}, None, KEYS)
