"""The store interface and the errors every backend raises."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from types import TracebackType
from typing import IO, TypedDict

from runner import digest


class StoreError(Exception):
    """A store operation failed for good (after the retry policy, where one applies)."""


class NotFound(StoreError):
    pass


class AlreadyExists(StoreError):
    """A create-only write lost: the key exists."""


class Described(TypedDict):
    """A stored object as :meth:`Store.describe` reads it back (journaled in ledger details and
    capture records: the stream a session left)."""

    key: str
    bytes: int
    sha256: str  # "sha256:" + 64 hex (runner.digest)


class Salvaged(Described):
    """What :meth:`Store.salvage` kept of a dead writer's object: the object under its new key,
    and what it was kept from (the backend's words)."""

    kept_from: str


class StreamWriter(ABC):
    """An object written as its bytes arrive; visible under its key only once committed."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> None:
        if data:
            self._write(data)
            self._sha.update(data)
            self.size += len(data)

    @property
    def sha256(self) -> str:
        return "sha256:" + self._sha.hexdigest()

    @abstractmethod
    def _write(self, data: bytes) -> None: ...

    @abstractmethod
    def commit(self) -> None:
        """Make the object visible, after checking the stored bytes against size and sha256."""

    @abstractmethod
    def abort(self) -> None:
        """Give up; what was written stays recoverable where the backend can keep it."""

    def __enter__(self) -> StreamWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is not None:
            self.abort()


class Store(ABC):
    uri: str

    @abstractmethod
    def put(self, key: str, data: bytes, *, create_only: bool = False) -> None: ...

    @abstractmethod
    def get(self, key: str) -> bytes: ...

    @abstractmethod
    def open(self, key: str) -> IO[bytes]:
        """A binary reader of the object (the caller closes it)."""

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def list(self, prefix: str) -> list[str]:
        """Every key under ``prefix``, sorted."""

    @abstractmethod
    def writer(self, key: str, *, create_only: bool = True, salvage: bool = True) -> StreamWriter:
        """``salvage``: an aborted write keeps what it wrote for ``salvage`` (a session's stream);
        False: an aborted write leaves nothing behind (a copy whose source is still on disk)."""

    @abstractmethod
    def delete(self, key: str) -> None: ...

    @abstractmethod
    def link(self, key: str, seconds: int) -> str:
        """A URL a browser opens the object at, valid for at least ``seconds`` where the
        backend can only lend access for a while (the campaign report's links)."""

    @abstractmethod
    def salvage(self, key: str, dest: str) -> Salvaged | None:
        """Keep under ``dest`` (create-only) what an uncommitted writer of ``key`` had accepted
        before its process died, and describe it (:meth:`describe`); None when it left nothing
        or committed ``key`` after all.

        A killed runner's stream must not be lost, yet it can never be proven complete, so it
        is kept beside the stream's key, never under it. Safe to call again after a crash
        part-way: it finishes the same salvage.
        """

    def describe(self, key: str) -> Described:
        """Key, byte count and sha256 of a stored object, read back from the store."""
        with self.open(key) as f:
            sha, size = digest.of_stream(f)
        return {"key": key, "bytes": size, "sha256": sha}

    def iter_lines(self, key: str) -> Iterator[bytes]:
        with self.open(key) as f:
            yield from f
