"""Transcript render/parse and intake's confirmations."""

from __future__ import annotations

import pytest

from runner.transform.intake import confirm, confirm_rendered
from runner.transform.transcript import Rendered, TranscriptError, parse, render, rendered

LOCK = "sha256:" + "b" * 64
D = "sha256:" + "c" * 64


def identity(**over):
    d = {"model": "claude-x", "served_version": "claude-x-2026", "tree": D, "lock": LOCK, "selection": D,
         "read_set": D, "seed": 7, "harness": "claude-code 2.1.197", "tier": "regression", "arm": "present",
         "at": "2026-12-02T11:00:00Z", "cost_cents": 12}
    d.update(over)
    return d


def events():
    return [
        {"probe": "p1", "session": "present-001",
         "calls": [{"tool": "Read", "argument": "a.md", "result": D}, {"tool": "Grep", "argument": "HW-DR"}],
         "produced": [{"path": "out.md", "result": D, "cites": ["HW-DR-0052"]}],
         "answer": "current HW-DR-0052"},
        {"probe": "p2", "session": "present-001", "calls": [], "produced": [], "answer": None},
    ]


def text(ident=None, evs=None):
    return render({"campaign": "c1"}, "Transcript", ["Some prose.", "More prose."],
                  identity() if ident is None else ident, events() if evs is None else evs)


def test_roundtrip_exact():
    t = parse(text())
    assert t.identity == identity()
    assert t.events == events()
    assert t.front["kind"] == "probe_transcript" and t.front["campaign"] == "c1"


def test_roundtrip_empty_events():
    t = parse(text(evs=[]))
    assert t.events == []


def test_confirm_accepts_good():
    r = confirm(text(), LOCK, {"p1", "p2"})
    assert r.refusal is None
    assert r.dropped == []
    assert r.events == events()


def test_wrong_lock_refused():
    r = confirm(text(), "sha256:" + "d" * 64, {"p1", "p2"})
    assert r.refusal and r.refusal.startswith("taxonomy")


@pytest.mark.parametrize("key", ["model", "served_version", "tree", "selection", "read_set", "seed", "harness", "tier", "arm", "at", "cost_cents"])
def test_missing_identity_key_refused(key):
    ident = identity()
    del ident[key]
    r = confirm(text(ident=ident), LOCK, {"p1", "p2"})
    assert r.refusal and r.refusal.startswith("identity") and key in r.refusal


def test_extra_identity_key_refused():
    r = confirm(text(ident=identity(notes="hello")), LOCK, {"p1", "p2"})
    assert r.refusal and "no prose" in r.refusal and "notes" in r.refusal


def test_extra_event_key_refused():
    evs = events()
    evs[0]["reasoning"] = "because"
    r = confirm(text(evs=evs), LOCK, {"p1", "p2"})
    assert r.refusal and "no prose" in r.refusal and "reasoning" in r.refusal


def test_extra_call_key_refused():
    evs = events()
    evs[0]["calls"][1]["why"] = "x"
    r = confirm(text(evs=evs), LOCK, {"p1", "p2"})
    assert r.refusal and "calls[1]" in r.refusal and "why" in r.refusal


def test_extra_produced_key_refused():
    evs = events()
    evs[0]["produced"][0]["reasoning"] = "x"
    r = confirm(text(evs=evs), LOCK, {"p1", "p2"})
    assert r.refusal and "produced[0]" in r.refusal and "reasoning" in r.refusal


def test_findings_is_allowed_in_produced():
    evs = events()
    evs[0]["produced"][0]["findings"] = []
    assert confirm(text(evs=evs), LOCK, {"p1", "p2"}).refusal is None


@pytest.mark.parametrize("cost", [1.5, "3", -1, True])
def test_cost_cents_not_whole_refused(cost):
    r = confirm(text(ident=identity(cost_cents=cost)), LOCK, {"p1", "p2"})
    assert r.refusal and r.refusal.startswith("realized cost")


def test_cost_cents_zero_ok():
    assert confirm(text(ident=identity(cost_cents=0)), LOCK, {"p1", "p2"}).refusal is None


