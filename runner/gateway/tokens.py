"""Session tokens: what a session holds instead of the provider key.

A token names one session attempt (campaign, probe, session, attempt), its expiry, and the
most the gateway lets it spend; it is signed with HMAC-SHA256 under a secret only the runner
and the gateway hold, so a session cannot make one for another attempt, campaign or limit.
Pure: no I/O, no clock of its own (the caller passes ``now``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import asdict, dataclass
from decimal import Decimal

PREFIX = "prt1"  # probe-runner token, version 1: a key format no provider issues
# The gateway's refusal of a session whose limit is spent: the harness reports it in its
# stream's result line, read as the session's own limit ending it (Harness.over_budget).
LIMIT_SPENT = "the session's spend limit is reached at the gateway"
CANARY_PROBE = "canary"  # the probe a confinement check's canary token names (never a plan's: runner/k8s/manifests.py)
KEY_PATH = "/probe-runner/key"  # GET: whether the provider accepts the gateway's key (server.py), the canary's route
STOPPING = "this gateway pod is stopping: ask again"  # its 503 to a key check (a rollout's old pod)
KEY_REFUSED = "the provider refused the key"  # how its 403 to a key check begins (the canary's result too)


class TokenError(Exception):
    """A token the gateway refuses; the message is the reason it logs."""


@dataclass(frozen=True)
class Claims:
    campaign: str
    probe: str
    session: str
    attempt: int
    expires: int                 # Unix seconds: the attempt's deadline
    limit_usd: str | None = None  # the session's limit: no call starts once it is spent (None: no limit)
    call_usd: str | None = None   # the most one call can cost: what the last call may add past the limit
    model: str | None = None      # the campaign's model: the one a call may name (None: any the gateway prices)
    nonce: str = ""              # random: two tokens of one attempt differ

    @property
    def attempt_key(self) -> tuple[str, str, str, int]:
        return (self.campaign, self.probe, self.session, self.attempt)

    @property
    def name(self) -> str:
        return f"{self.campaign}/{self.probe}/{self.session}#{self.attempt}"

    def limit(self) -> Decimal | None:
        return None if self.limit_usd is None else Decimal(self.limit_usd)

    def call(self) -> Decimal:
        return Decimal(self.call_usd or 0)


def new_secret() -> bytes:
    return secrets.token_bytes(32)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    """Strict: only the URL-safe alphabet, no padding, and the one encoding of its bytes (a
    lenient decoder ignores stray characters, so many strings would carry one MAC)."""
    try:
        data = base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)
    except (ValueError, TypeError):
        raise ValueError("not URL-safe base64") from None
    if _b64(data) != text:
        raise ValueError("not the canonical encoding")
    return data


def mint(secret: bytes, claims: Claims) -> str:
    body = _b64(json.dumps(asdict(claims) | {"nonce": claims.nonce or secrets.token_hex(8)},
                           sort_keys=True, separators=(",", ":")).encode())
    mac = hmac.new(secret, f"{PREFIX}.{body}".encode(), hashlib.sha256).digest()
    return f"{PREFIX}.{body}.{_b64(mac)}"


def verify(secret: bytes, token: str, now: float) -> Claims:
    """The token's claims, or TokenError saying why it is refused (forged, malformed, expired)."""
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != PREFIX:
        raise TokenError("not a session token")
    want = hmac.new(secret, f"{PREFIX}.{parts[1]}".encode(), hashlib.sha256).digest()
    try:
        mac = _unb64(parts[2])
    except ValueError:
        raise TokenError("not a session token") from None
    if not hmac.compare_digest(mac, want):
        raise TokenError("forged: the signature does not match")
    try:
        claims = Claims(**json.loads(_unb64(parts[1])))
    except (ValueError, TypeError):
        raise TokenError("malformed claims") from None
    if now >= claims.expires:
        raise TokenError(f"expired: {claims.name} ended at {claims.expires}")
    return claims
