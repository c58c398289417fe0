"""A hostile session against the provider gateway (issue 28, items 1 and 2): its own token,
crafted requests, dropped connections and cut streams.

"A session is code we do not trust": each test here is what such a session does with the token
and base URL it finds in its environment, against runner.gateway.server over real sockets, with
a small upstream on loopback standing in for the provider and recording what reached it. The
last test plays the same routes from a session's Bash through the real CLI and the local
executor, and holds the campaign's books within its budget.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from decimal import Decimal
from http.server import ThreadingHTTPServer

import pytest
from wire import RecordingUpstream  # tests/ is on the path (tests/conftest.py)

from runner.budget import books, realized_cost
from runner.demo import CORPUS, PLAN
from runner.gateway import tokens
from runner.gateway.server import Gateway, GatewayThread, Meter
from runner.harnesses import HARNESS
from runner.ledger import Ledger
from runner.settings import DEFAULT_PRICES, GatewaySettings
from runner.store.file import FileStore
from runner.stream import money
from tests.support.clis import qualified_versions
from tests.support.waiting import until


@pytest.fixture(scope="module", params=qualified_versions())
def claude_command(request, qualified_cli):
    """This module's suite runs on every qualified CLI version, the pinned one first."""
    return qualified_cli(request.param)


MODEL = "claude-sonnet-4-5"
SENT = HARNESS.qualified[HARNESS.version].models[MODEL].betas  # what the pinned CLI sends with it
OUT = 50_000  # what the upstream's answers state as output: $0.75 at Sonnet's $15 per million


class _Provider(RecordingUpstream):
    """Answers by what the request's first message says: ``slow-json`` (a JSON answer after a
    second), ``slow-sse`` (message_start, a second, a megabyte of text, then the rest), ``cut-sse`` (message_start,
    then the connection closes), anything else an event stream at once. Every answer states
    OUT output tokens."""

    seen: list[dict] = []

    def do_POST(self) -> None:
        mode = json.loads(self.recorded_body())["messages"][0]["content"]
        start = {"type": "message_start", "message": {"id": "m", "model": MODEL, "usage": {"input_tokens": 10, "output_tokens": 1}}}
        delta = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": OUT}}
        if mode == "slow-json":
            time.sleep(1)
            self.answer_json(200, json.dumps({"id": "m", "type": "message", "model": MODEL, "content": [],
                                              "usage": {"input_tokens": 10, "output_tokens": OUT}}).encode())
            return
        self.start_events()
        self.chunk(b"event: message_start\ndata: " + json.dumps(start).encode() + b"\n\n")
        if mode == "cut-sse":
            self.connection.shutdown(socket.SHUT_RDWR)  # the provider's answer ends without its last events
            return
        if mode == "slow-sse":  # then a megabyte of text, which a client gone cannot take
            time.sleep(1)
            text = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x" * 65536}}
            for _ in range(16):
                self.chunk(b"event: content_block_delta\ndata: " + json.dumps(text).encode() + b"\n\n")
        self.chunk(b"event: message_delta\ndata: " + json.dumps(delta).encode() + b"\n\n"
                    + b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
        self.wfile.write(b"0\r\n\r\n")


@pytest.fixture
def gateway():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Provider)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Provider.seen.clear()
    secret = tokens.new_secret()
    settings = GatewaySettings.model_validate({"max_tokens": 64000})  # an operator's bound (by default Sonnet 4.5's 32000)
    g = Gateway(f"http://127.0.0.1:{server.server_address[1]}", "the-key", secret, DEFAULT_PRICES, campaigns=["camp"],
                policy=settings)
    with GatewayThread(g) as served:
        yield g, secret, served.url
    server.shutdown()


def _token(secret: bytes, limit: str | None = "1", call: str = "2", session: str = "s-001") -> str:
    return tokens.mint(secret, tokens.Claims("camp", "P-1", session, 1, int(time.time() + 600), limit, call, MODEL))


