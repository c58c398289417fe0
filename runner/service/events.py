"""Progress as events: long work in the service reports what happens as it happens through a
subscriber (a callable taking one event, as s3transfer's subscribers are told of a transfer's
progress), and the CLI renders each; the service prints nothing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from runner.status import CampaignStatus


@dataclass(frozen=True)
class StatusRead:
    """A watch read the campaign's status (once at the start, then once per interval)."""

    status: CampaignStatus


@dataclass(frozen=True)
class FileWritten:
    """``pull`` wrote one verified file."""

    path: Path


@dataclass(frozen=True)
class PartialStream:
    """``logs`` is about to print a stream that could not be proven complete (what was kept)."""

    key: str


Event = StatusRead | FileWritten | PartialStream


class Subscriber(Protocol):
    def __call__(self, event: Event, /) -> None:
        """Told of each event as it happens."""


def ignore(event: Event, /) -> None:
    """A subscriber that renders nothing."""
