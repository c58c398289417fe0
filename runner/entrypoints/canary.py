"""The canary pod's entry point (``python3 -m runner.entrypoints.canary``): wait until the
pod's policy is in force, try every route runner/k8s/canary.py built, report. The standard
library only, as everything that runs in a pod; ``wait_until_confined`` also holds the
session's harness back (runner/entrypoints/pod.py)."""

from __future__ import annotations

import base64
import errno
import json
import os
import socket
import ssl
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from urllib.parse import urlsplit

from runner.gateway.tokens import KEY_PATH, KEY_REFUSED, STOPPING  # the standard library alone: this runs before a session's CLI
from runner.k8s.canary import CONNECT_TIMEOUT, SETTLE_SECONDS, TERMINATION_LOG, Result, Route, judge


def _pod_facts() -> dict[str, str]:
    dns = ""
    try:
        for line in Path("/etc/resolv.conf").read_text().splitlines():
            if line.startswith("nameserver"):
                dns = line.split()[1]
                break
    except OSError:
        pass
    api = f"{os.environ.get('KUBERNETES_SERVICE_HOST', '')}:{os.environ.get('KUBERNETES_SERVICE_PORT', '443')}"
    return {"dns": f"{dns}:53" if dns else "", "api": api if not api.startswith(":") else "",
            "node": os.environ.get("HOST_IP", ""), "gateway": os.environ.get("PROBE_GATEWAY", "")}


def _split(target: str) -> tuple[str, int]:
    host, _, port = target.rpartition(":")
    return host.strip("[]"), int(port)


def _closed_errno(e: OSError) -> str | None:
    """The errors that mean no connection was made (a policy drop or reject, no route)."""
    if isinstance(e, (socket.timeout, TimeoutError)):
        return "timed out"
    names = {errno.EHOSTUNREACH: "host unreachable", errno.ENETUNREACH: "network unreachable",
             errno.EACCES: "not permitted", errno.EPERM: "not permitted",
             # the pod has no address of that family (IPv6 in an IPv4-only pod): nothing left it
             errno.EADDRNOTAVAIL: "no address of that family", errno.EAFNOSUPPORT: "no address of that family"}
    return names.get(e.errno or 0)


def _failed(e: OSError, refused: str) -> tuple[bool, str]:
    """(opened, detail) of a try that raised: closed for a refusal (``refused`` names it as the
    protocol shows it) or a closed errno; any other error is not proof of a closed route."""
    if isinstance(e, ConnectionRefusedError):
        return False, refused
    why = _closed_errno(e)
    return (False, why) if why else (True, f"error {e}")


def _tcp(target: str) -> tuple[bool, str]:
    try:
        with socket.create_connection(_split(target), timeout=CONNECT_TIMEOUT):
            return True, "connected"
    except OSError as e:
        return _failed(e, "refused")


def _dns(target: str) -> tuple[bool, str]:
    query = (b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
             b"\x0akubernetes\x07default\x03svc\x07cluster\x05local\x00\x00\x01\x00\x01")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(CONNECT_TIMEOUT)
        try:
            s.connect(_split(target))
            s.send(query)
            s.recv(512)
            return True, "answered"
        except OSError as e:
            return _failed(e, "port unreachable")


def _http(target: str) -> tuple[bool, str]:
    """An HTTP answer to ``HEAD /`` (the gateway's reachability check; no token: nothing is forwarded)."""
    try:
        with socket.create_connection(_split(target), timeout=CONNECT_TIMEOUT) as s:
            s.sendall(f"HEAD / HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n".encode())
            line = s.recv(4096).split(b"\r\n", 1)[0].decode(errors="replace")
    except OSError as e:
        return _failed(e, "refused")
    return (True, f"answered {line}") if line.startswith("HTTP/") else (False, f"no HTTP answer: {line!r}")


def _ask(target: str, request: bytes, timeout: float) -> tuple[str, bytes]:
    """Send one HTTP/1.1 request (Connection: close) and read its answer, at most 8 KiB: its
    status line and the bytes. OSError where no answer came."""
    with socket.create_connection(_split(target), timeout=timeout) as s:
        s.sendall(request)
        answer = b""
        while len(answer) < 8192 and (chunk := s.recv(4096)):
            answer += chunk
    return answer.split(b"\r\n", 1)[0].decode(errors="replace"), answer


KEY_PATIENCE = 20.0  # seconds a key check asks again while a stopping gateway pod answers it