def _body(mode: str = "fast", **over: object) -> bytes:
    return json.dumps({"model": MODEL, "max_tokens": 64000, "stream": mode != "slow-json",
                       "messages": [{"role": "user", "content": mode}]} | over).encode()


def _post(url: str, token: str, body: bytes, path: str = "/v1/messages?beta=true", headers: dict | None = None):
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=20)
    conn.request("POST", path, body=body, headers={"content-type": "application/json", "x-api-key": token,
                                                  "anthropic-beta": ",".join(sorted(SENT)), **(headers or {})})
    return conn, conn.getresponse()


def _settled(g: Gateway, session: str = "s-001") -> dict:
    """The attempt's meter once no call of it is in flight."""
    until(lambda: (m := g.meters.get(("camp", "P-1", session, 1))) is not None and m.in_flight == 0, 15,
          "no call of the session in flight")
    return g.meter(("camp", "P-1", session, 1))


@pytest.mark.parametrize("case, body, extra, reason", [
    ("a server tool fetches any URL", _body(tools=[{"type": "web_fetch_20250910", "name": "web_fetch"}]), {},
     "the tool type 'web_fetch_20250910' is not a client-side tool"),
    ("a server search", _body(tools=[{"type": "web_search_20250305", "name": "web_search"}]), {},
     "the tool type 'web_search_20250305' is not a client-side tool"),
    ("an MCP server at any URL", _body(mcp_servers=[{"type": "url", "url": "http://169.254.169.254/", "name": "x"}]), {},
     "the request holds 'mcp_servers'"),
    ("a container", _body(container="c-1"), {}, "the request holds 'container'"),
    ("a document the provider fetches", _body(messages=[{"role": "user", "content": [
        {"type": "document", "source": {"type": "url", "url": "http://10.0.0.1/secret"}}]}]), {},
     "a content source of type 'url' would have the provider fetch or read it"),
    ("a file of the key's organisation", _body(messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "file", "file_id": "file_1"}}]}]), {},
     "a content source of type 'file'"),
    ("another model", _body(model="claude-opus-4-1"), {}, "the model 'claude-opus-4-1' is not the campaign's"),
    ("a huge max_tokens", _body(max_tokens=1_000_000), {},
     "max_tokens 1000000 is over the most claude-sonnet-4-5's qualified CLI asks for (64000; gateway.max_tokens)"),
    ("the 1M-token context beta", _body(), {"anthropic-beta": "context-1m-2025-08-07"},
     "the beta 'context-1m-2025-08-07' is refused: the 1M-token context window"),
    ("a speed premium among the CLI's own betas", _body(), {"anthropic-beta": "claude-code-20250219,fast-mode-2026-02-01"},
     "the beta 'fast-mode-2026-02-01' is refused: speed fast"),
    ("a beta no qualified CLI sends", _body(), {"anthropic-beta": "not-a-beta-2099-01-01"},
     "the beta 'not-a-beta-2099-01-01' is not qualified: no qualified CLI version was seen sending it"),
    ("another query", _body(), {"path": "/v1/messages?beta=true&%62eta=false"}, "is not one the CLI sends"),
    ("a call dearer than one call may be", _body(max_tokens=64000), {"call": "0.50"},
     "over the $0.50 a call may add past the session's limit (budget.call_usd)"),
])
def test_a_crafted_request_is_refused_before_it_reaches_the_provider(gateway, caplog, case, body, extra, reason):
    g, secret, url = gateway
    caplog.set_level(logging.WARNING, logger="runner.gateway.server")
    token = _token(secret, call=str(extra.pop("call", "2")))
    path = str(extra.pop("path", "/v1/messages?beta=true"))
    conn, resp = _post(url, token, body, path=path, headers=extra)
    answer = json.loads(resp.read())
    conn.close()
    assert resp.status == 400 and answer["type"] == "error" and reason in answer["error"]["message"], answer
    assert not _Provider.seen, f"{case}: it reached the provider"
    assert any(reason in r.getMessage() and "camp/P-1/s-001#1" in r.getMessage() for r in caplog.records)
    if "call" in case:
        return  # a token count costs nothing: it has no bound
    conn, resp = _post(url, token, body, path=path.replace("/v1/messages", "/v1/messages/count_tokens"), headers=extra)
    resp.read()  # a token count is held to the same policy
    conn.close()
    assert resp.status == 400 and not _Provider.seen


