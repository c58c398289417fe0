"""What a hostile session's Bash runs against the provider gateway with the token and base URL
it finds in its environment (issue 28, item 6), as a script of the corpus the session copies
from its workspace: python3 is what the harness image has (no curl). Each route prints one
line, ``<route> <HTTP status>`` (or what the socket said), for the test to read from the
stream's tool results.

    python3 tools/hostile.py [--scan PORT]

``--scan``: find the gateway's pods by their own addresses (every address of this pod's /24
that takes a connection on PORT; the session's network policy lets it reach them) and call
each in turn, as a session that spreads its calls over the replicas would."""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import socket
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

MODEL = "claude-sonnet-4-5"
SIDE = "HOSTILE side"
BASE = {"model": MODEL, "max_tokens": 10, "tools": [{"name": "t", "input_schema": {"type": "object"}}],
        "messages": [{"role": "user", "content": SIDE}]}


def call(route: str, body: dict, url: str, token: str, headers: dict | None = None) -> None:
    req = urllib.request.Request(url.rstrip("/") + "/v1/messages", data=json.dumps(body).encode(), method="POST",
                                 headers={"x-api-key": token, "content-type": "application/json",
                                          "anthropic-version": "2023-06-01", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            resp.read()
            status = resp.status
    except urllib.error.HTTPError as e:
        e.read()
        status = e.code
    except OSError as e:
        print(route, type(e).__name__, flush=True)
        return
    print(route, status, flush=True)


def cut_stream(url: str, token: str) -> None:
    """A streamed call whose connection is dropped after the first bytes of the answer."""
    u = urllib.parse.urlsplit(url)
    body = json.dumps(BASE | {"stream": True}).encode()
    with socket.create_connection((u.hostname, u.port or 80), timeout=30) as s:
        s.sendall(f"POST /v1/messages HTTP/1.1\r\nhost: {u.netloc}\r\nx-api-key: {token}\r\n"
                  f"content-type: application/json\r\nanthropic-version: 2023-06-01\r\n"
                  f"content-length: {len(body)}\r\n\r\n".encode() + body)
        head = s.recv(64)
    print("cut-stream", head.split(b" ")[1].decode() if head.startswith(b"HTTP/1.1 ") else "no-answer", flush=True)


def scan(url: str, port: int) -> list[str]:
    """Addresses of this pod's /24 that take a TCP connection on ``port``."""
    u = urllib.parse.urlsplit(url)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((u.hostname, u.port or 80))  # no packet: the route's source address
        own = s.getsockname()[0]

    def opens(ip: str) -> bool:
        try:
            socket.create_connection((ip, port), timeout=1).close()
            return True
        except OSError:
            return False
    hosts = [str(h) for h in ipaddress.ip_network(f"{own}/24", strict=False).hosts() if str(h) != own]
    with ThreadPoolExecutor(64) as pool:
        return [ip for ip, ok in zip(hosts, pool.map(opens, hosts), strict=True) if ok]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scan", type=int)
    args = ap.parse_args()
    url, token = os.environ["ANTHROPIC_BASE_URL"], os.environ["ANTHROPIC_API_KEY"]
    call("server-tool", BASE | {"tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]}, url, token)
    call("mcp-server", BASE | {"mcp_servers": [{"type": "url", "url": "http://169.254.169.254/", "name": "m"}]}, url, token)
    call("other-model", BASE | {"model": "claude-opus-4-1"}, url, token)
    call("huge-max-tokens", BASE | {"max_tokens": 10_000_000}, url, token)
    call("1m-beta", BASE, url, token, {"anthropic-beta": "context-1m-2025-08-07"})
    call("forged-token", BASE, url, token + "A")
    try:
        cut_stream(url, token)
    except OSError as e:
        print("cut-stream", f"{type(e).__name__}: {e}", flush=True)
    try:
        found = scan(url, args.scan) if args.scan else []
    except OSError as e:
        print("scan", f"{type(e).__name__}: {e}", flush=True)
        found = []
    print("gateway-pods", len(found), flush=True)
    for i, ip in enumerate(found * 2):
        call(f"direct-{i}", BASE, f"http://{ip}:{args.scan}", token)
    call("side-call", BASE, url, token)


if __name__ == "__main__":
    main()
