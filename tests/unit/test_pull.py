"""runner/pull.py: a campaign's transcripts come out only as SHA256SUMS lists them, byte for byte."""

from __future__ import annotations

import hashlib

import pytest

from runner import layout
from runner.errors import UserError
from runner.pull import verified_transcripts
from runner.store import StoreError
from runner.store.file import FileStore

FILES = {"c-present.md": b"# present\n", "c-absent.md": b"# absent\n", "refusals.json": b'{"refusals": []}\n'}


def _stored(tmp_path, files=FILES, sums=None) -> FileStore:
    store = FileStore(tmp_path / "store")
    prefix = layout.transcripts_prefix("c")
    for name, data in files.items():
        store.put(prefix + name, data)
    listed = sums if sums is not None else files
    store.put(layout.sums_key("c"), "".join(f"{hashlib.sha256(d).hexdigest()}  {n}\n" for n, d in sorted(listed.items())).encode())
    return store


def test_every_listed_file_comes_out_as_stored(tmp_path):
    assert verified_transcripts(_stored(tmp_path), "c") == dict(sorted(FILES.items()))


def test_a_changed_file_stops_the_pull_naming_it(tmp_path):
    store = _stored(tmp_path, sums={**FILES, "c-present.md": b"# other\n"})
    with pytest.raises(StoreError, match=r"c-present.md: sha256 [0-9a-f]{64} differs from SHA256SUMS's"):
        verified_transcripts(store, "c")


def test_files_and_sums_must_name_the_same_files(tmp_path):
    store = _stored(tmp_path, sums={k: v for k, v in FILES.items() if k != "refusals.json"})
    with pytest.raises(StoreError, match="not listed: refusals.json"):
        verified_transcripts(store, "c")
    store = _stored(tmp_path / "2", sums={**FILES, "c-extra.md": b"x"})
    with pytest.raises(StoreError, match="listed but missing: c-extra.md"):
        verified_transcripts(store, "c")


def test_nothing_to_pull_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="has no transcripts"):
        verified_transcripts(FileStore(tmp_path / "empty"), "c")