def test_a_spent_session_is_refused_before_its_body_is_read(gateway):
    """Token, path and limit are checked before the body: a spent session announcing 1 GiB gets its
    403 without sending a byte of it."""
    g, secret, url = gateway
    g.meters[("camp", "P-1", "s-001", 1)] = Meter(usd=Decimal("1"))  # its $1 spent
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  + f"x-api-key: {_token(secret)}\r\ncontent-length: {1 << 30}\r\n\r\n".encode())
        head = s.recv(4096)
    assert head.startswith(b"HTTP/1.1 403"), head


def test_a_body_over_the_bound_is_refused_as_it_is_read(gateway):
    g, secret, url = gateway
    conn, resp = _post(url, _token(secret), _body(pad="x" * (9 << 20)))
    assert resp.status == 413 and "gateway.max_body_bytes" in json.loads(resp.read())["error"]["message"]
    conn.close()
    assert not _Provider.seen


def test_a_call_whose_client_drops_its_connection_is_metered_at_the_provider_s_usage(gateway):
    """A non-streaming call whose session closes the connection once it has sent it was metered at
    $0: the answer passed no byte to the client. Now the gateway reads the answer to its end."""
    g, secret, url = gateway
    host, port = url.removeprefix("http://").split(":")
    body = _body("slow-json")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v1/messages?beta=true HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  + f"anthropic-beta: {','.join(sorted(SENT))}\r\nx-api-key: {_token(secret)}\r\n"
                    f"content-length: {len(body)}\r\n\r\n".encode() + body)
    meter = _settled(g)
    assert meter["calls"] == 1 and meter["usage"]["output_tokens"] == OUT
    assert Decimal(meter["cost_usd"]) == (10 * 3 + OUT * 15) / Decimal(10**6)


def test_a_stream_cut_by_its_client_is_metered_to_its_end(gateway):
    """A session that cuts a stream after message_start was metered at message_start's 1 output
    token, where the provider served OUT."""
    g, secret, url = gateway
    conn, resp = _post(url, _token(secret), _body("slow-sse"))
    assert b"message_start" in resp.read1(65536)
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    meter = _settled(g)
    assert meter["usage"]["output_tokens"] == OUT


def test_an_answer_the_provider_cut_is_metered_at_its_bound(gateway):
    g, secret, url = gateway
    conn, resp = _post(url, _token(secret), _body("cut-sse"))
    try:
        resp.read()
    except http.client.IncompleteRead:
        pass
    conn.close()
    meter = _settled(g)
    body = len(_body("cut-sse"))
    assert Decimal(meter["cost_usd"]) == (body * Decimal("3.75") + 64000 * 15) / Decimal(10**6)


def test_ten_dropped_calls_do_not_pass_a_one_dollar_limit(gateway):
    """Each call costs $0.75 and may cost up to its bound; the session drops every connection at
    once. Before, ten such calls went through metered at $0. Now the calls after the limit is
    spent are refused, and what was spent is at most the limit plus one call's bound."""
    g, secret, url = gateway
    host, port = url.removeprefix("http://").split(":")
    body = _body("slow-json", max_tokens=50000)
    token = _token(secret, limit="1", call="2")
    codes = []
    for _ in range(10):
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                      + f"x-api-key: {token}\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body)
            s.settimeout(0.2)
            try:
                codes.append(s.recv(12))
            except TimeoutError:
                codes.append(b"dropped")
        _settled(g)
    spent = Decimal(g.meter(("camp", "P-1", "s-001", 1))["cost_usd"])
    bound = (len(body) * Decimal("3.75") + 50000 * 15) / Decimal(10**6)
    assert spent <= 1 + bound
    assert len(_Provider.seen) == 2 and codes.count(b"HTTP/1.1 403") == 8, codes


