"""The provider gateway's HTTP server (aiohttp, server and client): the only process that holds
the provider key.

A request is served when its token (``x-api-key`` or ``Authorization: Bearer``, where the CLI
puts ANTHROPIC_API_KEY or ANTHROPIC_AUTH_TOKEN) verifies, names a campaign this gateway serves
and an attempt not revoked, its path is one the CLI uses, and its session has room left under
its limit: all checked before its body is read. The body is then read up to
``gateway.max_body_bytes`` and held to the request policy (runner/gateway/policy.py: the
campaign's model, client-side tools only, the CLI's betas, ``max_tokens`` bounded), and the
most the call can cost (its bound) is reserved against the session's limit before it is
forwarded to the provider with the key in place of the token. The answer (status, headers, body;
server-sent events chunk by chunk, unbuffered) comes back unchanged, so the stream and its
costs stay the provider's; only the CLI's own headers are passed on.

The call is settled with the usage the provider's answer states (``message_start`` and
``message_delta`` events, or a JSON body's ``usage``), read to the answer's end whatever the
client does: a session that drops its connection, or cuts a stream before its last event, does
not end the gateway's reading. An answer the provider itself cut short settles at the bound. So
a session spends no more than its limit plus one call's bound, whatever it sends. A refusal is
answered in the Messages API's error shape, and its reason is logged with the attempt it names.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry

from runner import harnesses
from runner.errors import UserError
from runner.gateway import policy
from runner.gateway.tokens import CANARY_PROBE, KEY_PATH, KEY_REFUSED, LIMIT_SPENT, STOPPING, Claims, TokenError, verify
from runner.metrics import GatewayMetrics, Refusal
from runner.settings import GatewaySettings, ModelPrice, price_of

log = logging.getLogger(__name__)

HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
              "transfer-encoding", "upgrade", "host", "content-length"}
USAGE_FIELDS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
# GET KEY_PATH (runner/gateway/tokens.py): whether the provider accepts the gateway's key, by a
# token count (nothing spent), asked at most once per KEY_CHECK_SECONDS whoever asks (the canary,
# helm test, doctor --cluster): no token needed, as it forwards nothing of the asker's and tells
# nothing but the key's state.
KEY_CHECK_SECONDS = 30.0
SHUTDOWN_SECONDS = 5.0  # what calls still open get when a run's gateway stops



@dataclass
class Meter:
    """What one attempt's calls cost at the gateway."""

    calls: int = 0
    usage: dict[str, int] = field(default_factory=lambda: dict.fromkeys(USAGE_FIELDS, 0))
    usd: Decimal = Decimal(0)
    unpriced: set[str] = field(default_factory=set)  # models with no price: their calls are not in usd
    answered_as: set[str] = field(default_factory=set)  # "asked -> answered" where an answer named another model than its request's
    # the first refusal that every session of the campaign would meet (Refused.every_session):
    # with no call forwarded, the session never reached the model, for a reason of its settings
    every_session: str | None = None
    refused: int = 0
    in_flight: int = 0  # calls forwarded and not yet answered whole
    reserved: Decimal = Decimal(0)  # the bounds of the calls in flight
    # Where the meter is shared with other gateways (Shared: an install's replicas): what the
    # others hold of the attempt, as last read (None: not read yet), and what this one holds,
    # as written there; a call is forwarded only within what this one holds.
    others: Decimal | None = None
    held: Decimal = Decimal(0)
    claims: Claims | None = None  # the attempt's, as its last request named it
    unwritten: bool = False  # counted since the meter was last written (Shared)

    def record(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"answered_as": sorted(self.answered_as)} if self.answered_as else {}
        if self.every_session is not None:
            extra["refused_every_session"] = self.every_session
        return {"calls": self.calls, "usage": dict(self.usage), "cost_usd": str(self.usd),
                "unpriced_models": sorted(self.unpriced), "refused": self.refused, **extra}

    def state(self, held: Decimal | None = None) -> dict[str, Any]:
        """What this gateway metered and what it holds (``held``: a hold being written): kept
        where other replicas (or this one, restarted) and the controller read it."""
        return {**self.record(), "held_usd": format((self.held if held is None else held).normalize(), "f")}

    def committed(self) -> Decimal:
        """What this gateway has spent of the attempt or may still spend on the calls in flight."""
        return self.usd + self.reserved


