"""Plan validation and session expansion."""

from __future__ import annotations

import json
import time

import pytest

from runner.errors import UserError
from runner.plan import load_plan, parse_plan

D = "sha256:" + "a" * 64


def plan_dict(**over):
    d = {
        "campaign": "c1",
        "tier": "regression",
        "model": "claude-x",
        "identity": {"lock": D, "tree": D, "selection": D, "read_set": D, "seed": 7, "harness": "claude-code 2.1"},
        "arms": ["present", "absent"],
        "repetitions": 2,
        "identifier_pattern": r"HW-DR-\d{4}",
        "probes": [
            {"id": "p1", "path": "docs/probes/p1.md", "title": "Probe one", "task": "Do it.", "answers": ["current HW-DR-0052"]},
            {"id": "p2", "path": "docs/probes/p2.md", "title": "Probe two", "task": "Do that."},
        ],
    }
    d.update(over)
    return d


def bad(d):
    with pytest.raises(UserError) as e:
        parse_plan(d, "plan.json")
    return str(e.value)


def test_valid_plan_loads():
    p = parse_plan(plan_dict())
    assert p.campaign == "c1"
    assert [a.value for a in p.arms] == ["present", "absent"]
    assert p.probe("p1").answers == ["current HW-DR-0052"]
    assert p.identity.seed == 7


def test_unknown_key_in_probe():
    d = plan_dict()
    d["probes"][0]["x"] = 1
    assert "probes[0].x: unknown key" in bad(d)


def test_unknown_top_level_key():
    assert "extra: unknown key" in bad(plan_dict(extra=1))


def test_bad_tier():
    assert "plan.json: tier:" in bad(plan_dict(tier="bogus"))


def test_bad_arm():
    assert "arms[1]:" in bad(plan_dict(arms=["present", "nope"]))


def test_duplicate_probe_id():
    d = plan_dict()
    d["probes"][1]["id"] = "p1"
    msg = bad(d)
    assert "probes" in msg and "duplicate probe id" in msg and "p1" in msg


def test_empty_task():
    d = plan_dict()
    d["probes"][1]["task"] = "   \n"
    msg = bad(d)
    assert "probes[1].task:" in msg and "empty" in msg


def test_malformed_digest():
    d = plan_dict()
    d["identity"]["lock"] = "sha256:ABC"
    msg = bad(d)
    assert "identity.lock: must be 'sha256:' followed by 64 lowercase hex digits" in msg


@pytest.mark.parametrize("reps", [0, 1000])
def test_repetitions_out_of_range(reps):
    assert "repetitions:" in bad(plan_dict(repetitions=reps))


def test_repetitions_bounds_accepted():
    assert parse_plan(plan_dict(repetitions=1)).repetitions == 1
    assert parse_plan(plan_dict(repetitions=999)).repetitions == 999


def test_json_syntax_error_names_line_and_column(tmp_path):
    f = tmp_path / "plan.json"
    f.write_text('{\n  "campaign": "c1",\n  "tier": ,\n}\n')
    with pytest.raises(UserError) as e:
        load_plan(f)
    assert "not valid JSON" in str(e.value)
    assert "line 3 column 11" in str(e.value)


def test_yaml_plan_accepted(tmp_path):
    import yaml

    f = tmp_path / "plan.yaml"
    f.write_text(yaml.safe_dump(plan_dict()))
    j = tmp_path / "plan.json"
    j.write_text(json.dumps(plan_dict()))
    assert load_plan(f) == load_plan(j)


def test_sessions_order_names_and_count():
    p = parse_plan(plan_dict(repetitions=2))
    s = p.sessions()
    assert len(s) == 2 * 2 * 2
    assert [x.key for x in s] == [
        "p1/present-001", "p1/present-002", "p1/absent-001", "p1/absent-002",
        "p2/present-001", "p2/present-002", "p2/absent-001", "p2/absent-002",
    ]
    assert s[0].name == "present-001"


def test_sessions_count_three_arms():
    p = parse_plan(plan_dict(arms=["present", "no-hook", "mcp"], repetitions=3))
    assert len(p.sessions()) == 2 * 3 * 3
    assert len({x.key for x in p.sessions()}) == 18


# --- a hostile plan (issue 28, item 5) -------------------------------------------------------------

@pytest.mark.parametrize("probe_id", ["../../tmp/x", "..", "a/b", ".hidden", "p1 ", "-rf", "x" * 129, "é"])
def test_a_probe_id_that_is_not_a_plain_name_is_refused_with_the_field_named(probe_id):
    """A probe's id names a directory of each session's scratch and its keys in the store:
    `../../tmp/x` put a session's scratch outside the work directory."""
    d = plan_dict()
    d["probes"][0]["id"] = probe_id
    msg = bad(d)
    assert msg.startswith("plan.json: probes[0].id: ") and "a probe id is 1 to 128 letters, digits" in msg


@pytest.mark.parametrize("probe_id", ["HW-PRB-0007", "p1", "a.b_c-d", "x" * 128])
def test_a_plain_probe_id_is_kept(probe_id):
    d = plan_dict()
    d["probes"][0]["id"] = probe_id
    assert parse_plan(d).probes[0].id == probe_id


def test_yaml_aliases_that_expand_a_plan_past_any_plan_are_refused_at_once(tmp_path):
    """A few kilobytes of nested aliases stand for a plan of gigabytes: refused from the node
    graph, before anything is built from it."""
    text = "a: &a [" + ",".join(["x" * 100] * 10) + "]\n"
    for i in range(1, 12):
        text += f"b{i}: &b{i} [" + ",".join([f"*{'a' if i == 1 else f'b{i - 1}'}"] * 10) + "]\n"
    (tmp_path / "plan.yaml").write_text(text)
    t0 = time.monotonic()
    with pytest.raises(UserError, match="its aliases expand it past 1000000 values"):
        load_plan(tmp_path / "plan.yaml")
    assert time.monotonic() - t0 < 5 and len(text) < 2000


def test_a_plan_whose_aliases_stay_small_loads(tmp_path):
    """The same alias read twice: a plan's YAML may share a node (an answer set, say)."""
    d = plan_dict()
    text = json.dumps(d).replace('"answers": ["current HW-DR-0052"]', '"answers": &set ["current HW-DR-0052"]', 1)
    text = text.replace('"task": "Do that."', '"task": "Do that.", "answers": *set', 1)
    (tmp_path / "plan.yaml").write_text(text)
    plan = load_plan(tmp_path / "plan.yaml")
    assert plan.probes[0].answers == plan.probes[1].answers == ["current HW-DR-0052"]
