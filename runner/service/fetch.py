"""Bringing what a campaign stored to its user: one session's raw stream, checked against the
digest the ledger recorded (``logs``), and the transcripts, every file verified before any is
written (``pull``)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import BinaryIO

from runner import layout
from runner.errors import UserError
from runner.ledger import Ledger
from runner.service.events import FileWritten, PartialStream, Subscriber, ignore
from runner.service.stored import stored_campaign
from runner.settings import Settings
from runner.store import StoreError, open_store


def copy_stream(settings: Settings, campaign: str, probe: str, session: str, attempt: int | None, out: BinaryIO,
                on_event: Subscriber = ignore) -> None:
    """Write the stream of ``probe``/``session`` (its latest attempt, or ``attempt``) to ``out``
    byte for byte; StoreError when it does not match the sha256 the ledger recorded. A stream
    that could not be proven complete is written as it was kept, after a ``PartialStream``."""
    store, plan = stored_campaign(settings, campaign)
    st = Ledger(store, plan.campaign).state(f"{probe}/{session}")
    if st.attempt == 0 and not attempt:
        raise UserError(f"{probe}/{session}: no such session has run in campaign {plan.campaign!r}")
    keys = layout.SessionKeys(plan.campaign, probe, session, attempt or st.attempt)
    recorded = (st.detail.get("stream") or {}) if st.attempt == keys.attempt else {}
    if store.exists(keys.stream):
        key, want = keys.stream, recorded.get("sha256") if recorded.get("key") == keys.stream else None
    elif store.exists(keys.partial_stream):
        key, want = keys.partial_stream, None
        on_event(PartialStream(key))
    else:
        raise UserError(f"{probe}/{session} attempt {keys.attempt}: no stream in {store.uri} (status {st.status})")
    sha = hashlib.sha256()
    with store.open(key) as f:
        while chunk := f.read(1 << 20):
            sha.update(chunk)
            out.write(chunk)
    out.flush()
    if want and "sha256:" + sha.hexdigest() != want:
        raise StoreError(f"{key}: read sha256:{sha.hexdigest()}, the ledger recorded {want}")


def pull(settings: Settings, campaign: str, dest: Path, on_event: Subscriber = ignore) -> list[Path]:
    """Write the campaign's verified transcripts and refusals under ``dest`` (nothing unless
    every file verifies), telling ``on_event`` of each file written; returns their paths."""
    from runner.pull import verified_transcripts

    files = verified_transcripts(open_store(settings.store, settings), campaign)
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for name, data in files.items():
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        on_event(FileWritten(target))
        out.append(target)
    return out
