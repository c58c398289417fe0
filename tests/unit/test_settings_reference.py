"""docs/settings.md is the settings models' own words (issue 30, item 5: "a settings reference
generated from the settings models and checked in CI"): every variable, each described."""

from __future__ import annotations

from pathlib import Path

from runner.settings import reference

DOC = Path(__file__).resolve().parents[2] / "docs" / "settings.md"


def test_the_settings_reference_is_what_the_models_say():
    assert DOC.read_text() == reference(), "docs/settings.md is stale: `python -m runner.settings > docs/settings.md`"


def test_every_setting_is_described_with_its_default():
    rows = [line for line in reference().splitlines() if line.startswith("| `RUNNER_")]
    assert len(rows) > 90
    bare = [r.split("|")[1].strip() for r in rows if not r.split("|")[3].strip()]
    assert bare == []
    undefaulted = [r.split("|")[1].strip() for r in rows if "Default" not in r and "default" not in r]
    assert undefaulted == [], undefaulted
