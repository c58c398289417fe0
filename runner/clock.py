"""The one clock every record is stamped by: UTC, milliseconds, ``Z`` (the ledger's entries,
capture records, stops and receipts), and its reading back. The standard library alone: the
pod's entry points stamp with it too."""

from __future__ import annotations

from datetime import UTC, datetime


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def timestamp(at: str) -> float:
    """The POSIX time of a stamp ``now()`` wrote (an entry's ``at``)."""
    return datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()
