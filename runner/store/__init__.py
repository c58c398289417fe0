"""Object storage: one interface, a local-directory backend and an S3 backend.

Everything the runner keeps (plans, ledgers, raw streams, artifacts, transcripts) goes
through this interface, so both executors and the transform share one layout and one set of
guarantees: create-only writes that two writers cannot both win, streams written as they
arrive and verified (byte count and sha256) when they are committed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from runner.errors import UserError
from runner.store.base import AlreadyExists, Described, NotFound, Salvaged, Store, StoreError, StreamWriter

if TYPE_CHECKING:
    from runner.settings import Settings

__all__ = ["AlreadyExists", "Described", "NotFound", "Salvaged", "Store", "StoreError", "StreamWriter", "open_store"]


def open_store(uri: str, settings: Settings | None = None) -> Store:
    """The store a URI names: ``file:///abs/dir`` or ``s3://bucket/prefix``."""
    if uri.startswith("file://"):
        from runner.store.file import FileStore

        return FileStore.from_uri(uri)
    if uri.startswith("s3://"):
        from runner.store.s3 import S3Store

        return S3Store.from_uri(uri, settings)
    raise UserError(f"store {uri!r}: use file:///absolute/dir or s3://bucket/prefix")
