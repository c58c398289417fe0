"""The gateway of a run on this host: `probe-runner run` starts it on loopback for the campaign
it runs, with a secret of its own (so no token outlives the run), and the local executor gives
each session a token of its attempt in place of the key."""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

from runner.gateway import tokens
from runner.gateway.server import Gateway, GatewayThread, check_upstream
from runner.layout import SessionKeys
from runner.metrics import GatewayMetrics
from runner.settings import Settings


class LocalGateway:
    """A running gateway and its secret; a context manager around the serving thread."""

    def __init__(self, settings: Settings, campaign: str, model: str, metrics: GatewayMetrics | None = None) -> None:
        assert settings.provider.api_key is not None, "the gateway holds provider.api_key"
        check_upstream(settings.provider.base_url)
        g = settings.gateway
        self.settings = settings
        self.model = model
        self.secret = tokens.new_secret()
        self.gateway = Gateway(settings.provider.base_url, settings.provider.api_key.get_secret_value(), self.secret,
                               g.prices, campaigns=[campaign], connect_timeout=g.connect_timeout_seconds,
                               read_timeout=g.read_timeout_seconds, policy=g, metrics=metrics)
        self._thread = GatewayThread(self.gateway)

    @property
    def url(self) -> str:
        return self._thread.url

    def __enter__(self) -> LocalGateway:
        self._thread.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.__exit__(*exc)

    def token(self, keys: SessionKeys, lifetime: float) -> str:
        """A token of this attempt, valid ``lifetime`` seconds, limited to the session's budget
        (budget.session_usd, each call's bound at most budget.call_usd) and the campaign's model."""
        b = self.settings.budget
        limit: Decimal | None = b.session_usd
        return tokens.mint(self.secret, tokens.Claims(
            keys.campaign, keys.probe, keys.session, keys.attempt, int(time.time() + lifetime),
            None if limit is None else str(limit), str(b.call_usd), self.model))

    def revoke(self, keys: SessionKeys) -> None:
        self.gateway.revoke((keys.campaign, keys.probe, keys.session, keys.attempt))

    def meter(self, keys: SessionKeys) -> dict[str, Any]:
        return self.gateway.meter((keys.campaign, keys.probe, keys.session, keys.attempt))
