"""The stored corpus archive is unpacked safely on every interpreter the images run: with the
standard library's "data" filter where it exists (3.11.4+), and member by member where it does
not (Debian bookworm's 3.11.2: the runner image built on a Debian python crashed on
``extractall(filter=...)`` in the real node tier)."""

from __future__ import annotations

import io
import tarfile

import pytest

from runner import corpus as inputs
from runner.errors import UserError


def _archive(*members: tuple[str, str, str]) -> bytes:
    """(kind, name, data-or-link) members: kind file | dir | sym | hard."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for kind, name, value in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                info.size = len(value)
                tar.addfile(info, io.BytesIO(value.encode()))
                continue
            info.type = {"dir": tarfile.DIRTYPE, "sym": tarfile.SYMTYPE, "hard": tarfile.LNKTYPE}[kind]
            info.linkname = value
            tar.addfile(info)
    return buf.getvalue()


@pytest.fixture(params=["with data_filter", "without data_filter"])
def interpreter(request, monkeypatch):
    if request.param == "without data_filter":
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    elif not hasattr(tarfile, "data_filter"):
        pytest.fail("this interpreter has no tarfile.data_filter; run the tests on 3.11.4 or later")
    return request.param


def test_a_corpus_with_files_dirs_and_inner_links_unpacks(interpreter, tmp_path):
    data = _archive(("dir", "docs", ""), ("file", "docs/a.md", "A"), ("sym", "docs/b.md", "a.md"),
                    ("sym", "latest", "docs"))
    inputs._unpack(data, tmp_path / "c")
    assert (tmp_path / "c" / "docs" / "b.md").read_text() == "A"
    assert (tmp_path / "c" / "latest" / "a.md").read_text() == "A"


@pytest.mark.parametrize("members", [
    [("file", "../outside", "x")],
    [("file", "/etc/outside", "x")],
    [("sym", "escape", "/etc")],
    [("sym", "escape", "../..")],
    [("hard", "escape", "/etc/passwd")],
], ids=["dot-dot", "absolute", "absolute-link", "relative-link-out", "hard-link-out"])
def test_a_member_that_would_land_outside_is_refused(interpreter, tmp_path, members):
    if members[0][1].startswith("/") and interpreter == "with data_filter":
        # The standard filter strips the leading "/": the member lands inside, which is as safe.
        inputs._unpack(_archive(*members), tmp_path / "c")
        assert (tmp_path / "c" / "etc" / "outside").read_text() == "x"
        return
    with pytest.raises((UserError, tarfile.FilterError)):
        inputs._unpack(_archive(*members), tmp_path / "c")
    assert not (tmp_path / "outside").exists()


def test_the_corpus_archive_is_the_same_bytes_on_every_submit_and_a_resubmit_prints_what_the_store_holds(tmp_path, monkeypatch):
    """Issue 29: "on a resubmit, submit prints a corpus sha256 that is not the stored object's
    (the archive is gzipped with the current time)". The same corpus packed at two times packs
    to the same bytes; and where the store already holds an archive of the same files in other
    bytes (one an earlier version wrote), the digest returned is the stored object's."""
    import gzip
    import time

    from runner import digest, layout
    from runner.store.file import FileStore

    corpus = tmp_path / "corpus"
    (corpus / "docs").mkdir(parents=True)
    (corpus / "docs/a.md").write_text("# A\n")
    digests = []
    for at, name in ((1_000_000_000.0, "one"), (1_900_000_000.0, "two")):
        monkeypatch.setattr(time, "time", lambda at=at: at)
        store = FileStore(tmp_path / name)
        digests.append(inputs.store_corpus(store, "c", corpus))
        assert digests[-1] == digest.of_bytes(store.get(layout.corpus_key("c")))
    assert digests[0] == digests[1]
    older = FileStore(tmp_path / "older")
    stored = gzip.compress(gzip.decompress(FileStore(tmp_path / "one").get(layout.corpus_key("c"))), mtime=12345)
    older.put(layout.corpus_key("c"), stored, create_only=True)
    assert inputs.store_corpus(older, "c", corpus) == digest.of_bytes(stored) != digests[0]
