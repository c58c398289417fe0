"""Sealing: a fresh copy of the corpus for one (probe, arm) that names neither the probe nor
its answers, so the session measures what the workspace gives it and not the probe itself.

The rule (the recorder contract, "The prompt is the task section"):

1. ``.git`` is never copied: the history holds the probe and every earlier answer.
2. The probe shelves go: the directory of every probe document of the plan, and
   ``docs/probe-runs/`` (earlier recordings).
3. Each answer key ``.headwater/probe.yml`` declares for the probe goes, and so does every line
   elsewhere that names it (by its corpus path, or by its path relative to the file).
4. Every file that names the probe (its id, path or title) goes; outside ``docs/`` a file stays
   when ``folds:`` declares it. ``.headwater/probe.yml`` itself names the probe's answer keys,
   so it goes with them unless folded.
5. The arm removes what it measures (see ARM_COMPONENTS).
6. The result is checked: a file other than a fold that still names the probe or an answer key,
   a fold that states an answer or names an answer key, or a link leading out of the corpus
   refuses the workspace. The session then does not run.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runner import digest
from runner.errors import SealError, UserError
from runner.plan import Plan, Probe, format_validation_error, parse_document

PROBE_CONFIG = ".headwater/probe.yml"
RECORDINGS_SHELF = "docs/probe-runs"

HOOKS, SKILLS, CLAUDE_MD, MCP = "hooks", "skills", "claude-md", "mcp"
# What each arm removes from the sealed workspace.
ARM_COMPONENTS: dict[str, frozenset[str]] = {
    "present": frozenset(),
    "absent": frozenset({HOOKS, SKILLS, CLAUDE_MD, MCP}),
    "no-hook": frozenset({HOOKS}),
    "no-skills": frozenset({SKILLS}),
    "no-claude-md": frozenset({CLAUDE_MD}),
    "mcp": frozenset({HOOKS, SKILLS, CLAUDE_MD}),
}
_SETTINGS_FILES = (".claude/settings.json", ".claude/settings.local.json")
_CLAUDE_MD_NAMES = {"CLAUDE.md", "CLAUDE.local.md"}


class ProbeConfig(BaseModel):
    """``.headwater/probe.yml``: folds and answer keys (optional file; absent means neither)."""

    model_config = ConfigDict(extra="forbid")
    folds: list[str] = Field(default_factory=list)
    answer_keys: dict[str, list[str]] = Field(default_factory=dict)


def load_probe_config(corpus: Path) -> ProbeConfig:
    path = corpus / PROBE_CONFIG
    if not path.exists():
        return ProbeConfig()
    data = parse_document(path)
    if data is None:
        return ProbeConfig()
    if not isinstance(data, dict):
        raise UserError(f"{path}: must be a mapping with 'folds' and 'answer_keys'")
    try:
        return ProbeConfig.model_validate(data)
    except ValidationError as e:
        raise UserError(format_validation_error(str(path), e)) from None


@dataclass
class SealedWorkspace:
    """What sealing produced: the workspace and the facts the transform needs about it."""

    path: Path
    arm: str
    manifest: dict[str, str]  # relative path -> digest of the bytes the session starts with
    removed: dict[str, str] = field(default_factory=dict)  # relative path -> why
    folds_kept: list[str] = field(default_factory=list)
    mcp_servers: list[str] = field(default_factory=list)  # servers the workspace's .mcp.json declares

    def record(self) -> dict:
        return {
            "arm": self.arm,
            "manifest": self.manifest,
            "removed": self.removed,
            "folds_kept": self.folds_kept,
            "mcp_servers": self.mcp_servers,
        }


def _corpus_files(corpus: Path) -> list[str]:
    files = []
    for dirpath, dirnames, filenames in os.walk(corpus):
        rel_dir = Path(dirpath).relative_to(corpus)
        if rel_dir == Path("."):
            dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in list(dirnames):
            full = Path(dirpath) / name
            if full.is_symlink():
                _check_link(corpus, full)
        for name in filenames:
            full = Path(dirpath) / name
            rel = (rel_dir / name).as_posix()
            if full.is_symlink():
                _check_link(corpus, full)
            elif not full.is_file():
                raise SealError(f"corpus file {rel} is not a regular file")
            files.append(rel)
    return sorted(files)


def _check_link(corpus: Path, link: Path) -> None:
    target = link.resolve()
    if not target.is_relative_to(corpus.resolve()):
        raise SealError(f"corpus link {link.relative_to(corpus)} leads out of the corpus (to {target})")


def _under(rel: str, directory: str) -> bool:
    return rel == directory or rel.startswith(directory.rstrip("/") + "/")


def _names_document(rel_file: str, line: bytes, doc: str) -> bool:
    relative = os.path.relpath(doc, PurePosixPath(rel_file).parent.as_posix() or ".")
    return doc.encode() in line or relative.encode() in line


class _Sealer:
    def __init__(self, corpus: Path, plan: Plan, probe: Probe, arm: str, config: ProbeConfig):
        self.corpus = corpus
        self.probe = probe
        self.arm = arm
        self.folds = set(config.folds)
        self.answer_keys = list(config.answer_keys.get(probe.id, []))
        self.shelves = sorted({PurePosixPath(p.path).parent.as_posix() for p in plan.probes} | {RECORDINGS_SHELF})
        self.names = [n.encode() for n in (probe.id, probe.path, probe.title)]

    def names_probe(self, data: bytes) -> bool:
        return any(n in data for n in self.names)

    def names_answer_key(self, rel: str, data: bytes) -> bool:
        return any(_names_document(rel, line, k) for k in self.answer_keys for line in data.splitlines())

    def why_removed(self, rel: str, data: bytes) -> str | None:
        for shelf in self.shelves:
            if shelf != "." and _under(rel, shelf):
                return f"on the probe shelf {shelf}/"
        if rel in self.answer_keys:
            return "an answer key of the probe"
        if self.names_probe(data):
            if _under(rel, "docs") or rel not in self.folds:
                return "names the probe"
        return None

    def strip_answer_key_lines(self, rel: str, data: bytes) -> bytes:
        if not self.answer_keys:
            return data
        lines = data.splitlines(keepends=True)
        kept = [ln for ln in lines if not any(_names_document(rel, ln, k) for k in self.answer_keys)]
        return b"".join(kept)


def _arm_removes(rel: str, components: frozenset[str]) -> bool:
    if SKILLS in components and _under(rel, ".claude/skills"):
        return True
    if HOOKS in components and _under(rel, ".claude/hooks"):
        return True
    if CLAUDE_MD in components and (PurePosixPath(rel).name in _CLAUDE_MD_NAMES):
        return True
    if MCP in components and rel == ".mcp.json":
        return True
    return False


def _drop_hooks(path: Path, rel: str) -> None:
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise SealError(f"{rel} is not valid JSON, so its hooks cannot be removed for this arm: {e}") from None
    if isinstance(settings, dict) and "hooks" in settings:
        del settings["hooks"]
        path.write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")


def _declared_mcp_servers(workspace: Path) -> list[str]:
    path = workspace / ".mcp.json"
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise SealError(f".mcp.json is not valid JSON: {e}") from None
    servers = data.get("mcpServers", {}) if isinstance(data, dict) else {}
    return sorted(servers) if isinstance(servers, dict) else []


def seal(corpus: Path, plan: Plan, probe: Probe, arm: str, dest: Path) -> SealedWorkspace:
    """Copy ``corpus`` into the empty directory ``dest`` sealed for (probe, arm).

    Raises SealError, with every offending path named, where the result would still let the
    session read the probe or one of its answers.
    """
    corpus = corpus.resolve()
    if not corpus.is_dir():
        raise UserError(f"corpus {corpus} is not a directory")
    config = load_probe_config(corpus)
    sealer = _Sealer(corpus, plan, probe, arm, config)
    components = ARM_COMPONENTS[arm]
    dest.mkdir(parents=True, exist_ok=False)
    result = SealedWorkspace(path=dest, arm=arm, manifest={})

    for rel in _corpus_files(corpus):
        src = corpus / rel
        target = dest / rel
        if src.is_symlink():
            target.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(src), target)
            continue
        data = src.read_bytes()
        why = sealer.why_removed(rel, data)
        if why is None and _arm_removes(rel, components):
            why = f"removed by the {arm} arm"
        if why is not None:
            result.removed[rel] = why
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        stripped = sealer.strip_answer_key_lines(rel, data)
        if stripped != data:
            result.removed[rel + "#lines"] = "lines naming an answer key"
        target.write_bytes(stripped)
        shutil.copystat(src, target)

    if HOOKS in components:
        for rel in _SETTINGS_FILES:
            if (dest / rel).is_file():
                _drop_hooks(dest / rel, rel)

    problems = []
    for dirpath, _, filenames in os.walk(dest):
        for name in filenames:
            full = Path(dirpath) / name
            rel = full.relative_to(dest).as_posix()
            if full.is_symlink():
                if not full.exists():
                    continue
                data = full.read_bytes()
            else:
                data = full.read_bytes()
                result.manifest[rel] = digest.of_bytes(data)
            if sealer.names_answer_key(rel, data):
                problems.append(f"{rel} still names an answer key")
            if rel in sealer.folds and sealer.names_probe(data):
                result.folds_kept.append(rel)
                low = data.decode("utf-8", "replace").casefold()
                stated = [a for a in probe.answers if a.casefold() in low]
                if stated:
                    problems.append(f"{rel} is a fold but states the answer {stated[0]!r}")
            elif sealer.names_probe(data):
                problems.append(f"{rel} still names the probe")
    if problems:
        raise SealError(f"cannot seal the workspace for {probe.id} ({arm}): " + "; ".join(sorted(problems)))
    result.manifest = dict(sorted(result.manifest.items()))
    result.folds_kept.sort()
    result.mcp_servers = _declared_mcp_servers(dest)
    return result
