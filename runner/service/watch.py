"""Following a campaign: its status read every interval, each read told to the subscriber,
until the campaign is settled (``settled``: what a watch ends on)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

from runner.executors.base import Phases
from runner.plan import Plan
from runner.service.events import StatusRead, Subscriber, ignore
from runner.service.outcome import watched_exit
from runner.service.stored import stored_campaign
from runner.settings import Settings
from runner.status import CampaignStatus, campaign_status
from runner.store import Store


@dataclass(frozen=True)
class StatusReport:
    status: CampaignStatus
    exit: int  # 0; after a watch that ended on a stopped run, that run's exit status


def settled(st: CampaignStatus) -> bool:
    """Nothing left to watch: every session is final and the transcripts of them are ready, or
    the last run stopped with sessions that nothing starts until someone acts (``stopped``)."""
    return (st.final == st.total and st.transcripts.ready) or st.stopped is not None


def follow(read: Callable[[], CampaignStatus], interval: float, on_event: Subscriber,
           sleep: Callable[[float], None] = time.sleep) -> CampaignStatus:
    """Read the status (``read``) every ``interval`` seconds, telling ``on_event`` of each read
    (``StatusRead``), until it is ``settled``, so a pull right after finds its transcripts, or a
    stopped run leaves nothing to wait for. Returns the last status."""
    st = read()
    on_event(StatusRead(st))
    while not settled(st):
        sleep(interval)
        st = read()
        on_event(StatusRead(st))
    return st


def status_reader(store: Store, plan: Plan, budget: Decimal | None) -> Callable[[], CampaignStatus]:
    """The campaign's status now, at each call (a captured stream's cost and its capture
    record's phases are read once)."""
    costs: dict[str, Decimal | None] = {}
    captured: dict[str, Phases] = {}
    return lambda: campaign_status(store, plan, costs, budget, captured)


def watch_campaign(store: Store, plan: Plan, settings: Settings, interval: float, on_event: Subscriber) -> StatusReport:
    """Follow the campaign until it is settled; the exit status is then the stopped run's."""
    st = follow(status_reader(store, plan, settings.budget.campaign_usd), interval, on_event)
    return StatusReport(st, watched_exit(st.stopped))


def status(settings: Settings, campaign: str, watch: bool = False, interval: float = 10.0,
           on_event: Subscriber = ignore) -> StatusReport:
    """The stored campaign's status now, or with ``watch`` once it is settled."""
    store, plan = stored_campaign(settings, campaign)
    if watch:
        return watch_campaign(store, plan, settings, interval, on_event)
    return StatusReport(status_reader(store, plan, settings.budget.campaign_usd)(), 0)
