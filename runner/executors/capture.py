"""What every executor records about a session it ran, and the collection of changed files."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from runner import digest, harnesses
from runner.executors.base import Artifacts
from runner.layout import SessionKeys
from runner.store import Store

_CHUNK = 1 << 20


def host_skill_names(environ: dict[str, str] | None = None) -> list[str]:
    """Skill directory names of the host user's configuration (refused if a session loads one)."""
    env = os.environ if environ is None else environ
    names: set[str] = set()
    for d in harnesses.HARNESS.host_skill_dirs(env):
        if d.is_dir():
            names.update(p.name for p in d.iterdir() if p.is_dir())
    return sorted(names)


def _through_links(workspace: Path, named: set[str]) -> set[str]:
    """The workspace paths that named paths lead to through the workspace's links (a write
    through a linked directory changed the file it leads to); paths leading out are dropped."""
    root = workspace.resolve()
    found = set()
    for rel in named:
        try:
            real = (workspace / rel).resolve()
        except (OSError, RuntimeError):  # a loop of links the session made: it leads nowhere
            continue
        if real != root and real.is_relative_to(root):
            found.add(real.relative_to(root).as_posix())
    return found


def collect_workspace(workspace: Path, manifest: dict[str, str], also: set[str], store: Store, keys: SessionKeys) -> Artifacts:
    """Store every file the session created or changed (and those in ``also`` that exist).

    Links are recorded by target and never followed: a link the session made could point at
    any file of the host the runner can read.
    """
    changed: dict[str, str] = {}
    stored: list[str] = []
    links: dict[str, str] = {}
    seen: set[str] = set()
    also = also | _through_links(workspace, also)
    for dirpath, dirnames, filenames in os.walk(workspace):
        for name in filenames + [d for d in dirnames if (Path(dirpath) / d).is_symlink()]:
            full = Path(dirpath) / name
            rel = full.relative_to(workspace).as_posix()
            st = os.lstat(full)
            seen.add(rel)
            if stat.S_ISLNK(st.st_mode):
                links[rel] = os.readlink(full)
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            d = digest.of_file(full)
            if manifest.get(rel) == d and rel not in also:
                continue
            with open(full, "rb") as f, store.writer(keys.artifact(rel), create_only=False, salvage=False) as w:
                while chunk := f.read(_CHUNK):
                    w.write(chunk)
                w.commit()
            stored.append(rel)
            if manifest.get(rel) != d:
                changed[rel] = d
    deleted = sorted(set(manifest) - seen)
    return {
        "changed": dict(sorted(changed.items())),
        "stored": sorted(stored),
        "links": links,
        "deleted": deleted,
    }
