"""Content digests in the one form the engine compares: ``sha256:`` + 64 lowercase hex.

`headwater probe stale` compares a read's identity against the digest the corpus holds, so an
identity of any other form decides nothing; every digest of this package is made here.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import IO

DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
_DIGEST_RE = re.compile(DIGEST_PATTERN)
_CHUNK = 1 << 20


def of_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def of_text(text: str) -> str:
    return of_bytes(text.encode("utf-8"))


def of_stream(f: IO[bytes]) -> tuple[str, int]:
    """Digest and byte count of what ``f`` reads to its end, a chunk at a time."""
    h, size = hashlib.sha256(), 0
    while chunk := f.read(_CHUNK):
        h.update(chunk)
        size += len(chunk)
    return "sha256:" + h.hexdigest(), size


def of_file(path: Path) -> str:
    with open(path, "rb") as f:
        return of_stream(f)[0]


def is_digest(value: object) -> bool:
    return isinstance(value, str) and _DIGEST_RE.match(value) is not None
