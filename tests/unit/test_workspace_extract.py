"""The controller unpacks each session's workspace from a tar the session pod made: untrusted
input. Links are recreated as links and never followed, so no member can write outside the
directory it is unpacked into, however the members are ordered (issue 13: a member
``a -> /outside`` followed by ``a/x`` wrote ``/outside/x``)."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

from runner.executors.kubernetes import WorkspaceTooLarge, _extract_safely


def _tar(*members: tuple[str, str, str | bytes]) -> bytes:
    """(kind, name, link target or content) with kind "dir", "file" or "link", in this order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for kind, name, value in members:
            info = tarfile.TarInfo(name)
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, str(value)
                tar.addfile(info)
            elif kind == "hardlink":
                info.type, info.linkname = tarfile.LNKTYPE, str(value)
                tar.addfile(info)
            else:
                data = value if isinstance(value, bytes) else value.encode()
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _extract(data: bytes, dest: Path) -> list[str]:
    """As the controller does: the fetched tar is a file beside the directory it unpacks into."""
    path = dest.parent / f"{dest.name}.tar"
    path.write_bytes(data)
    return _extract_safely(path, dest)


def test_a_file_behind_a_planted_directory_link_is_not_written_outside(tmp_path):
    outside, dest = tmp_path / "outside", tmp_path / "dest"
    outside.mkdir()
    skipped = _extract(_tar(("link", "a", outside), ("file", "a/x", "planted"),
                                   ("dir", "a/sub", ""), ("link", "a/l", "/etc/passwd")), dest)
    assert list(outside.iterdir()) == []
    assert (dest / "a").is_symlink() and os.readlink(dest / "a") == str(outside)  # recreated, not followed
    assert skipped == ["a/x", "a/sub", "a/l"]


def test_a_relative_link_that_climbs_out_is_not_followed(tmp_path):
    outside, dest = tmp_path / "outside", tmp_path / "dest"
    outside.mkdir()
    skipped = _extract(_tar(("dir", "d", ""), ("link", "d/up", "../../outside"), ("file", "d/up/y", "planted")),
                              dest)
    assert list(outside.iterdir()) == []
    assert skipped == ["d/up/y"]


def test_a_file_replacing_a_link_replaces_the_link_not_its_target(tmp_path):
    victim, dest = tmp_path / "victim.txt", tmp_path / "dest"
    victim.write_text("unchanged")
    _extract(_tar(("link", "f", victim), ("file", "f", "new")), dest)
    assert victim.read_text() == "unchanged"
    assert not (dest / "f").is_symlink() and (dest / "f").read_text() == "new"


def test_an_ordinary_workspace_comes_out_whole(tmp_path):
    dest = tmp_path / "dest"
    skipped = _extract(_tar(("dir", "docs", ""), ("file", "docs/a.md", "# A\n"), ("link", "latest", "docs/a.md"),
                                   ("link", "etc", "/etc"), ("dir", "inner", ""), ("link", "inner/up", "../docs"),
                                   ("file", "/abs", "x"), ("file", "../escape", "x")), dest)
    assert (dest / "docs/a.md").read_text() == "# A\n"
    assert os.readlink(dest / "latest") == "docs/a.md" and os.readlink(dest / "etc") == "/etc"
    assert os.readlink(dest / "inner/up") == "../docs"
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*")) == [
        "docs", "docs/a.md", "etc", "inner", "inner/up", "latest"]
    assert skipped == ["/abs", "../escape"]
    assert not (tmp_path / "escape").exists() and not Path("/abs").exists()


def test_a_hard_link_is_unpacked_as_the_file_it_names(tmp_path):
    """A session's `ln docs/a.md b.md` leaves two names of one file; tar records the second as a
    hard link, which was dropped, so the record said b.md was deleted (issue 28)."""
    dest = tmp_path / "ws"
    skipped = _extract(_tar(("dir", "docs", ""), ("file", "docs/a.md", "A\n"), ("hardlink", "b.md", "docs/a.md")), dest)
    assert skipped == []
    assert (dest / "b.md").read_text() == "A\n" and not (dest / "b.md").is_symlink()
    (dest / "b.md").write_text("B\n")
    assert (dest / "docs/a.md").read_text() == "A\n"  # a copy, not a link into the first


@pytest.mark.parametrize("target", ["../outside", "/etc/hostname", "missing.md", "lnk/x"])
def test_a_hard_link_to_anything_but_a_file_unpacked_inside_is_skipped(tmp_path, target):
    (tmp_path / "outside").write_text("secret\n")
    dest = tmp_path / "ws"
    skipped = _extract(_tar(("link", "lnk", str(tmp_path)), ("hardlink", "h.md", target)), dest)
    assert skipped == ["h.md"] and not (dest / "h.md").exists()


def test_a_workspace_of_many_small_files_is_refused_before_it_fills_the_disk(tmp_path):
    """A session that leaves a million empty files packs to half a gigabyte but takes gigabytes
    of blocks and inodes unpacked: the unpacking stops at the bound on disk (issue 28)."""
    members = [("file", f"f{i}", "") for i in range(100)]
    with pytest.raises(WorkspaceTooLarge, match=r"more than kube.collect_max_bytes \(204800 bytes\) on disk"):
        _extract_safely_at(_tar(*members), tmp_path / "ws", 50 * 4096)
    assert len(list((tmp_path / "ws").iterdir())) == 50  # it stopped where the bound was passed
    assert _extract_safely_at(_tar(*members), tmp_path / "ws2", 100 * 4096) == []


def _extract_safely_at(data: bytes, dest: Path, max_disk: int) -> list[str]:
    path = dest.parent / f"{dest.name}.tar"
    path.write_bytes(data)
    return _extract_safely(path, dest, max_disk)
