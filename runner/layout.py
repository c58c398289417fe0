"""The public store layout of docs/design.md: every key a user or the engine reads is built here.

Attempt 1 of a session keeps docs/design.md's paths; a later attempt (``ledger resume``) writes
under ``attempts/<n>/`` beside them, so no captured byte of an earlier attempt is overwritten.
"""

from __future__ import annotations

from dataclasses import dataclass


def campaign_prefix(campaign: str) -> str:
    return f"campaigns/{campaign}"


def plan_key(campaign: str) -> str:
    return f"{campaign_prefix(campaign)}/plan.json"


def corpus_key(campaign: str) -> str:
    return f"{campaign_prefix(campaign)}/corpus.tar.gz"


def identifiers_key(campaign: str) -> str:
    """The identifiers of the corpus the campaign ran over: what ``cites`` may name."""
    return f"{campaign_prefix(campaign)}/identifiers.json"


def ledger_prefix(campaign: str) -> str:
    return f"{campaign_prefix(campaign)}/ledger/"


def ledger_head_key(campaign: str) -> str:
    """The ledger's anchored head (the last entry an append saw): outside the chain's prefix."""
    return f"{campaign_prefix(campaign)}/ledger-head.json"


def transcript_key(campaign: str, tier: str, arm: str) -> str:
    return f"{campaign_prefix(campaign)}/transcripts/{tier}-{arm}.md"


def waiting_key(campaign: str, share: str | None = None) -> str:
    """Why sessions of a running campaign wait to start (the run rewrites it: runner/executors/base.py Waiting);
    a run of one share of the campaign (runner/share.py, ``share`` its name) writes its own, under waiting_prefix."""
    return f"{campaign_prefix(campaign)}/waiting.json" if share is None else f"{waiting_prefix(campaign)}{share}.json"


def waiting_prefix(campaign: str) -> str:
    """The shares' waiting records: one writer each, which status reads together."""
    return f"{campaign_prefix(campaign)}/waiting/"


def share_ended_prefix(campaign: str, run: str) -> str:
    """Where the shares of one split run (``run``: its controller Job's uid) each say they ended:
    the share that finds every share ended runs the transform (runner/service/run.py)."""
    return f"{campaign_prefix(campaign)}/shares/{run}/"


def share_ended_key(campaign: str, run: str, share: str) -> str:
    return f"{share_ended_prefix(campaign, run)}{share}.json"


def refusals_key(campaign: str) -> str:
    return f"{campaign_prefix(campaign)}/transcripts/refusals.json"


def transformed_key(campaign: str) -> str:
    """The transform's receipt, written after everything else it writes: when, which reading
    of the ledger (ledger.sessions_digest), which SHA256SUMS. Outside transcripts/, so a pull
    never fetches it."""
    return f"{campaign_prefix(campaign)}/transformed.json"


def stopped_key(campaign: str) -> str:
    """Why the last run stopped with sessions that no retry of it starts (a failed confinement
    check, a refused key, the budget), and the ledger as it left it: what a watch ends on."""
    return f"{campaign_prefix(campaign)}/stopped.json"


def run_key(campaign: str) -> str:
    """When the campaign's latest run began (``run``, the controller) or was submitted (a new
    controller Job): a stop older than it is not the campaign's state any more."""
    return f"{campaign_prefix(campaign)}/run.json"


def transcripts_prefix(campaign: str) -> str:
    return f"{campaign_prefix(campaign)}/transcripts/"


SUMS_NAME = "SHA256SUMS"


def sums_key(campaign: str) -> str:
    """Beside the transcripts: the digest of every file the transform left there, as
    `sha256sum` prints them; `pull` checks every download against it."""
    return f"{transcripts_prefix(campaign)}{SUMS_NAME}"


@dataclass(frozen=True)
class SessionKeys:
    campaign: str
    probe: str
    session: str
    attempt: int = 1

    @property
    def prefix(self) -> str:
        base = f"{campaign_prefix(self.campaign)}/sessions/{self.probe}/{self.session}"
        return base if self.attempt == 1 else f"{base}/attempts/{self.attempt}"

    @property
    def stream(self) -> str:
        return f"{self.prefix}/stream.jsonl"

    @property
    def partial_stream(self) -> str:
        """What could be kept of a stream that cannot be proven complete (never the stream)."""
        return f"{self.prefix}/stream.incomplete.jsonl"

    @property
    def stderr(self) -> str:
        return f"{self.prefix}/stderr.log"

    @property
    def capture(self) -> str:
        return f"{self.prefix}/capture.json"

    @property
    def seal(self) -> str:
        return f"{self.prefix}/seal.json"

    def artifact(self, rel: str) -> str:
        return f"{self.prefix}/workspace/{rel}"
