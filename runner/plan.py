"""The plan file (docs/design.md's input contract) and its expansion into sessions.

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
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationError, field_validator, model_validator

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
# A probe's id names a directory of each session's scratch and its keys in the store: letters,
# digits and . _ - only, starting and ending with a letter or digit (so never .. nor a path).
_PROBE_ID = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,126}[A-Za-z0-9])?")


def _probe_id(value: str) -> str:
    if not _PROBE_ID.fullmatch(value):
        raise ValueError("a probe id is 1 to 128 letters, digits, '.', '_' or '-', starting and ending with a letter or "
                         "digit: it names the session's directories and its keys in the store")
    return value


ProbeId = Annotated[str, AfterValidator(_probe_id)]
# The most a YAML plan may expand to through its aliases (each alias stands for its whole node).
MAX_EXPANDED_NODES = 1_000_000
MAX_EXPANDED_CHARACTERS = 16 << 20


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
    id: ProbeId
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
        """docs/design.md's session name: distinct within a probe."""
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
            return _bounded_yaml(path, text)
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except yaml.YAMLError as e:
        raise UserError(f"{path}: not valid YAML: {e}".replace("\n", " ")) from None
    except RecursionError:
        raise UserError(f"{path}: nested too deeply to read") from None
    except ValueError as e:  # a value no Python type holds: an integer of over 4300 digits, a 13th month
        raise UserError(f"{path}: cannot read a value: {e}") from None


def _bounded_yaml(path: Path, text: str) -> object:
    """A YAML document, refused where its aliases expand it past MAX_EXPANDED_NODES nodes or
    MAX_EXPANDED_CHARACTERS characters of scalars: an alias is one more reference to its node, so a
    small file can stand for an enormous plan (112 kB of nested aliases was 300 MB)."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        sizes: dict[int, tuple[int, int]] = {}  # node -> (values, scalar characters) it expands to
        stack: list[tuple[yaml.Node, bool]] = [(node, False)]
        while stack:  # post-order, each node once: a node is sized after all of its children
            n, children_done = stack.pop()
            children = ([x for pair in n.value for x in pair] if isinstance(n, yaml.MappingNode)
                        else n.value if isinstance(n, yaml.SequenceNode) else [])
            if id(n) in sizes:
                continue
            if not children_done:
                stack.append((n, True))
                stack.extend((c, False) for c in children if id(c) not in sizes)
                continue
            count = 1 + sum(sizes[id(c)][0] for c in children)
            chars = len(n.value) if isinstance(n, yaml.ScalarNode) else sum(sizes[id(c)][1] for c in children)
            if count > MAX_EXPANDED_NODES or chars > MAX_EXPANDED_CHARACTERS:
                raise UserError(f"{path}: its aliases expand it past {MAX_EXPANDED_NODES} values or "
                                f"{MAX_EXPANDED_CHARACTERS} characters: no plan is that large")
            sizes[id(n)] = (count, chars)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def parse_plan(data: object, source: str = "plan") -> Plan:
    if not isinstance(data, dict):
        raise UserError(f"{source}: the plan must be a JSON object")
    try:
        return Plan.model_validate(data)
    except ValidationError as e:
        raise UserError(format_validation_error(source, e)) from None


def load_plan(path: Path) -> Plan:
    return parse_plan(parse_document(path), str(path))
