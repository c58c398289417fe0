"""The plan file (DESIGN.md's input contract) and its expansion into sessions.

The plan carries the six identity members `headwater probe plan` printed; the recorder copies
them into every transcript unchanged, so they are validated here, once, before anything can
spend. Unknown keys are an error because a misspelt key would otherwise be silently ignored.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path, PurePosixPath
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator, model_validator

from runner.digest import DIGEST_PATTERN
from runner.errors import UserError, format_validation_error

MAX_REPETITIONS = 999  # session names carry the repetition in three digits


class Tier(str, Enum):
    regression = "regression"
    campaign = "campaign"
    documentation = "documentation"


class Arm(str, Enum):
    present = "present"
    absent = "absent"
    no_hook = "no-hook"
    no_skills = "no-skills"
    no_claude_md = "no-claude-md"
    mcp = "mcp"


Digest = Annotated[str, StringConstraints(pattern=DIGEST_PATTERN)]
NonEmpty = Annotated[str, StringConstraints(min_length=1)]


def _relative_path(value: str) -> str:
    p = PurePosixPath(value)
    if not value or p.is_absolute() or ".." in p.parts or "\\" in value:
        raise ValueError("must be a relative path inside the corpus (no leading '/', no '..')")
    return str(p)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Identity(_Strict):
    """The six run-identity members that exist before any session starts."""

    lock: Digest
    tree: Digest
    selection: Digest
    read_set: Digest
    seed: int
    harness: NonEmpty


class Probe(_Strict):
    id: NonEmpty
    path: str
    title: NonEmpty
    task: str
    answers: list[NonEmpty] = Field(default_factory=list)
    examines: list[str] = Field(default_factory=list)

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        return _relative_path(v)

    @field_validator("examines")
    @classmethod
    def _examines(cls, v: list[str]) -> list[str]:
        return [_relative_path(x) for x in v]

    @field_validator("task")
    @classmethod
    def _task(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("the task is empty: it must be the body of the probe's ## Task section")
        return v

    @field_validator("answers")
    @classmethod
    def _answers(cls, v: list[str]) -> list[str]:
        for a in v:
            if not a.split():
                raise ValueError("a declared answer must hold at least one word")
        return v


CampaignName = Annotated[
    str, StringConstraints(pattern=r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$")
]


class Plan(_Strict):
    campaign: CampaignName
    tier: Tier
    model: NonEmpty
    identity: Identity
    arms: list[Arm] = Field(min_length=1)
    repetitions: int = Field(ge=1, le=MAX_REPETITIONS)
    identifier_pattern: NonEmpty
    probes: list[Probe] = Field(min_length=1)

    @field_validator("identifier_pattern")
    @classmethod
    def _pattern(cls, v: str) -> str:
        try:
            compiled = re.compile(v)
        except (re.error, RecursionError, OverflowError) as e:  # the last two: nesting or a repeat count too large
            raise ValueError(f"not a valid regular expression: {e}") from None
        if compiled.match(""):
            raise ValueError("matches the empty string, so it would cite everything")
        return v

    @field_validator("arms")
    @classmethod
    def _arms_unique(cls, v: list[Arm]) -> list[Arm]:
        seen = [a.value for a in v]
        dupes = sorted({a for a in seen if seen.count(a) > 1})
        if dupes:
            raise ValueError(f"duplicate arm(s): {', '.join(dupes)}")
        return v

    @model_validator(mode="after")
    def _probes_unique(self) -> Plan:
        for key in ("id", "path"):
            values = [getattr(p, key) for p in self.probes]
            dupes = sorted({x for x in values if values.count(x) > 1})
            if dupes:
                raise ValueError(f"probes: duplicate probe {key}(s): {', '.join(dupes)}")
        return self

    @property
    def identifier_re(self) -> re.Pattern[str]:
        return re.compile(self.identifier_pattern)

    def probe(self, probe_id: str) -> Probe:
        for p in self.probes:
            if p.id == probe_id:
                return p
        raise KeyError(probe_id)

    def sessions(self) -> list[SessionSpec]:
        """Every session of the campaign, in a stable order (probe, arm, repetition)."""
        return [
            SessionSpec(probe=p.id, arm=arm.value, repetition=r)
            for p in self.probes
            for arm in self.arms
            for r in range(1, self.repetitions + 1)
        ]

    def canonical_json(self) -> bytes:
        """The plan as stored in the campaign: one canonical form, so its digest is stable."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, indent=2).encode() + b"\n"


@dataclass(frozen=True, order=True)
class SessionSpec:
    probe: str
    arm: str
    repetition: int

    @property
    def name(self) -> str:
        """DESIGN.md's session name: distinct within a probe."""
        return f"{self.arm}-{self.repetition:03d}"

    @property
    def key(self) -> str:
        return f"{self.probe}/{self.name}"


def parse_document(path: Path) -> object:
    """Read a JSON (or, for .yaml/.yml, YAML) document, with a clear error for bad syntax."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read: {e}") from None
    try:
        if path.suffix.lower() in {".yaml", ".yml"}:
            return yaml.safe_load(text)
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except yaml.YAMLError as e:
        raise UserError(f"{path}: not valid YAML: {e}".replace("\n", " ")) from None
    except RecursionError:
        raise UserError(f"{path}: nested too deeply to read") from None
    except ValueError as e:  # a value no Python type holds: an integer of over 4300 digits, a 13th month
        raise UserError(f"{path}: cannot read a value: {e}") from None


def parse_plan(data: object, source: str = "plan") -> Plan:
    if not isinstance(data, dict):
        raise UserError(f"{source}: the plan must be a JSON object")
    try:
        return Plan.model_validate(data)
    except ValidationError as e:
        raise UserError(format_validation_error(source, e)) from None


def load_plan(path: Path) -> Plan:
    return parse_plan(parse_document(path), str(path))