def test_unknown_probe_dropped_others_stay():
    r = confirm(text(), LOCK, {"p1"})
    assert r.refusal is None
    assert r.events == [events()[0]]
    assert len(r.dropped) == 1
    assert r.dropped[0]["probe"] == "p2" and r.dropped[0]["session"] == "present-001"
    assert r.dropped[0]["reason"].startswith("membership")


def test_second_fenced_block_under_events_refused():
    t = text().rstrip("\n") + "\n\n```yaml\n- probe: p1\n  session: x\n```\n"
    with pytest.raises(TranscriptError):
        parse(t)
    r = confirm(t, LOCK, {"p1", "p2"})
    assert r.refusal and r.refusal.startswith("format") and "Events" in r.refusal


def test_missing_heading_refused():
    t = text().replace("## Run identity", "## Identity")
    r = confirm(t, LOCK, {"p1", "p2"})
    assert r.refusal and "Run identity" in r.refusal


def test_roundtrip_tricky_scalars():
    evs = [{"probe": "0052", "session": "present-001", "calls": [{"tool": "Bash", "argument": "echo: yes # no", "result": D}],
            "produced": [{"path": "null", "result": D, "cites": ["on", "1e3"]}], "answer": "no"}]
    t = parse(text(evs=evs))
    assert t.events == evs


def test_a_rendered_transcript_gets_the_verdict_of_its_text():
    """confirm_rendered takes a block as the value it was written from only while its text is
    still that dump; prose that moves or adds a block is read as the engine would read it."""
    fence = "```yaml\n- probe: p9\n  session: x\n```"
    for prose in (["Some prose."], ["## Events\n" + fence], [fence], ["# Other\n## Run identity"], ["---"]):
        for evs in (events(), [], [{"probe": "p1", "session": "s", "extra": 1}]):
            r = rendered({"campaign": "c1"}, "Transcript", prose, identity(), evs)
            assert repr(confirm_rendered(r, LOCK, {"p1", "p2"})) == repr(confirm(r.text, LOCK, {"p1", "p2"}))


def test_a_rendered_transcript_whose_text_changed_is_read_from_its_text():
    r = rendered({"campaign": "c1"}, "Transcript", ["Some prose."], identity(), events())
    changed = Rendered(r.text.replace("probe: p2", "probe: p3"), r.blocks)
    got = confirm_rendered(changed, LOCK, {"p1", "p2"})
    assert [d["probe"] for d in got.dropped] == ["p3"]
    assert repr(got) == repr(confirm(changed.text, LOCK, {"p1", "p2"}))


def test_a_block_nested_past_the_recursion_limit_is_refused_with_its_reason():
    good = text()
    for block in ("- " * 3000 + "x", "[" * 3000 + "]" * 3000, "a: " * 3000 + "x"):
        doc = good[:good.index("## Events")] + "## Events\n```yaml\n" + block + "\n```\n"
        refusal = confirm(doc, LOCK, {"p1"}).refusal
        assert refusal is not None and refusal.startswith("format: the block under '## Events'"), refusal
    front = "---\nkind: probe_transcript\nx: " + "[" * 3000 + "]" * 3000 + "\n---\n"
    assert confirm(front + good.split("---\n", 2)[2], LOCK, {"p1"}).refusal == "format: the front matter is nested too deeply to read"


@pytest.mark.parametrize("old, new, reason", [
    ("answer: current HW-DR-0052", "answer: 2020-13-45", "holds a value YAML cannot construct: month must be in 1..12"),
    ("answer: current HW-DR-0052", "answer: !!float abc", "holds a value YAML cannot construct"),
    ("kind: probe_transcript", "kind: probe_transcript\nat: 2020-02-30", "the front matter holds a value YAML cannot construct"),
])
def test_a_value_yaml_cannot_construct_is_a_refusal_not_a_traceback(old, new, reason):
    result = confirm(text().replace(old, new, 1), LOCK, {"p1", "p2"})
    assert result.refusal is not None and reason in result.refusal


def test_an_event_whose_probe_is_not_a_string_is_dropped():
    result = confirm(text().replace("- probe: p1", "- probe: [1]", 1), LOCK, {"p1", "p2"})
    assert result.refusal is None and [d["reason"] for d in result.dropped] == ["an event must name a probe and a session"]
