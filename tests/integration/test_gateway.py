"""The provider gateway (issue 15, items 1-3): the key stays with the gateway, each session
holds a token of its attempt, and every call made with it is metered.

The session tests run `probe-runner run` with the local executor and the real Claude Code CLI
against the scripted provider; the server tests run runner.gateway.server against small
upstreams on loopback, through real sockets.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import secrets
import subprocess
import sys
import threading
import time
from decimal import Decimal
from http.server import ThreadingHTTPServer

import pytest
from wire import RecordingUpstream  # tests/ is on the path (tests/conftest.py)

from runner.demo import CORPUS, PLAN
from runner.gateway import tokens
from runner.gateway.server import Gateway, GatewayThread
from runner.k8s import canary
from runner.ledger import Ledger
from runner.settings import DEFAULT_PRICES
from runner.store.file import FileStore
from runner.stream import money
from tests.support.waiting import until

MODEL = "claude-sonnet-4-5-20250929"
TASK_MATCH = "status of decision HW-DR-0052"  # the demo's HW-PRB-0007 task
SIDE = "side call please"


def _side_call_command() -> str:
    """Three calls to the gateway with the session's own token, outside the CLI (of the
    campaign's model: another is refused, tests/integration/test_hostile_session.py)."""
    body = json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 10, "tools": [{"name": "t", "input_schema": {"type": "object"}}],
                       "messages": [{"role": "user", "content": SIDE}]})
    one = ("curl -s -o /dev/null -w '%{http_code} ' \"$ANTHROPIC_BASE_URL/v1/messages\" -H \"x-api-key: $ANTHROPIC_API_KEY\" "
           f"-H 'content-type: application/json' -H 'anthropic-version: 2023-06-01' -d '{body}'")
    return f"echo side-calls: $({one}; {one}; {one})"


def _scenarios(key_head: str, key_tail: str) -> dict:
    look = ("env | grep ^ANTHROPIC_; "
            "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c '^ANTHROPIC_API_KEY=prt1' ; "
            f"K={key_head}; echo \"found:[$(grep -rIls --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev "
            f"--exclude-dir=usr \"${{K}}{key_tail}\" / /proc/self/environ)]\"")
    return {"scenarios": [
        {"name": "look-for-the-key", "match": TASK_MATCH, "model": MODEL, "usage": {"input_tokens": 1200, "output_tokens": 80},
         "turns": [{"tool_uses": [{"name": "Bash", "input": {"command": look}}]},
                   {"tool_uses": [{"name": "Bash", "input": {"command": _side_call_command()}}]},
                   {"text": "The decision file states its status on its own line.\nHW-DR-0052 current."}]},
        {"name": "side", "match": SIDE, "model": MODEL, "usage": {"input_tokens": 100000, "output_tokens": 1000},
         "turns": [{"text": "side answer"}]},
    ]}


