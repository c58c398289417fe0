"""A campaign as the store holds it, and one runner of it per host: its plan as stored, its
ledger, the lock a run holds, the mark a run (or a submit) leaves as it begins."""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from runner import layout
from runner.clock import now
from runner.errors import UserError
from runner.ledger import Ledger
from runner.plan import Plan
from runner.settings import Settings
from runner.share import WHOLE, Share
from runner.store import Store, open_store


@contextmanager
def campaign_lock(settings: Settings, campaign: str, share: Share = WHOLE) -> Iterator[None]:
    """One runner per campaign on this host, or one per share of a split campaign
    (runner/share.py): a share's runner holds the campaign's lock shared and its share's alone,
    so shares run side by side and neither a second runner of a share nor a run of the whole
    campaign starts beside them; `ledger recover` needs the campaign's lock to be free."""
    settings.local.workdir.mkdir(parents=True, exist_ok=True)
    with ExitStack() as held:
        _flock(held, settings.local.workdir / f"{campaign}.lock", fcntl.LOCK_EX if share.whole else fcntl.LOCK_SH,
               f"campaign {campaign!r} is being run by another process on this host")
        if not share.whole:
            _flock(held, settings.local.workdir / f"{campaign}.{share.name}.lock", fcntl.LOCK_EX,
                   f"share {share.name} of campaign {campaign!r} is being run by another process on this host")
        yield


def _flock(held: ExitStack, path: Path, kind: int, taken: str) -> None:
    f = held.enter_context(open(path, "a+"))
    try:
        fcntl.flock(f, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        raise UserError(f"{taken} (lock {path})") from None


def mark_run(store: Store, campaign: str, by: str) -> None:
    """Record that a run of the campaign begins now (``by``: run, or submit for a new
    controller Job): what an earlier run's stop is then older than (status._stopped)."""
    store.put(layout.run_key(campaign), json.dumps({"at": now(), "by": by}).encode() + b"\n")


def stored_campaign(settings: Settings, campaign: str) -> tuple[Store, Plan]:
    """The store and the campaign's plan as it was stored; a clear error when there is none."""
    from runner.corpus import load_stored_plan

    store = open_store(settings.store, settings)
    return store, load_stored_plan(store, campaign)


def campaign_ledger(settings: Settings, campaign: str) -> tuple[Plan, Ledger]:
    """The campaign's plan as stored and its ledger."""
    store, plan = stored_campaign(settings, campaign)
    return plan, Ledger(store, plan.campaign)