def hold_for(limit: Decimal | None, call_usd: Decimal, others: Decimal, committed: Decimal, bound: Decimal,
             headroom: Decimal) -> Decimal | None:
    """How much one gateway should hold of an attempt whose ``committed`` (its call of ``bound``
    included) is past what it holds, when the others hold ``others``: None where the attempt
    had no room left before this call (the session's limit is spent), else the committed amount
    plus ``headroom`` for the calls to come, at most what the others leave of limit + call_usd.
    So the holds of all gateways together never pass limit + call_usd, and each gateway's
    spend stays within its hold."""
    if limit is None:
        return committed + headroom
    if others + committed - bound >= limit:
        return None
    return min(committed + headroom, limit + call_usd - others)  # >= committed: bound <= call_usd


class Shared(Protocol):
    """Where an attempt's meter is shared by several gateways (an install's replicas, and a
    gateway restarted), each holding part of the session's room: runner/gateway/cluster.py."""

    def others(self, claims: Claims) -> Decimal:
        """What the other gateways hold of the attempt (a read)."""

    def hold(self, claims: Claims, propose: Callable[[Decimal], dict[str, Any] | None | bool],
             accept: Callable[[dict[str, Any]], None]) -> bool:
        """Write this gateway's meter with a larger hold, against what the others hold at that
        moment (``propose(others)``: the state to write; True: what is held suffices already;
        None: no room), so that no two gateways hold the same room; ``accept`` the state once it
        is written. False where there was no room."""

    def changed(self, claims: Claims) -> None:
        """The meter should be written (its hold released, its last calls counted), soon."""


