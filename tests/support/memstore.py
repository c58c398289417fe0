"""A third Store, in memory (issue 30's sketch: "a third store (in-memory, through the
conformance suite)"): tests/integration/test_store.py holds it to the same contract as the file
and S3 backends, so the contract is the Store class, not what its two product backends share.
Test-only: nothing in the product can name it."""

from __future__ import annotations

import base64
import io
import threading
from typing import IO

from runner.store.base import AlreadyExists, NotFound, Store, StoreError, StreamWriter


class MemoryStore(Store):
    def __init__(self) -> None:
        self.uri = "memory://"
        self.objects: dict[str, bytes] = {}
        self.partial: dict[str, bytes] = {}  # what an uncommitted writer accepted, for salvage
        self.lock = threading.Lock()

    def _key(self, key: str) -> str:
        if not key or key.startswith("/") or ".." in key.split("/"):
            raise StoreError(f"invalid key {key!r}")
        return key

    def put(self, key: str, data: bytes, *, create_only: bool = False) -> None:
        with self.lock:
            if create_only and self._key(key) in self.objects:
                raise AlreadyExists(f"{self.uri}{key} exists")
            self.objects[self._key(key)] = bytes(data)

    def get(self, key: str) -> bytes:
        try:
            return self.objects[self._key(key)]
        except KeyError:
            raise NotFound(f"{self.uri}{key} does not exist") from None

    def open(self, key: str) -> IO[bytes]:
        return io.BytesIO(self.get(key))

    def exists(self, key: str) -> bool:
        return self._key(key) in self.objects

    def list(self, prefix: str) -> list[str]:
        return sorted(k for k in list(self.objects) if k.startswith(prefix))

    def writer(self, key: str, *, create_only: bool = True, salvage: bool = True) -> StreamWriter:
        if create_only and self.exists(key):
            raise AlreadyExists(f"{self.uri}{key} exists")
        return _MemoryWriter(self, self._key(key), create_only, salvage)

    def delete(self, key: str) -> None:
        with self.lock:
            self.objects.pop(self._key(key), None)

    def link(self, key: str, seconds: int) -> str:
        return "data:application/octet-stream;base64," + base64.b64encode(self.get(key)).decode()

    def salvage(self, key: str, dest: str) -> dict | None:
        with self.lock:
            kept = self.partial.pop(self._key(key), b"")
            if key in self.objects:  # committed after all
                return None
            if kept and self.objects.setdefault(self._key(dest), kept) != kept:
                raise AlreadyExists(f"{self.uri}{dest} exists and holds other bytes than {key}'s writer accepted")
            if dest not in self.objects:  # nothing accepted
                return None
        return {**self.describe(dest), "kept_from": f"{key} (memory)"}


class _MemoryWriter(StreamWriter):
    def __init__(self, store: MemoryStore, key: str, create_only: bool, salvage: bool) -> None:
        super().__init__()
        self.store, self.key, self.create_only, self.salvage = store, key, create_only, salvage
        self.buf = bytearray()
        store.partial[key] = b""

    def _write(self, data: bytes) -> None:
        self.buf += data
        self.store.partial[self.key] = bytes(self.buf)

    def commit(self) -> None:
        self.store.put(self.key, bytes(self.buf), create_only=self.create_only)
        self.store.partial.pop(self.key, None)

    def abort(self) -> None:
        if not self.salvage:
            self.store.partial.pop(self.key, None)