def test_a_session_finds_no_key_and_its_side_calls_are_metered_and_stopped_at_its_limit(
        tmp_path, scripted_provider, claude_command):
    """Issue 15: "a session's Bash (real CLI) finds no key in its environment, configuration
    directory, or anywhere it can read", and "meter every request of a token ... and enforce the
    session's limit at the gateway too, so side calls count". The session's Bash looks for the
    key, then makes three calls of $0.315 with its own token: at a $0.5 session limit the third
    is refused, and so is the CLI's next call. The gateway's meter holds the side calls, the
    stream's cost does not, and the transcript's prose says both."""
    key = "sk-ant-test-" + secrets.token_hex(12)
    head, tail = key[:12], key[12:]
    provider = scripted_provider(_scenarios(head, tail), api_key=key)
    plan = json.loads(PLAN.read_text())
    plan.update(probes=plan["probes"][:1], arms=["present"], repetitions=1)
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    env = {**os.environ, "RUNNER_STORE": (tmp_path / "store").as_uri(), "RUNNER_LOCAL__WORKDIR": str(tmp_path / "work"),
           "RUNNER_HARNESS__COMMAND": claude_command[0], "RUNNER_PROVIDER__API_KEY": key,
           "RUNNER_PROVIDER__BASE_URL": provider.base_url, "RUNNER_BUDGET__SESSION_USD": "0.5"}
    done = subprocess.run([sys.executable, "-m", "runner", "-v", "run", str(tmp_path / "plan.json"), "--corpus", str(CORPUS)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    store = FileStore(tmp_path / "store")
    (state,) = Ledger(store, "demo").sessions().values()
    raw = store.get(state.detail["stream"]["key"])
    assert key.encode() not in raw and head.encode() + tail.encode() not in raw
    results = [b.get("content") for line in raw.splitlines() for m in [json.loads(line)] if m.get("type") == "user"
               for b in m["message"]["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]
    looked, side = (r if isinstance(r, str) else json.dumps(r) for r in results[:2])
    assert "ANTHROPIC_API_KEY=prt1." in looked and "found:[]" in looked, looked  # a token; no file holds the key
    assert "side-calls: 200 200 403" in side, side
    # Every request reached the provider with the key, none with a token.
    seen = {r["credential"] for r in provider.requests if r["path"].startswith("/v1/messages")}
    assert seen == {"key"}, seen
    capture = json.loads(store.get(f"campaigns/demo/sessions/{state.key}/capture.json"))
    meter = capture["gateway"]
    assert meter["calls"] == 2 + 2 and meter["refused"] == 2  # 2 CLI calls answered, 2 side calls; 1 side + 1 CLI refused
    assert Decimal(meter["cost_usd"]) == 2 * Decimal("0.0048") + 2 * Decimal("0.315")
    stream_cost = money(Decimal(str(json.loads(raw.splitlines()[-1])["total_cost_usd"])))  # as the books read it
    assert stream_cost.quantize(Decimal("1e-6")) == Decimal("0.0096")
    transcript = " ".join(store.get("campaigns/demo/transcripts/campaign-present.md").decode().split())
    assert ("metered 4 call(s) of 1 session(s) at $0.639600 from the provider's usage fields; their streams state "
            "$0.009600. They differ for HW-PRB-0007 present-001 (gateway $0.639600, stream $0.009600)") in transcript
    assert "It refused 2 request(s)" in transcript
    # The budget's books settle the attempt at what the gateway metered, not the stream's $0.0096.
    assert Decimal(state.detail["cost_usd"]) == Decimal(meter["cost_usd"])
    assert "with its token) ended 1 session(s) (HW-PRB-0007 present-001)" in transcript  # an observation, answer null
    assert "refused POST /v1/messages (demo/HW-PRB-0007/present-001#1): the session's spend limit is reached" in done.stderr


# ---- the server against small upstreams ------------------------------------------------------

class _Upstream(RecordingUpstream):
    """An SSE answer in three chunks; the second waits for the test's go (so a buffering
    gateway would hold the first), or a 529 with a retry-after header."""

    go = threading.Event()
    seen: list[dict] = []

    def do_POST(self) -> None:
        body = self.recorded_body()
        if b"overloaded" in body:
            self.answer_json(529, b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}', retry_after="7")
            return
        self.start_events(request_id="req_upstream_1")
        for i, chunk in enumerate(SSE):
            if i == 1:
                _Upstream.go.wait(10)
            self.chunk(chunk)
        self.wfile.write(b"0\r\n\r\n")


SSE = [
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","model":"' + MODEL.encode()
    + b'","usage":{"input_tokens":1000,"output_tokens":1,"cache_read_input_tokens":2000}}}\n\n',
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}\n\n',
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":500}}\n\n'
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
]


@pytest.fixture
def upstream():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Upstream.go.clear()
    _Upstream.seen.clear()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture
def gateway(upstream):
    secret = tokens.new_secret()
    g = Gateway(upstream, "the-real-key", secret, DEFAULT_PRICES, campaigns=["camp"])
    with GatewayThread(g) as served:
        yield g, secret, served.url


def _token(secret: bytes, campaign: str = "camp", session: str = "s-001", expires_in: float = 600,
           limit: str | None = None, call: str | None = None) -> str:
    return tokens.mint(secret, tokens.Claims(campaign, "P-1", session, 1, int(time.time() + expires_in), limit, call))


# A request of the CLI's shape, long enough that its bound (3,100 bytes of input at most, 500 tokens
# of output) covers what the upstream's answer states (1,000 in, 2,000 cache reads, 500 out).
BODY = json.dumps({"model": MODEL, "stream": True, "max_tokens": 500,
                   "messages": [{"role": "user", "content": "x" * 3000}]}).encode()


def _post(url: str, token: str | None, path: str = "/v1/messages?beta=true", body: bytes = BODY):
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=20)
    headers = {"content-type": "application/json", **({"x-api-key": token} if token else {})}
    conn.request("POST", path, body=body, headers=headers)
    return conn, conn.getresponse()


def test_an_event_stream_comes_through_unbuffered_and_unchanged_with_the_key_added(gateway):
    g, secret, url = gateway
    token = _token(secret)
    conn, resp = _post(url, token)
    assert resp.status == 200 and resp.getheader("request-id") == "req_upstream_1"
    first = resp.read1(65536)
    # The upstream holds its second chunk until the first has reached the client: a buffering
    # gateway would never deliver it, and this read would time out.
    assert first == SSE[0], first
    _Upstream.go.set()
    rest = resp.read()
    conn.close()
    assert first + rest == b"".join(SSE)
    (req,) = _Upstream.seen
    assert req["headers"]["x-api-key"] == "the-real-key" and token not in json.dumps(req["headers"])
    assert req["path"] == "/v1/messages?beta=true" and req["body"] == BODY
    # Metered from the usage fields: 1000 in, 500 out (the delta's count stands), 2000 cache reads.
    meter = g.meter(("camp", "P-1", "s-001", 1))
    assert meter["calls"] == 1 and meter["usage"]["output_tokens"] == 500
    assert Decimal(meter["cost_usd"]) == (Decimal(1000) * 3 + Decimal(500) * 15 + Decimal(2000) * Decimal("0.30")) / 10**6


def test_a_provider_error_comes_back_unchanged_and_is_logged_at_warning(gateway, caplog):
    """Issue 29: "the gateway logs the provider's refusals at warning": an operator sees a
    refused key, a throttle or an outage in the gateway's log, with the provider's words."""
    _, secret, url = gateway
    conn, resp = _post(url, _token(secret), body=json.dumps({"model": MODEL, "max_tokens": 10, "messages": [
        {"role": "user", "content": "overloaded"}]}).encode())
    assert resp.status == 529 and resp.getheader("retry-after") == "7"
    assert json.loads(resp.read())["error"]["type"] == "overloaded_error"
    conn.close()
    (record,) = [r for r in caplog.records if "the provider answered" in r.getMessage()]
    assert record.levelname == "WARNING" and "camp/P-1/s-001#1: the provider answered 529" in record.getMessage()
    assert "overloaded_error" in record.getMessage()


@pytest.mark.parametrize("case, reason", [
    ("ended", "token refused: the attempt has ended"),
    ("other campaign", "token refused: campaign other is not served here"),
    ("forged", "token refused: forged: the signature does not match"),
    ("expired", "token refused: expired: camp/P-1/s-001#1 ended at"),
    ("no token", "no session token"),
    ("outside the allow-list", "GET /v1/files is not a path the CLI uses"),
    ("limit spent", "the session's spend limit is reached at the gateway ($0; $0 metered here, 0 call(s) in flight with $0 reserved"),
    ("unpriced model", "model 'claude-next-9' has no price at the gateway (gateway.prices), so its calls could not be held"),
])
def test_a_token_or_path_the_gateway_must_refuse_is_refused_with_its_reason_logged(gateway, caplog, case, reason):
    g, secret, url = gateway
    token = {"ended": _token(secret), "other campaign": _token(secret, campaign="other"),
             "forged": _token(tokens.new_secret()), "expired": _token(secret, expires_in=-1), "no token": None,
             "outside the allow-list": _token(secret), "limit spent": _token(secret, limit="0"),
             "unpriced model": _token(secret, limit="1")}[case]
    if case == "ended":
        g.revoke(("camp", "P-1", "s-001", 1))
    caplog.set_level(logging.WARNING, logger="runner.gateway.server")
    if case == "outside the allow-list":
        host, port = url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=20)
        conn.request("GET", "/v1/files", headers={"x-api-key": token})
        resp = conn.getresponse()
    else:
        conn, resp = _post(url, token, body=json.dumps({"model": "claude-next-9", "max_tokens": 10}).encode()
                           if case == "unpriced model" else BODY)
    body = json.loads(resp.read())
    conn.close()
    assert resp.status in (400, 401, 403, 404) and body["type"] == "error" and reason in body["error"]["message"]
    assert any(reason in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert not _Upstream.seen, "a refused request reached the provider"


def test_concurrent_calls_of_one_session_cannot_pass_its_limit_together(gateway, caplog):
    """Five calls at once with one token (a session's Bash can start them in the background):
    each answer costs $0.0111 and may cost up to its bound, $0.0192 (budget.call_usd is $0.02);
    the limit is $0.01. Before, each was checked against what was metered, $0, and all five went
    through ($0.0555, past limit + one call). Now a call in flight holds its bound: one goes, four
    are refused, and the session spends at most its limit plus one call's bound."""
    g, secret, url = gateway
    token = _token(secret, limit="0.01", call="0.02")
    caplog.set_level(logging.WARNING, logger="runner.gateway.server")
    statuses: list[int] = []

    def call() -> None:
        conn, resp = _post(url, token)
        resp.read()
        statuses.append(resp.status)
        conn.close()

    threads = [threading.Thread(target=call) for _ in range(5)]
    for t in threads:
        t.start()
    until(lambda: len(statuses) >= 4, 10, "the refused calls' answers", seen=lambda: statuses)  # they answer at once
    _Upstream.go.set()  # the one forwarded may now finish
    for t in threads:
        t.join(20)
    assert sorted(statuses) == [200, 403, 403, 403, 403], statuses
    assert len(_Upstream.seen) == 1
    meter = g.meter(("camp", "P-1", "s-001", 1))
    assert Decimal(meter["cost_usd"]) == Decimal("0.0111") <= Decimal("0.01") + Decimal("0.02")
    assert sum("1 call(s) in flight with $0.01920375 reserved" in r.getMessage() for r in caplog.records) == 4


def test_no_call_is_left_in_flight_by_a_client_that_goes_or_a_body_too_large(gateway):
    """A review found a call whose body could not be read (past 64 MiB: 413) stayed in the
    in-flight tally for good, each taking budget.call_usd off the session's room: with a $1
    limit and $1 a call, the next call was refused. Also a client that leaves mid-stream."""
    g, secret, url = gateway
    token = _token(secret, limit="1", call="1")
    conn, resp = _post(url, token, body=json.dumps({"model": MODEL, "pad": "x" * (65 << 20)}).encode())
    assert resp.status == 413
    conn.close()
    conn, resp = _post(url, token)  # the next call still has the whole limit's room
    assert resp.status == 200 and resp.read1(65536) == SSE[0]
    conn.close()  # ... and goes after its first chunk
    _Upstream.go.set()
    meter = g.meters[("camp", "P-1", "s-001", 1)]
    until(lambda: not meter.in_flight and meter.calls, 10, "the call metered and none in flight")
    assert meter.in_flight == 0 and meter.calls == 1


def test_a_run_s_gateway_stops_even_with_a_call_still_open(upstream):
    """A review found the run's end could wait 30 s on a call still open and then raise, so the
    transform never ran: the upstream here never finishes its answer."""
    secret = tokens.new_secret()
    served = GatewayThread(Gateway(upstream, "k", secret, DEFAULT_PRICES, campaigns=["camp"])).__enter__()
    conn, resp = _post(served.url, _token(secret))
    assert resp.read1(65536) == SSE[0]
    t0 = time.monotonic()
    served.__exit__(None, None, None)  # raises nothing
    assert time.monotonic() - t0 < 15
    conn.close()
    _Upstream.go.set()


def test_the_gateway_holds_the_key_over_tls_only():
    from runner.errors import UserError
    from runner.gateway.server import check_upstream

    check_upstream("https://api.anthropic.com")
    check_upstream("http://127.0.0.1:8080")
    with pytest.raises(UserError, match="https only"):
        check_upstream("http://llm.internal.example")


def test_tokens_are_bound_to_their_attempt():
    secret = tokens.new_secret()
    t = _token(secret)
    claims = tokens.verify(secret, t, time.time())
    assert claims.attempt_key == ("camp", "P-1", "s-001", 1)
    body = t.split(".")[1]
    forged = json.loads(tokens._unb64(body)) | {"session": "s-002"}
    swapped = ".".join([tokens.PREFIX, tokens._b64(json.dumps(forged).encode()), t.split(".")[2]])
    with pytest.raises(tokens.TokenError, match="forged"):
        tokens.verify(secret, swapped, time.time())
    assert _token(secret) != t  # a nonce: two tokens of one attempt differ



def test_the_gateway_says_whether_the_provider_accepts_its_key_and_the_canary_reads_it(caplog):
    """Issue 29: "a bad provider key is found only by spending a run ... the gateway checks its
    own key with a call that spends nothing (a token count), in doctor --cluster and as a helm
    test route". GET /probe-runner/key asks the provider a token count with the gateway's key
    (no token needed: it forwards nothing of the asker's), at most once per KEY_CHECK_SECONDS;
    the canary's route reads it, and a refusal is in the gateway's log at warning."""
    from runner.demo.provider import ScriptedProvider
    from runner.entrypoints import canary as entry

    with ScriptedProvider({"scenarios": [{"name": "x", "match": "x", "turns": [{"text": "x"}]}]}, api_key="the-right-key") as provider:
        for key, accepted in (("the-right-key", True), ("a-wrong-key", False)):
            with GatewayThread(Gateway(provider.base_url, key, tokens.new_secret(), DEFAULT_PRICES)) as served:
                target = served.url.removeprefix("http://")
                for _ in range(3):
                    opened, detail = entry._http_key(target)
                    assert opened is accepted, detail
                if accepted:
                    assert detail == "accepted (a token count, nothing spent)"
                else:
                    assert detail == f"the provider refused the key (HTTP 401 from {provider.base_url}): invalid x-api-key"
                    assert canary.key_refused([canary.Result(canary.KEY_ROUTE, target, True, opened, detail)])
        counts = [r for r in provider.requests if r["path"].startswith("/v1/messages/count_tokens")]
        assert [r["credential"] for r in counts] == ["key", "other"]  # once per gateway, three asks each
    assert any(r.levelname == "WARNING" and "the provider answered the key check with 401" in r.getMessage()
               for r in caplog.records)
    # A gateway pod being replaced vouches for no key (it may hold the one a rollout replaces): 503,
    # and the canary asks again until a pod that stays answers.
    with ScriptedProvider({"scenarios": [{"name": "x", "match": "x", "turns": [{"text": "x"}]}]}, api_key="the-right-key") as provider:
        gateway = Gateway(provider.base_url, "the-right-key", tokens.new_secret(), DEFAULT_PRICES)
        with GatewayThread(gateway) as served:
            target = served.url.removeprefix("http://")
            gateway.stopping = True
            assert entry._http_key(target, patience=0) == (
                False, "not accepted: HTTP/1.1 503 Service Unavailable: this gateway pod is stopping: ask again")
            threading.Timer(1.0, lambda: setattr(gateway, "stopping", False)).start()
            started = time.monotonic()
            assert entry._http_key(target) == (True, "accepted (a token count, nothing spent)")
            assert 0.9 < time.monotonic() - started < 10
    # A provider not reached is a route's failure, not the key's: 502, and not read as a refused key.
    with GatewayThread(Gateway("http://127.0.0.1:9", "k", tokens.new_secret(), DEFAULT_PRICES)) as served:
        target = served.url.removeprefix("http://")
        opened, detail = entry._http_key(target)
        assert not opened and detail.startswith("not accepted: HTTP/1.1 502 Bad Gateway: the provider at "), detail
        assert not canary.key_refused([canary.Result(canary.KEY_ROUTE, target, True, opened, detail)])