class UsageReader:
    """The usage of one answer, read from its bytes as they pass (never holding the body for
    an event stream: line by line)."""

    def __init__(self, event_stream: bool) -> None:
        self.event_stream = event_stream
        self.model: str | None = None
        self.usage: dict[str, Any] = {}
        self.complete = False  # the answer's end was read: its last usage stands
        self._rest = b""
        self._body: list[bytes] = []

    def feed(self, chunk: bytes) -> None:
        if not self.event_stream:
            self._body.append(chunk)
            return
        lines = (self._rest + chunk).split(b"\n")
        self._rest = lines.pop()
        for line in lines:
            self._line(line)

    def _line(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        try:
            event = json.loads(line[5:])
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        if event.get("type") == "message_start" and isinstance(event.get("message"), dict):
            self.model = event["message"].get("model") or self.model
            self._take(event["message"].get("usage"))
        elif event.get("type") == "message_delta":
            self._take(event.get("usage"))  # cumulative counts: the last one stands
        elif event.get("type") == "message_stop":
            self.complete = True

    def _take(self, usage: Any) -> None:
        if isinstance(usage, dict):
            self.usage.update({k: v for k, v in usage.items() if k in USAGE_FIELDS and isinstance(v, int)})
            if isinstance(usage.get("cache_creation"), dict):
                self.usage["cache_creation"] = usage["cache_creation"]

    def text(self) -> str:
        """A JSON answer's body as text (an error's message), for the log; empty for a stream."""
        return b"".join(self._body).decode(errors="replace")

    def close(self, status: int) -> None:
        """The answer was read to its end (``status``: its HTTP status): an event stream is whole
        where its message_stop came; a JSON body where it reads, and an error answer, which the
        provider does not bill, where it is an error."""
        if self.event_stream:
            self._line(self._rest)
            return
        try:
            body = json.loads(b"".join(self._body))
        except ValueError:
            return
        if isinstance(body, dict):
            self.model = body.get("model") if isinstance(body.get("model"), str) else None
            self._take(body.get("usage"))
            self.complete = status >= 400 or isinstance(body.get("usage"), dict)


def _error(status: int, kind: str, message: str) -> web.Response:
    """An answer in the Messages API's error shape, so the CLI reports it as the provider's would be."""
    return web.json_response({"type": "error", "error": {"type": kind, "message": message}}, status=status)


Attempt = tuple[str, str, str, int]


def check_upstream(base_url: str) -> None:
    """The key goes to the provider over TLS only; plain HTTP only to this host (the scripted
    provider of the demo and the tests)."""
    u = urlsplit(base_url)
    if u.scheme == "https":
        return
    host = u.hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if u.scheme != "http" or not loopback:
        raise UserError(f"provider.base_url {base_url}: the gateway sends the key over https only (plain http only "
                        "to a loopback address)")


class Gateway:
    """The server's state: who may call (``secret``, ``campaigns``, revoked attempts, and
    ``ended``: where the attempt's end is known elsewhere, its session pod), where to
    (``upstream``, ``key``, ``ca_file``: extra roots for the provider's TLS; ``origin``: where
    a token is bound to the address it is used from, why this one is not it), and what each
    attempt spent (``meters``). Where other gateways may serve the attempt too (replicas, a
    restart), the meter is ``shared``: a call is forwarded only within what this gateway holds
    there of the session's room, and a hold is raised (by ``gateway.hold_usd`` beyond the call,
    so one write serves several calls) against what the others hold at that moment. So a
    gateway killed mid-call has left its hold behind, counted in full, and nothing it forwarded
    goes unmetered; ``close`` gives back what an ended attempt holds beyond what it spent."""

    def __init__(self, upstream: str, key: str, secret: bytes, prices: Mapping[str, ModelPrice],
                 campaigns: Iterable[str] | None = None, connect_timeout: float = 30.0,
                 read_timeout: float = 600.0, ended: Callable[[Claims], str | None] | None = None,
                 origin: Callable[[Claims, str], str | None] | None = None, shared: Shared | None = None, ca_file: str | None = None,
                 policy: GatewaySettings | None = None, metrics: GatewayMetrics | None = None) -> None:
        self.upstream = upstream.rstrip("/")
        # counted where the process serves them (metrics.port), else on a registry nobody reads
        self.metrics = metrics if metrics is not None else GatewayMetrics(CollectorRegistry())
        self.policy = policy or GatewaySettings.model_validate({"prices": dict(prices)})
        self.key = key
        self.secret = secret
        self.prices = prices
        self.campaigns = set(campaigns) if campaigns is not None else None  # None: any campaign the secret signed
        self.revoked: set[Attempt] = set()
        self.meters: dict[Attempt, Meter] = {}
        self.ended = ended or (lambda claims: None)
        self.origin = origin
        self.shared = shared
        self.ca_file = ca_file
        self._lock = threading.Lock()  # revocations come from the runner's threads
        self._key_lock = asyncio.Lock()
        self._key_checked: tuple[float, tuple[int, str]] | None = None  # (when, (status, why)) of the last key check
        # Set once this gateway is being replaced (serve(): SIGTERM): it serves calls on while the
        # Service forgets it, but vouches for no key (a rollout after a key's fix replaces it).
        self.stopping = False
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout, sock_read=read_timeout)
        self._client: aiohttp.ClientSession | None = None

    # -- what the runner calls ----------------------------------------------------------------
    def revoke(self, attempt: Attempt) -> None:
        """The attempt's outcome is journaled: its token is refused from now on."""
        with self._lock:
            self.revoked.add(attempt)

    def meter(self, attempt: Attempt) -> dict[str, Any]:
        with self._lock:
            return self.meters.get(attempt, Meter()).record()

    def forget(self, gone: Callable[[Attempt], bool]) -> list[Attempt]:
        """Drop the meters of attempts that are ``gone`` (their pods deleted: their tokens are
        refused for good) and have no call in flight; a long-lived gateway holds only the
        running attempts'. Returns what was dropped."""
        with self._lock:
            dropped = [a for a, m in self.meters.items() if m.in_flight == 0 and gone(a)]
            for a in dropped:
                del self.meters[a]
        return dropped

    def state_of(self, attempt: Attempt) -> dict[str, Any] | None:
        """The meter's state as it should be written (Shared.changed); None once dropped."""
        with self._lock:
            meter = self.meters.get(attempt)
            return None if meter is None else meter.state()

    def close(self, ended: Callable[[Claims], bool]) -> list[Claims]:
        """Give back what attempts that ``ended`` (their harness is over, their pod going)
        hold beyond what they spent, where no call of theirs is in flight, so the controller
        reads their meters as settled. Returns those to write."""
        closed = []
        with self._lock:
            for m in self.meters.values():
                if m.claims is not None and m.in_flight == 0 and (m.held != m.usd or m.unwritten) and ended(m.claims):
                    m.held, m.unwritten = m.usd, False
                    closed.append(m.claims)
        if self.shared is not None:
            for claims in closed:
                self.shared.changed(claims)
        return closed

    # -- the server ---------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.policy.max_body_bytes)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_startup.append(self._open)
        app.on_shutdown.append(self._close)  # first: calls still open end now, not at the shutdown timeout
        return app

    async def _open(self, _: web.Application) -> None:
        tls: ssl.SSLContext | bool = True
        if self.ca_file:
            tls = ssl.create_default_context()
            tls.load_verify_locations(self.ca_file)  # beside the public roots
        self._client = aiohttp.ClientSession(timeout=self._timeout, auto_decompress=False,
                                             connector=aiohttp.TCPConnector(limit=0, ssl=tls))

    async def _close(self, _: web.Application) -> None:
        if self._client is not None:
            await self._client.close()

    def _refuse(self, request: web.Request, claims: Claims | None, reason: Refusal, status: int, kind: str,
                why: str, every_session: bool = False) -> web.Response:
        """A refusal in the Messages API's shape, logged with ``why``, counted under ``reason``
        (one of a fixed set: never the session's words). ``every_session``: every session of
        the campaign would meet it (the meter keeps the first, for the campaign to halt on)."""
        who = claims.name if claims is not None else "no attempt"
        log.warning("refused %s %s (%s): %s", request.method, request.path, who, why)
        self.metrics.refused(reason, canary=claims is not None and claims.probe == CANARY_PROBE)
        if claims is not None:  # counted, and written with the meter's next write
            with self._lock:
                meter = self._meter(claims)
                meter.refused += 1
                meter.unwritten = True
                if every_session and meter.every_session is None:
                    meter.every_session = why
        return _error(status, kind, f"probe-runner gateway: {why}")

    def _token(self, request: web.Request) -> str | None:
        if "x-api-key" in request.headers:
            return request.headers["x-api-key"]
        auth = request.headers.get("authorization", "")
        return auth[7:] if auth.lower().startswith("bearer ") else None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.method in ("HEAD", "GET") and request.path == "/":
            return web.Response(status=200)  # the CLI's reachability check: nothing to forward
        if request.method == "GET" and request.path == KEY_PATH:
            if self.stopping:  # the canary asks again, on a new connection, which reaches a pod that stays
                return _error(503, "overloaded_error", f"probe-runner gateway: {STOPPING}")
            return await self._key_check()
        token = self._token(request)
        if token is None:
            return self._refuse(request, None, "token", 401, "authentication_error", "no session token")
        try:
            claims = verify(self.secret, token, time.time())
        except TokenError as e:
            return self._refuse(request, None, "token", 401, "authentication_error", f"token refused: {e}")
        if self.campaigns is not None and claims.campaign not in self.campaigns:
            return self._refuse(request, claims, "campaign", 401, "authentication_error",
                                f"token refused: campaign {claims.campaign} is not served here")
        with self._lock:
            revoked = claims.attempt_key in self.revoked
        if revoked:
            return self._refuse(request, claims, "ended", 401, "authentication_error", "token refused: the attempt has ended")
        ended = self.ended(claims)
        if ended is not None:
            return self._refuse(request, claims, "ended", 401, "authentication_error", f"token refused: {ended}")
        elsewhere = self.origin(claims, request.remote or "") if self.origin is not None else None
        if elsewhere is not None:
            return self._refuse(request, claims, "origin", 401, "authentication_error", f"token refused: {elsewhere}")
        if (request.method, request.path) not in harnesses.HARNESS.calls.routes:
            return self._refuse(request, claims, "route", 404, "not_found_error", f"{request.method} {request.path} is not a path the CLI uses")
        metered = request.path == "/v1/messages"  # count_tokens is free
        if metered and self.shared is not None:
            with self._lock:
                unread = self._meter(claims).others is None
            if unread:  # before its first call here, whatever was refused before
                try:
                    others = await asyncio.to_thread(self.shared.others, claims)
                except Exception as e:  # noqa: BLE001 - not forwarded: the CLI retries a 503
                    return self._unmetered(claims, e)
                with self._lock:
                    meter = self._meter(claims)
                    meter.others = others if meter.others is None else meter.others
        if metered and not self._room(claims):  # before the body is read: a spent session sends nothing more
            return self._spent(request, claims)
        try:
            body = await request.read()  # at most gateway.max_body_bytes: past it aiohttp answers 413
        except web.HTTPRequestEntityTooLarge:
            return self._refuse(request, claims, "size", 413, "request_too_large",
                                f"the body is over gateway.max_body_bytes ({self.policy.max_body_bytes} bytes)")
        try:
            call = policy.check(self.policy, claims.model, body, request.headers.get("anthropic-beta"),
                                request.rel_url.raw_query_string, counting=not metered)
        except policy.Refused as e:
            return self._refuse(request, claims, "policy", 400, "invalid_request_error", str(e), e.every_session)
        bound = Decimal(0)
        if metered:
            price = price_of(self.prices, call.model)
            if price is None and claims.limit() is not None:
                return self._refuse(request, claims, "price", 400, "invalid_request_error",
                                    f"model {call.model!r} has no price at the gateway (gateway.prices), so its calls could not "
                                    "be held to the session's limit", every_session=True)
            bound = policy.bound(price, call, policy.context_of(self.policy, call.model)) if price is not None else Decimal(0)
            if claims.limit() is not None and bound > claims.call():
                return self._refuse(request, claims, "bound", 400, "invalid_request_error",
                                    f"one call could cost up to ${bound:.6f} ({call.max_tokens} output tokens, a body of "
                                    f"{call.body_bytes} bytes), over the ${claims.call()} a call may add past the session's limit "
                                    "(budget.call_usd)", every_session=True)
            if not self._admit(claims, bound):
                return self._spent(request, claims)
        flight = _Flight(self, claims, metered, bound, call.one_hour_cache, call.model)
        forward: asyncio.Future[web.StreamResponse] | None = None
        try:
            if metered and self.shared is not None and not self._within_hold(claims):
                try:
                    held = await asyncio.to_thread(self.shared.hold, claims, lambda others: self._propose(claims, bound, others),
                                                   lambda state: self._accept(claims, state))
                except Exception as e:  # noqa: BLE001 - not forwarded: the CLI retries a 503
                    flight.end(None, reached=False)
                    return self._unmetered(claims, e)
                if not held:
                    flight.end(None, reached=False)
                    return self._spent(request, claims)
            # the reading runs on whatever the client does (a session gone mid-answer cancels
            # nothing): the call settles at the provider's own usage
            forward = asyncio.ensure_future(self._forward(request, claims, body, flight))
            return await asyncio.shield(forward)
        finally:
            if forward is None or forward.done():  # else the forward reads on, and settles the call itself
                flight.end(None)  # cut short before an answer was read: at its bound (a no-op once ended)

    def _meter(self, claims: Claims) -> Meter:
        """The attempt's meter (made at its first request); under the lock."""
        meter = self.meters.setdefault(claims.attempt_key, Meter())
        meter.claims = claims
        return meter

    async def _key_check(self) -> web.Response:
        """200 where the provider accepts the key (a token count); 403 where it refuses it (401
        or 403: the key is the operator's to fix); else 502 with its answer (the provider not
        reached, or another error). Asked again only KEY_CHECK_SECONDS after the last answer."""
        async with self._key_lock:
            if self._key_checked is None or time.monotonic() - self._key_checked[0] > KEY_CHECK_SECONDS:
                self._key_checked = (time.monotonic(), await self._ask_key())
        status, why = self._key_checked[1]
        if status == 200:
            return web.json_response({"key": "accepted", "provider": self.upstream})
        if status in (401, 403):
            return _error(403, "permission_error", f"probe-runner gateway: {why}")
        return _error(502, "api_error", f"probe-runner gateway: {why}")

    async def _ask_key(self) -> tuple[int, str]:
        assert self._client is not None
        body = json.dumps({"model": harnesses.HARNESS.calls.key_check_model, "messages": [{"role": "user", "content": "key check"}]}).encode()
        try:
            async with self._client.post(self.upstream + "/v1/messages/count_tokens", data=body, allow_redirects=False,
                                         headers={"x-api-key": self.key, "anthropic-version": "2023-06-01",
                                                  "content-type": "application/json"}) as resp:
                raw = await resp.read()
                status = resp.status
        except (OSError, TimeoutError, aiohttp.ClientError) as e:
            log.warning("the key check could not reach the provider at %s: %s: %s", self.upstream, type(e).__name__, e)
            return 0, f"the provider at {self.upstream} could not be reached ({type(e).__name__})"
        if status == 200:
            return 200, ""
        try:  # the provider's own words (an error object), else the start of its answer
            text = str(json.loads(raw)["error"]["message"])[:300]
        except (ValueError, KeyError, TypeError):
            text = raw[:300].decode(errors="replace")
        log.warning("the provider answered the key check with %s: %s", status, text)
        if status in (401, 403):
            return status, f"{KEY_REFUSED} (HTTP {status} from {self.upstream}): {text}"
        return status, f"the provider at {self.upstream} answered a token count with HTTP {status}: {text}"

    def _room(self, claims: Claims) -> bool:
        with self._lock:
            return _has_room(self._meter(claims), claims.limit())

    def _spent(self, request: web.Request, claims: Claims) -> web.Response:
        with self._lock:
            m = self.meters[claims.attempt_key]
            others, usd, in_flight, reserved = m.others, m.usd, m.in_flight, m.reserved
        held = f", ${others} held by other gateways" if others else ""
        return self._refuse(request, claims, "limit", 403, "permission_error",
                            f"{LIMIT_SPENT} (${claims.limit()}; ${usd} metered here{held}, {in_flight} call(s) in flight "
                            f"with ${reserved} reserved)")

    def _unmetered(self, claims: Claims, e: Exception) -> web.Response:
        log.error("%s: the call could not be metered before forwarding it: %s: %s", claims.name, type(e).__name__, e)
        self.metrics.failed()
        return _error(503, "api_error", "probe-runner gateway: the call could not be metered; try again")

    def _within_hold(self, claims: Claims) -> bool:
        with self._lock:
            m = self.meters[claims.attempt_key]
            return m.committed() <= m.held

    def _propose(self, claims: Claims, bound: Decimal, others: Decimal) -> dict[str, Any] | None | bool:
        """Shared.hold's ``propose``: what to write for a call of ``bound`` (already reserved)."""
        with self._lock:
            m = self.meters[claims.attempt_key]
            m.others = others
            if m.committed() <= m.held:
                return True  # another call's hold covers this one too
            held = hold_for(claims.limit(), claims.call(), others, m.committed(), bound, self.policy.hold_usd)
            return None if held is None else m.state(held)

    def _accept(self, claims: Claims, state: dict[str, Any]) -> None:
        with self._lock:
            m = self.meters[claims.attempt_key]
            m.held, m.unwritten = Decimal(state["held_usd"]), False

    def _admit(self, claims: Claims, bound: Decimal) -> bool:
        """Whether a call may start, its bound reserved: the session still has room (_room). So
        its calls together, however many at once, spend at most its limit plus one call's bound."""
        with self._lock:
            meter = self._meter(claims)
            if not _has_room(meter, claims.limit()):
                return False
            meter.in_flight += 1
            meter.reserved += bound
        return True

    async def _forward(self, request: web.Request, claims: Claims, body: bytes, flight: _Flight) -> web.StreamResponse:
        assert self._client is not None
        calls = harnesses.HARNESS.calls  # the request headers passed on: those the CLI sends (anthropic-beta once checked)
        headers = {k: v for k, v in request.headers.items() if k.lower() in calls.headers or k.lower().startswith(calls.header_prefixes)}
        headers["x-api-key"] = self.key
        headers["accept-encoding"] = "identity"  # metered as it passes: no compressed answer
        query = request.rel_url.raw_query_string  # as sent: the policy checked these bytes
        url = self.upstream + request.path + (f"?{query}" if query else "")
        started = time.monotonic()
        try:
            upstream = await self._client.request(request.method, url, headers=headers, data=body, allow_redirects=False)
        except aiohttp.ClientConnectorError as e:
            log.warning("upstream %s unreachable for %s: %s", url, claims.name, e)
            self.metrics.failed()
            flight.end(None, reached=False)  # the request never left: nothing to pay
            return _error(502, "api_error", f"probe-runner gateway: the provider could not be reached ({type(e).__name__})")
        except (TimeoutError, aiohttp.ClientError) as e:
            log.warning("upstream %s failed for %s: %s", url, claims.name, e)
            self.metrics.failed()
            return _error(502, "api_error", f"probe-runner gateway: the provider could not be reached ({type(e).__name__})")
        self.metrics.forwarded(len(body))
        reader = UsageReader("text/event-stream" in upstream.headers.get("content-type", ""))
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for k, v in upstream.headers.items():
            if k.lower() not in HOP_BY_HOP:
                response.headers.add(k, v)
        sent, received, client = 0, 0, True
        try:
            try:
                await response.prepare(request)
            except (ConnectionError, RuntimeError, aiohttp.ClientConnectionResetError):
                client = False
            async for chunk in upstream.content.iter_any():
                received += len(chunk)
                reader.feed(chunk)
                if client:
                    try:
                        await response.write(chunk)
                        sent += len(chunk)
                    except (ConnectionError, RuntimeError, aiohttp.ClientConnectionResetError):
                        client = False  # the session went: the answer is still read to its end
            reader.close(upstream.status)
            if upstream.status >= 400:  # a refused key, a throttle, an outage: the operator's to see
                log.warning("%s: the provider answered %s %s: %.300s", claims.name, upstream.status, upstream.reason or "",
                            reader.text())
            flight.end(reader)  # before the end reaches the session: its next call sees it
            if client:
                await response.write_eof()
        except (ConnectionError, RuntimeError, aiohttp.ClientConnectionResetError):
            pass  # the session went at the very end: nothing more to send
        finally:
            upstream.release()
            flight.end(reader)  # the provider's answer was cut short: at the bound
            self.metrics.answered(time.monotonic() - started, received)
            log.info("%s %s %s -> %s, %d bytes in %.3f s, usage %s%s", claims.name, request.method, request.path,
                     upstream.status, sent, time.monotonic() - started, reader.usage, "" if client else " (the session went)")
        return response

    def _count(self, claims: Claims, reader: UsageReader | None, bound: Decimal, one_hour: bool, reached: bool,
               model: str) -> None:
        """A metered call is over: it settles at its answer's usage where the answer was read
        whole, at nothing where the request never reached the provider, else at its bound. An
        answer is metered at the price of the model its request named (``model``), the price its
        bound was checked at: an answer naming another model (one the provider served in its
        place; not a dated id of the model asked for) is noted in the meter, not left unpriced."""
        with self._lock:
            meter = self._meter(claims)
            meter.unwritten = True
            meter.in_flight -= 1
            meter.reserved -= bound
            if not reached:
                pass
            elif reader is not None and reader.complete:
                price = price_of(self.prices, model)
                if reader.model and not reader.model.startswith(model):  # another model (a dated id of the same is not)
                    meter.answered_as.add(f"{model} -> {reader.model}")
                meter.calls += 1
                for k, v in reader.usage.items():
                    if isinstance(v, int):
                        meter.usage[k] = meter.usage.get(k, 0) + v
                if price is not None:
                    meter.usd += policy.cost(price, reader.usage, one_hour)
                elif reader.usage:
                    meter.unpriced.add(model)
            else:
                meter.calls += 1
                meter.usd += bound
                log.warning("%s: a call's answer was cut short (%s): metered at its bound, $%s", claims.name,
                            "usage so far " + json.dumps(reader.usage) if reader is not None else "no answer", bound)


