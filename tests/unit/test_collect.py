"""Collecting what a session changed (runner/executors/capture.py), on a real directory."""

from __future__ import annotations

import os

from runner import digest
from runner.executors.capture import collect_workspace
from runner.layout import SessionKeys
from runner.store.file import FileStore


def test_a_file_written_through_a_linked_directory_is_collected_under_its_own_path(tmp_path):
    """The stream names linkdir/a.md; the file that holds the bytes is docs/a.md. Collected even
    when its bytes are the sealed ones again (two edits that undo each other), because a named
    write is always collected; links that lead out or loop are left alone."""
    ws = tmp_path / "ws"
    (ws / "docs").mkdir(parents=True)
    (ws / "docs/a.md").write_bytes(b"HW-DR-0052\n")
    os.symlink("docs", ws / "linkdir")
    os.symlink("/etc", ws / "out")
    os.symlink("loop", ws / "loop")
    store, keys = FileStore(tmp_path / "store"), SessionKeys("c", "p", "s")
    manifest = {"docs/a.md": digest.of_bytes(b"HW-DR-0052\n")}
    got = collect_workspace(ws, manifest, {"linkdir/a.md", "out/passwd", "loop/x"}, store, keys)
    assert got == {"changed": {}, "stored": ["docs/a.md"], "deleted": [],
                   "links": {"linkdir": "docs", "out": "/etc", "loop": "loop"}}
    assert store.get(keys.artifact("docs/a.md")) == b"HW-DR-0052\n"
