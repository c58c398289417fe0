"""The local-directory backend (``file:///abs/dir``), the embedded default.

Writes go to a temporary file in the same directory, are fsynced and then renamed, so a crash
never leaves a half object under a key. Create-only puts use ``link(2)``, which fails when the
key exists: two writers cannot both win. A stream that was never committed keeps its bytes in
``<key>.partial`` for recovery: each chunk is handed to the OS as it is written, so a killed
process loses none of what it accepted (a power loss can lose what was not yet fsynced), and
:meth:`FileStore.salvage` keeps it under another key.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import IO
from urllib.parse import unquote, urlparse

from runner.errors import UserError
from runner.store.base import AlreadyExists, NotFound, Salvaged, Store, StoreError, StreamWriter


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileStore(Store):
    def __init__(self, root: Path):
        self.root = root
        self.uri = root.as_uri()

    @classmethod
    def from_uri(cls, uri: str) -> FileStore:
        parsed = urlparse(uri)
        path = Path(unquote(parsed.path))
        if parsed.netloc not in ("", "localhost") or not path.is_absolute():
            raise UserError(f"store {uri!r}: a file store needs an absolute path, file:///abs/dir")
        return cls(path)

    def _path(self, key: str) -> Path:
        if not key or key.startswith("/") or ".." in key.split("/"):
            raise StoreError(f"invalid key {key!r}")
        return self.root / key

    def _commit(self, tmp: Path, final: Path, create_only: bool) -> None:
        if create_only:
            try:
                os.link(tmp, final)
            except FileExistsError:
                raise AlreadyExists(f"{self.uri}/{final.relative_to(self.root)} exists") from None
            finally:
                tmp.unlink(missing_ok=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(final.parent)

    def put(self, key: str, data: bytes, *, create_only: bool = False) -> None:
        final = self._path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex}.tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        self._commit(tmp, final, create_only)

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError):
            raise NotFound(f"{self.uri}/{key} does not exist") from None

    def open(self, key: str) -> IO[bytes]:
        try:
            return open(self._path(key), "rb")
        except (FileNotFoundError, IsADirectoryError):
            raise NotFound(f"{self.uri}/{key} does not exist") from None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str) -> list[str]:
        base = self.root / prefix.rstrip("/") if prefix.rstrip("/") else self.root
        start = base if base.is_dir() else base.parent
        if not start.is_dir():
            return []
        keys = []
        for dirpath, _, files in os.walk(start):
            for name in files:
                if name.startswith(".") and name.endswith(".tmp"):
                    continue
                key = (Path(dirpath) / name).relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    keys.append(key)
        return sorted(keys)

    def writer(self, key: str, *, create_only: bool = True, salvage: bool = True) -> StreamWriter:
        return _FileStreamWriter(self, key, create_only, salvage)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def link(self, key: str, seconds: int) -> str:
        return self._path(key).as_uri()

    def salvage(self, key: str, dest: str) -> Salvaged | None:
        """The writer's ``<key>.partial`` becomes ``dest`` by a hard link, then goes: no byte is
        copied, and a crash in between leaves both names on the same file for the next call."""
        final, target = self._path(key), self._path(dest)
        partial = final.with_name(final.name + ".partial")
        if final.exists():  # committed; the writer died only before removing its .partial name
            partial.unlink(missing_ok=True)
            return None
        if partial.exists() and not partial.stat().st_size:  # it died before accepting a byte
            partial.unlink()
        if partial.exists():
            with open(partial, "rb") as f:
                os.fsync(f.fileno())
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(partial, target)
            except FileExistsError:
                if not os.path.samefile(partial, target):
                    raise AlreadyExists(f"{self.uri}/{dest} exists and holds other bytes than {key}.partial") from None
            _fsync_dir(target.parent)
            partial.unlink()
            _fsync_dir(partial.parent)
        if not target.exists():
            return None
        return {**self.describe(dest), "kept_from": f"{key}.partial"}


class _FileStreamWriter(StreamWriter):
    def __init__(self, store: FileStore, key: str, create_only: bool, salvage: bool = True):
        super().__init__()
        self.store, self.key, self.create_only = store, key, create_only
        self.final = store._path(key)
        self.final.parent.mkdir(parents=True, exist_ok=True)
        if create_only and self.final.exists():
            raise AlreadyExists(f"{store.uri}/{key} exists")
        self.partial = self.final.with_name(self.final.name + ".partial")
        self.salvage = salvage
        self._f = open(self.partial, "wb")

    def _write(self, data: bytes) -> None:
        self._f.write(data)
        self._f.flush()  # each chunk reaches the OS as it arrives: a killed runner loses none of it

    def commit(self) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()
        if self.partial.stat().st_size != self.size:
            raise StoreError(f"{self.key}: {self.partial.stat().st_size} bytes stored, {self.size} written")
        self.store._commit(self.partial, self.final, self.create_only)

    def abort(self) -> None:
        if not self._f.closed:
            self._f.flush()
            self._f.close()
        if not self.salvage:
            self.partial.unlink(missing_ok=True)