def _gateway_said(answer: bytes) -> str:
    """The gateway's own words in an error answer (its message after ``probe-runner gateway: ``)."""
    try:
        message = json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["message"]
    except (IndexError, ValueError, KeyError, TypeError):  # not the gateway's JSON: as far as it reads
        return answer.split(b"probe-runner gateway: ", 1)[-1].split(b'"', 1)[0].decode(errors="replace")
    return str(message).removeprefix("probe-runner gateway: ")


def _http_key(target: str, patience: float = KEY_PATIENCE) -> tuple[bool, str]:
    """Whether the provider accepts the gateway's key: its answer to GET KEY_PATH (a token
    count it asks with the key, nothing spent), 200 or the provider's refusal in its words.
    A gateway pod being replaced (a rollout, after the key's fix) vouches for no key: asked
    again, for up to ``patience`` seconds, until the Service sends the question to one that
    stays."""
    deadline = time.monotonic() + patience
    while True:
        try:  # a longer wait than a connection's: the gateway asks the provider first
            line, answer = _ask(target, f"GET {KEY_PATH} HTTP/1.1\r\nHost: {target}\r\nConnection: close\r\n\r\n"
                                .encode(), CONNECT_TIMEOUT * 4)
        except OSError as e:
            return _failed(e, "refused")
        if not (line.startswith("HTTP/1.1 503 ") and STOPPING in _gateway_said(answer)) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if line.startswith("HTTP/1.1 200 "):
        return True, "accepted (a token count, nothing spent)"
    if line.startswith("HTTP/1.1 403 "):
        said = _gateway_said(answer)  # the gateway's words begin with KEY_REFUSED
        return False, said if said.startswith(KEY_REFUSED) else f"{KEY_REFUSED}: {said}"
    return False, f"not accepted: {line}: {_gateway_said(answer)}"


# What the canary asks the gateway for with its token (a token count: never metered, held to the
# same request policy as a call): the provider acting for it, which the gateway must refuse.
PROVIDER_SIDE = {
    "gateway-server-tool": {"tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]},
    "gateway-mcp": {"mcp_servers": [{"type": "url", "url": "http://169.254.169.254/", "name": "m"}]},
}


def _gateway_policy(target: str, kind: str) -> tuple[bool, str]:
    """Closed where the gateway refuses the request by its policy (400, its own error); open where
    anything else answers (it was passed on), and where the canary holds no token to ask with."""
    token = os.environ.get("PROBE_TOKEN", "")
    if not token:
        return True, "no token to ask the gateway with"
    body = json.dumps({"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": "canary"}],
                       **PROVIDER_SIDE[kind]}).encode()
    request = (f"POST /v1/messages/count_tokens?beta=true HTTP/1.1\r\nHost: {target}\r\nx-api-key: {token}\r\n"
               f"content-type: application/json\r\nanthropic-version: 2023-06-01\r\nContent-Length: {len(body)}\r\n"
               f"Connection: close\r\n\r\n").encode() + body
    try:
        line, answer = _ask(target, request, CONNECT_TIMEOUT)
    except OSError as e:
        return _failed(e, "refused")
    if line.startswith("HTTP/1.1 400 ") and b"probe-runner gateway:" in answer:
        return False, f"refused by the gateway: {_gateway_said(answer)}"
    return True, f"answered {line}"


def _proxy() -> tuple[str, int]:
    p = urlsplit(os.environ.get("HTTPS_PROXY", ""))
    return p.hostname or "", p.port or 3128


def _connect_via_proxy(target: str) -> tuple[socket.socket | None, str]:
    host, port = _proxy()
    if not host:
        return None, "no egress proxy configured"
    sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT)
    sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head and len(head) < 8192:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    status = head.split(b"\r\n", 1)[0].decode(errors="replace")
    if " 200" not in status[:13]:
        sock.close()
        return None, f"the proxy refused: {status or 'connection closed'}"
    return sock, status


def _proxy_tls(target: str, server_name: str, ca_file: str | None) -> tuple[bool, str]:
    try:
        sock, why = _connect_via_proxy(target)
    except OSError as e:
        return False, f"no tunnel: {_closed_errno(e) or e}"
    if sock is None:
        return False, why
    ctx = ssl.create_default_context()
    if ca_file and Path(ca_file).is_file():
        ctx.load_verify_locations(ca_file)
    try:
        with ctx.wrap_socket(sock, server_hostname=server_name) as tls:
            tls.sendall(f"HEAD / HTTP/1.1\r\nHost: {server_name}\r\nConnection: close\r\n\r\n".encode())
            line = tls.recv(4096).split(b"\r\n", 1)[0].decode(errors="replace")
            if line.startswith("HTTP/"):
                return True, f"TLS to {server_name} verified, answered {line}"
            return False, f"TLS to {server_name} verified, no HTTP answer"
    except ssl.SSLError as e:
        return False, f"TLS to {server_name} failed: {e.reason or e}"
    except OSError as e:
        return False, f"tunnel closed: {_closed_errno(e) or e}"
    finally:
        sock.close()


