"""The fuzz targets: each parser of untrusted input, with the only outcomes it may have.

``bench/fuzz.py`` drives these under atheris, and ``tests/unit/test_fuzz_regressions.py``
replays every crasher a run kept, so a crash fixed once stays fixed. A target returns
normally when the input met a defined outcome (accepted, or refused with a reason) and raises
anything else, which is what a crasher is.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

from runner.errors import UserError
from runner.harnesses.claude_code import stream
from runner.plan import load_plan
from runner.seal import PROBE_CONFIG, load_probe_config
from runner.transform import intake, transcript
from runner.transform.events import SessionFacts, session_event

TARGETS = ("plan", "probe_yml", "stream", "transcript")  # an input's first byte picks one, modulo 4
LOCK = "sha256:" + "1" * 64
PROBE = "HW-PRB-0007"
WORKSPACE = "/workspace"
IDENTIFIER = re.compile(r"HW-[A-Z]+-[0-9]{4}")
ANSWERS = ["current HW-DR-0052", "superseded HW-DR-0052"]
_FILES = {"out.md": b"Cites HW-DR-0052.\n", "notes/a.md": b"HW-OBL-0124\n"}


class DataLost(AssertionError):
    """An event the transform derived did not survive rendering and intake unchanged."""


def identity() -> dict:
    return {"model": "m", "served_version": "m-1", "tree": LOCK, "lock": LOCK, "selection": LOCK,
            "read_set": LOCK, "seed": 1, "harness": "h", "tier": "campaign", "arm": "present",
            "at": "2026-12-03T00:00:00Z", "cost_cents": 1}


def render(events: list[dict]) -> str:
    return transcript.render({"title": "t"}, "t", ["prose"], identity(), events)


def sample_transcript() -> str:
    return render([{"probe": PROBE, "session": "present-001",
                    "calls": [{"tool": "Read", "argument": "a.md", "result": LOCK}],
                    "produced": [{"path": "out.md", "result": LOCK, "cites": ["HW-DR-0052"]}],
                    "answer": "current HW-DR-0052"}])


def facts() -> SessionFacts:
    return SessionFacts(probe=PROBE, session="present-001", workspace=WORKSPACE, config_dir="/session/config",
                        manifest={"a.md": LOCK}, final_file=_FILES.get,
                        identifiers=frozenset({"HW-DR-0052", "HW-DR-0061"}))


def stream_target(data: bytes) -> None:
    parsed = stream.parse(io.BytesIO(data))  # a binary file splits at b"\n" alone, as the store does
    outcome = session_event(parsed, facts(), ANSWERS, IDENTIFIER)
    if outcome.event is None:
        if not outcome.refusals:
            raise DataLost("no event and no refusal")
        return
    result = intake.confirm(render([outcome.event]), LOCK, {PROBE})
    if result.refusal or result.events != [outcome.event]:
        raise DataLost(f"the event did not survive the transcript: {result.refusal or result.events}")


def transcript_target(data: bytes) -> None:
    intake.confirm(data.decode("utf-8", "replace"), LOCK, {PROBE})


def file_target(load, path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    try:
        load()
    except UserError:
        pass


def run(target: str, data: bytes, scratch: Path) -> None:
    if target == "plan":
        suffix = ".json" if data[:1] == b"{" else ".yml"  # both readers, picked by the input
        path = scratch / f"plan{suffix}"
        file_target(lambda: load_plan(path), path, data)
    elif target == "probe_yml":
        file_target(lambda: load_probe_config(scratch), scratch / PROBE_CONFIG, data)
    elif target == "stream":
        stream_target(data)
    elif target == "transcript":
        transcript_target(data)
    else:
        raise ValueError(f"unknown target {target!r}")