# --- through the real CLI: a session's Bash calls the gateway with its own token ----------------

def _hostile_bash() -> str:
    def curl(body: dict, extra: str = "") -> str:
        return (f"curl -s -o /dev/null -w '%{{http_code}} ' \"$ANTHROPIC_BASE_URL/v1/messages\" -H \"x-api-key: $ANTHROPIC_API_KEY\" "
                f"-H 'content-type: application/json' {extra} -d '{json.dumps(body)}'")
    base = {"model": MODEL, "max_tokens": 10, "tools": [{"name": "t", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": "HOSTILE side"}]}
    routes = [
        curl(base | {"tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]}),
        curl(base | {"mcp_servers": [{"type": "url", "url": "http://169.254.169.254/", "name": "m"}]}),
        curl(base | {"model": "claude-opus-4-1"}),
        curl(base | {"max_tokens": 10_000_000}),
        curl(base, "-H 'anthropic-beta: context-1m-2025-08-07'"),
        # a body past gateway.max_body_bytes (9 MB of it), and its own token altered (one character more)
        "head -c 9000000 /dev/zero | tr '\\0' x > /tmp/big && " + curl(base).replace(f"-d '{json.dumps(base)}'", "--data-binary @/tmp/big"),
        curl(base).replace('"x-api-key: $ANTHROPIC_API_KEY"', '"x-api-key: ${ANTHROPIC_API_KEY}A"'),
        curl(base | {"stream": True}, "--max-time 0.3"),  # cut: curl gives up on the stream
    ]
    return "echo hostile: $(" + "; ".join(routes) + ")"


def test_a_hostile_session_through_the_real_cli_stays_within_the_budget(tmp_path, scripted_provider, claude_command):
    """Through the local executor and the real CLI: the session's Bash tries server tools, an MCP
    server, another model, a huge max_tokens, the 1M beta and a 9 MB body with its own token, and
    its token altered (each refused, the reason in the gateway's log), and a stream it cuts
    (metered at the provider's usage). The campaign's books stay within its $10 budget and match
    the gateway's meter."""
    scenarios = {"scenarios": [
        {"name": "hostile", "match": "status of decision HW-DR-0052", "model": MODEL,
         "usage": {"input_tokens": 1200, "output_tokens": 80},
         "turns": [{"tool_uses": [{"name": "Bash", "input": {"command": _hostile_bash()}}]},
                   {"text": "HW-DR-0052 current."}]},
        {"name": "side", "match": "HOSTILE side", "model": MODEL, "usage": {"input_tokens": 100, "output_tokens": 10},
         "turns": [{"text": "side"}]}]}
    provider = scripted_provider(scenarios, api_key="sk-ant-test-hostile")
    plan = json.loads(PLAN.read_text())
    plan.update(probes=plan["probes"][:1], arms=["present"], repetitions=1)
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    env = {**os.environ, "RUNNER_STORE": (tmp_path / "store").as_uri(), "RUNNER_LOCAL__WORKDIR": str(tmp_path / "work"),
           "RUNNER_HARNESS__COMMAND": claude_command[0], "RUNNER_PROVIDER__API_KEY": "sk-ant-test-hostile",
           "RUNNER_PROVIDER__BASE_URL": provider.base_url, "RUNNER_BUDGET__SESSION_USD": "1",
           "RUNNER_BUDGET__CAMPAIGN_USD": "10"}
    done = subprocess.run([sys.executable, "-m", "runner", "-v", "run", str(tmp_path / "plan.json"), "--corpus", str(CORPUS)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr + done.stdout
    store = FileStore(tmp_path / "store")
    (state,) = Ledger(store, "demo").sessions().values()
    raw = store.get(state.detail["stream"]["key"]).decode()
    assert "hostile: 400 400 400 400 400 413 401 " in raw, raw[-2000:]
    for reason in ("the tool type 'web_fetch_20250910' is not a client-side tool", "the request holds 'mcp_servers'",
                   "the model 'claude-opus-4-1' is not the campaign's",
                   "max_tokens 10000000 is over the most claude-sonnet-4-5's qualified CLI asks for (32000; "
                   "gateway.max_tokens)",
                   "the beta 'context-1m-2025-08-07' is refused", "the body is over gateway.max_body_bytes",
                   "token refused: forged"):
        assert reason in done.stderr, reason
    bodies = [r.get("body") or {} for r in provider.requests if r["path"].startswith("/v1/messages")]
    assert not [b for b in bodies if isinstance(b, dict) and (b.get("mcp_servers") or b.get("model") != MODEL)]
    meter = json.loads(store.get(f"campaigns/demo/sessions/{state.key}/capture.json"))["gateway"]
    assert meter["refused"] == 6 and meter["calls"] == 3  # two CLI calls and the cut stream, read to its end
    assert Decimal(meter["cost_usd"]) == 2 * (1200 * 3 + 80 * 15) / Decimal(10**6) + (100 * 3 + 10 * 15) / Decimal(10**6)
    stream_cost = money(Decimal(str(json.loads(raw.splitlines()[-1])["total_cost_usd"])))  # as the books read it
    assert books(Ledger(store, "demo")).spent == realized_cost(stream_cost, meter) <= 10


@pytest.mark.parametrize("mangle", [
    lambda mac: mac + "=",  # padding the decoder would drop
    lambda mac: mac[:10] + "!" + mac[10:],  # a character outside the alphabet, which a lenient decoder skips
    lambda mac: mac[:-1] + chr(ord(mac[-1]) ^ 1) if mac[-1] not in "AQgw" else mac[:-1] + "B",  # other trailing bits
])
def test_a_token_s_mac_is_decoded_strictly(gateway, mangle):
    """One MAC, one string: a lenient base64 decoder reads many strings as the same MAC (issue 28, item 4)."""
    g, secret, url = gateway
    head, body, mac = _token(secret).split(".")
    conn, resp = _post(url, ".".join([head, body, mangle(mac)]), _body())
    answer = json.loads(resp.read())
    conn.close()
    assert resp.status == 401 and "token refused" in answer["error"]["message"]
    assert not _Provider.seen


def test_the_canary_finds_the_provider_side_routes_refused_by_the_gateway(gateway, monkeypatch):
    """Issue 28: "the canary tries the provider-side routes too". The canary's check asks the
    gateway, with a token of its own limited to $0, for a server tool and an MCP server at the
    metadata service's URL (a token count: never metered): closed where the gateway refuses
    them by its policy, nothing forwarded; open where something passed them on (here the
    upstream itself, as a gateway without the policy would), or where it holds no token."""
    from runner.entrypoints import canary as entry

    g, secret, url = gateway
    target = url.removeprefix("http://")
    monkeypatch.setenv("PROBE_TOKEN", tokens.mint(secret, tokens.Claims("camp", "canary", "check-1", 1,
                                                                       int(time.time() + 60), "0", "0")))
    assert entry._gateway_policy(target, "gateway-server-tool") == (
        False, "refused by the gateway: the tool type 'web_fetch_20250910' is not a client-side tool: the provider would run it")
    assert entry._gateway_policy(target, "gateway-mcp") == (
        False, "refused by the gateway: the request holds 'mcp_servers', which the CLI does not send")
    assert not _Provider.seen
    opened, detail = entry._gateway_policy(g.upstream.removeprefix("http://"), "gateway-server-tool")
    assert opened and detail.startswith("answered HTTP/1.") and " 200 " in detail, detail
    monkeypatch.delenv("PROBE_TOKEN")
    assert entry._gateway_policy(target, "gateway-mcp") == (True, "no token to ask the gateway with")