def _proxy_http(url: str) -> tuple[bool, str]:
    host, port = _proxy()
    if not host:
        return False, "no egress proxy configured"
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT) as s:
            u = urlsplit(url)
            s.sendall(f"GET {url} HTTP/1.1\r\nHost: {u.netloc}\r\nConnection: close\r\n\r\n".encode())
            line = s.recv(4096).split(b"\r\n", 1)[0].decode(errors="replace")
    except OSError as e:
        return False, f"no answer: {_closed_errno(e) or e}"
    if " 403 " in line or " 407 " in line:
        return False, f"the proxy refused: {line}"
    return True, f"forwarded: {line or 'connection closed'}"


def try_route(route: Route, facts: dict[str, str], ca_file: str | None) -> Result:
    target = route.target.format(**facts)
    if not target or target.startswith(":"):
        return Result(route.name, route.target, route.must_open, False, "not tried: the pod has no such address")
    started = time.monotonic()
    if route.kind == "tcp":
        opened, detail = _tcp(target)
    elif route.kind == "dns":
        opened, detail = _dns(target)
    elif route.kind == "http":
        opened, detail = _http(target)
    elif route.kind == "http-key":
        opened, detail = _http_key(target)
    elif route.kind == "proxy-tls":
        opened, detail = _proxy_tls(target, route.server_name or target, ca_file)
    elif route.kind == "proxy-http":
        opened, detail = _proxy_http(target)
    elif route.kind in PROVIDER_SIDE:
        opened, detail = _gateway_policy(target, route.kind)
    else:
        raise ValueError(f"unknown route kind {route.kind}")
    # The report must fit a termination message (4096 bytes) with a dozen routes.
    return Result(route.name, target, route.must_open, opened, f"{detail[:120]} ({time.monotonic() - started:.1f} s)")


def wait_until_confined(limit: float, probe_timeout: float = 0.5) -> float | None:
    """Seconds until the API server's ClusterIP (which always listens) stops accepting this
    pod's connections, or None if it still does after ``limit`` seconds (or the pod has no
    such address to try)."""
    target = _pod_facts()["api"]
    if not target:
        return None
    started = time.monotonic()
    while True:
        try:
            with socket.create_connection(_split(target), timeout=probe_timeout):
                pass
        except OSError:
            return time.monotonic() - started
        if time.monotonic() - started > limit:
            return None
        time.sleep(0.2)


def main(argv: list[str]) -> int:
    """``python3 -m runner.entrypoints.canary [--judge] ROUTES_JSON_BASE64 [CA_FILE]``: wait until
    the pod's policy is in force (at most SETTLE_SECONDS), try every route, write the report to
    the termination log and stdout; exit 0 (the controller judges). ``--judge`` (``helm test``,
    where no controller reads the report): print a line per route and exit 1 unless the policy
    settled and every route was as it must be, by the controller's own rule."""
    judging = argv[:1] == ["--judge"]
    argv = argv[1:] if judging else argv
    rs = [Route(**r) for r in json.loads(base64.b64decode(argv[0]))]
    ca_file = argv[1] if len(argv) > 1 else None
    settled = wait_until_confined(SETTLE_SECONDS)
    facts = _pod_facts()
    with ThreadPoolExecutor(max_workers=len(rs) or 1) as pool:
        results = list(pool.map(lambda r: try_route(r, facts, ca_file), rs))
    report = json.dumps({"settled_seconds": None if settled is None else round(settled, 2),
                         "results": [asdict(r) for r in results]}, separators=(",", ":"))
    try:
        Path(TERMINATION_LOG).write_text(report)
    except OSError:
        pass
    print(report, flush=True)
    if not judging:
        return 0
    for r in results:
        print(f"{'OPEN  ' if r.opened else 'closed'} {r.name} ({r.target}): {r.detail}", flush=True)
    problem = judge(results) or (None if settled is not None else
                                 f"the pod's network policy was not in force after {SETTLE_SECONDS:g} s")
    print(f"confinement check: {problem or 'passed'}", flush=True)
    return 1 if problem else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
