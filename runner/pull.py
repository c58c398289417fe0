"""Pulling a campaign's transcripts: every file under its transcripts/ checked against the
SHA256SUMS the transform wrote beside them, before anything is written (``probe-runner pull``)."""

from __future__ import annotations

import hashlib

from runner import layout
from runner.errors import UserError
from runner.store import Store, StoreError


def verified_transcripts(store: Store, campaign: str) -> dict[str, bytes]:
    """Name -> bytes of every file under the campaign's transcripts/, each matching its line in
    SHA256SUMS, and exactly the files listed there; UserError when there is nothing to pull,
    StoreError when the stored files and their sums disagree."""
    prefix = layout.transcripts_prefix(campaign)
    keys = store.list(prefix)
    if not keys:
        raise UserError(f"campaign {campaign!r} has no transcripts in {store.uri} (run `probe-runner transform` first)")
    if layout.sums_key(campaign) not in keys:
        raise UserError(f"campaign {campaign!r}: no {layout.SUMS_NAME} beside the transcripts in {store.uri}: the "
                        f"transform has not finished; `probe-runner status {campaign} --watch` waits for it, "
                        f"`probe-runner transform {campaign}` writes it if no run will")
    sums = store.get(layout.sums_key(campaign))
    lines = [line.split("  ", 1) for line in sums.decode(errors="replace").splitlines()]
    if not all(len(x) == 2 and len(x[0]) == 64 for x in lines):
        raise StoreError(f"{store.uri}/{prefix}{layout.SUMS_NAME} is malformed; `probe-runner transform {campaign}` rewrites it")
    want = {name: hexdigest for hexdigest, name in lines}
    have = {k[len(prefix):] for k in keys} - {layout.SUMS_NAME}
    if have != set(want):
        extra, missing = sorted(have - set(want)), sorted(set(want) - have)
        raise StoreError(f"{store.uri}/{prefix}: the files differ from {layout.SUMS_NAME}"
                         + (f"; not listed: {', '.join(extra)}" if extra else "")
                         + (f"; listed but missing: {', '.join(missing)}" if missing else ""))
    fetched = {}
    for name in sorted(want):
        data = store.get(prefix + name)
        got = hashlib.sha256(data).hexdigest()
        if got != want[name]:
            raise StoreError(f"{store.uri}/{prefix}{name}: sha256 {got} differs from "
                             f"{layout.SUMS_NAME}'s {want[name]}; nothing was written")
        fetched[name] = data
    return fetched