def _has_room(meter: Meter, limit: Decimal | None) -> bool:
    """Whether a session has anything left under its limit: what is metered, the bounds of its
    calls in flight, and what other gateways hold of it."""
    return limit is None or (meter.others or 0) + meter.committed() < limit


class _Flight:
    """One forwarded call, ended exactly once on every path (answered, cut short, the upstream
    unreachable, the client gone): a metered call then settles and leaves the in-flight tally."""

    def __init__(self, gateway: Gateway, claims: Claims, metered: bool, bound: Decimal, one_hour: bool, model: str) -> None:
        self.gateway, self.claims, self.open, self.bound, self.one_hour = gateway, claims, metered, bound, one_hour
        self.model = model  # the request's: the price its bound was checked at, and the one it is metered at

    def end(self, reader: UsageReader | None, reached: bool = True) -> None:
        if self.open:
            self.open = False
            self.gateway._count(self.claims, reader, self.bound, self.one_hour, reached, self.model)


class GatewayThread:
    """A gateway on its own event loop in a background thread, for a run on this host: started
    on ``host`` (loopback) at a free port; ``url`` is what the sessions get as their base URL."""

    def __init__(self, gateway: Gateway, host: str | None = "127.0.0.1", port: int = 0,
                 shutdown_seconds: float = SHUTDOWN_SECONDS) -> None:
        self.gateway, self.host, self.port, self.shutdown_seconds = gateway, host, port, shutdown_seconds
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="gateway", daemon=True)

    def __enter__(self) -> GatewayThread:
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None:
            raise self._error
        if not self.url:
            raise RuntimeError("the provider gateway did not start within 30 s")
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop serving: calls still open get ``shutdown_seconds``, then the loop stops whatever
        they do (a stop that cannot finish is logged, never raised into the run's end)."""
        try:
            if self._runner is not None:
                asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(self.shutdown_seconds + 5)
        except Exception as e:  # noqa: BLE001 - the run's transform must still happen
            log.warning("the provider gateway did not stop cleanly: %s: %s", type(e).__name__, e)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._runner = web.AppRunner(self.gateway.app(), access_log=None, shutdown_timeout=self.shutdown_seconds)
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, self.host, self.port)
            self._loop.run_until_complete(site.start())
            port = self._runner.addresses[0][1]
            self.url = f"http://{self.host or '0.0.0.0'}:{port}"  # None: every address
        except BaseException as e:  # noqa: BLE001 - handed to the starting thread, which raises it
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        # Stopped: what is still pending (a handler the shutdown timeout left) is cancelled and
        # run to its end here, so nothing is collected later on a closed loop.
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()
