"""The egress proxy's configuration in the real Squid: what it lets through and what it refuses.

Squid (Debian's squid-openssl, see .ci/setup) is started on loopback by the entry point the
image uses, with the generated squid.conf; only the listen address, the ports, the state
directory, a hosts file (``provider.test`` is 127.0.0.1) and a loopback name server (so no
lookup can leave the machine) are test-specific. The "provider" is a local TLS server with a self-signed certificate for
provider.test that counts the connections it accepts, so every refusal is also checked for
never having reached it. Squid runs as nobody when the tests run as root, as in the pod.
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
from ports import free_port
from wire import read_head

from runner.k8s.egress import squid_conf, squid_entrypoint
from tests.support.waiting import until

PROVIDER = "provider.test"
NOBODY = 65534
# Time Squid gets to show a connection it should not make; every refusal is answered well before.
SETTLE_SECONDS = 0.2


class Upstream:
    """A TLS server on 127.0.0.1 answering ``upstream:<first bytes it got>``."""

    def __init__(self, cert: Path, key: Path):
        self.cert = cert
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(cert, key)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        try:
            with self.ctx.wrap_socket(conn, server_side=True) as tls:
                tls.sendall(b"upstream:" + tls.recv(100))
        except (OSError, ssl.SSLError):
            conn.close()

    def untouched_since(self, before: int) -> bool:
        time.sleep(SETTLE_SECONDS)
        return self.accepted == before


def _openssl_cert(dir: Path, cn: str) -> tuple[Path, Path]:
    cert, key = dir / "up.crt", dir / "up.key"
    subprocess.run(["openssl", "req", "-x509", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "1", "-subj", f"/CN={cn}", "-addext", f"subjectAltName=DNS:{cn}",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


@pytest.fixture(scope="module")
def upstream(tmp_path_factory) -> Upstream:
    up = Upstream(*_openssl_cert(tmp_path_factory.mktemp("upstream"), PROVIDER))
    yield up
    up.sock.close()


@pytest.fixture(scope="module")
def proxy(upstream):
    """(port, Squid's throwaway certificate) of a running Squid tunnelling to the upstream only."""
    squid = shutil.which("squid", path="/usr/sbin:/usr/bin:/sbin:/bin")
    if not squid or "--with-openssl" not in subprocess.run([squid, "-v"], capture_output=True, text=True).stdout:
        pytest.fail("squid built with OpenSSL is needed (Debian: apt-get install squid-openssl; .ci/setup does it)",
                    pytrace=False)
    root = Path(tempfile.mkdtemp(prefix="egress-proxy-"))  # under /tmp, so nobody can traverse to it
    port = free_port()
    state = root / "state"
    conf = root / "squid.conf"
    (root / "hosts").write_text(f"127.0.0.1 {PROVIDER}\n")
    conf.write_text(squid_conf(PROVIDER, upstream.port, port, listen_address="127.0.0.1", state_dir=str(state),
                               max_client_connections=MAX_CLIENT_CONNECTIONS)
                    + f"hosts_file {root}/hosts\ndns_nameservers 127.0.0.1\n")
    (root / "entrypoint.sh").write_text(squid_entrypoint(str(conf), str(state)))
    out, err = open(root / "stdout", "wb"), open(root / "stderr", "wb")
    as_nobody = {}
    if os.geteuid() == 0:
        for path in [root, *root.iterdir()]:
            os.chown(path, NOBODY, NOBODY)
        as_nobody = dict(user=NOBODY, group=NOBODY, extra_groups=[])
    proc = subprocess.Popen(["sh", str(root / "entrypoint.sh")], stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}, **as_nobody)
    try:
        deadline = time.monotonic() + 15
        while True:
            if proc.poll() is not None:
                pytest.fail(f"squid exited {proc.returncode}: {(root / 'stderr').read_text()[-2000:]}", pytrace=False)
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"squid did not listen: {(root / 'stderr').read_text()[-2000:]}", pytrace=False)
                time.sleep(0.05)
        ACCESS_LOG.append(root / "stdout")
        yield port, state / "tls.crt"
    finally:
        proc.kill()
        proc.wait()
        out.close()
        err.close()
        shutil.rmtree(root, ignore_errors=True)


MAX_CLIENT_CONNECTIONS = 4  # small, so a test can open one more
ACCESS_LOG: list[Path] = []  # Squid's standard output, where its access log goes


def _send(port: int, request: bytes) -> tuple[socket.socket, bytes]:
    """Send ``request``; return the socket and the response head (through the blank line)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(request)
    return sock, read_head(sock)


def _connect(port: int, target: str) -> tuple[socket.socket, bytes]:
    return _send(port, f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())


def _client_hello(sni: str) -> bytes:
    """The bytes of a real TLS ClientHello naming ``sni``."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname=sni)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def _refusal(port: int, proxy_cert: Path, target: str) -> bytes:
    """What a refused CONNECT on Squid's ssl-bump port answers: 200, then Squid's own TLS
    (its throwaway certificate, never the upstream's), then the error response inside it."""
    sock, head = _connect(port, target)
    assert head.startswith(b"HTTP/1.1 200 "), head
    ctx = ssl.create_default_context(cafile=str(proxy_cert))
    ctx.check_hostname = False
    with ctx.wrap_socket(sock, server_hostname=PROVIDER) as tls:
        assert tls.getpeercert()["subject"] == ((("commonName", "egress-proxy"),),)
        tls.sendall(f"GET / HTTP/1.1\r\nHost: {PROVIDER}\r\n\r\n".encode())
        return tls.recv(4096)


def test_connect_to_provider_with_its_sni_reaches_it_end_to_end(proxy, upstream):
    port, _ = proxy
    before = upstream.accepted
    sock, head = _connect(port, f"{PROVIDER}:{upstream.port}")
    assert head == b"HTTP/1.1 200 Connection established\r\n\r\n"
    ctx = ssl.create_default_context(cafile=str(upstream.cert))
    with ctx.wrap_socket(sock, server_hostname=PROVIDER) as tls:
        tls.sendall(b"ping")
        assert tls.recv(100) == b"upstream:ping"
    assert upstream.accepted == before + 1


def test_connect_to_provider_with_other_sni_is_terminated(proxy, upstream):
    port, _ = proxy
    # Control: the same raw exchange with the provider's name gets the upstream's ServerHello.
    sock, head = _connect(port, f"{PROVIDER}:{upstream.port}")
    assert head.startswith(b"HTTP/1.1 200 ")
    sock.sendall(_client_hello(PROVIDER))
    assert sock.recv(5)[:1] == b"\x16"  # a TLS handshake record from upstream
    sock.close()

    before = upstream.accepted
    sock, head = _connect(port, f"{PROVIDER}:{upstream.port}")
    assert head.startswith(b"HTTP/1.1 200 ")
    sock.sendall(_client_hello("other.test"))
    assert _read_all(sock) == b""
    assert upstream.untouched_since(before)


@pytest.mark.parametrize("target", [
    "other.test:{port}",
    "sub.provider.test:{port}",     # dstdomain without a leading dot: that host, no subdomain
    "127.0.0.1:{port}",             # the provider's address, whose reverse name is provider.test: -n
    "provider.test:{other_port}",   # the provider host on another port
])
def test_connect_elsewhere_is_refused(proxy, upstream, target):
    port, proxy_cert = proxy
    before = upstream.accepted
    answer = _refusal(port, proxy_cert, target.format(port=upstream.port, other_port=upstream.port + 1))
    assert answer.startswith(b"HTTP/1.1 403 Forbidden\r\n")
    assert b"\r\nX-Squid-Error: ERR_ACCESS_DENIED" in answer
    assert upstream.untouched_since(before)


def test_plain_http_is_refused(proxy, upstream):
    port, _ = proxy
    before = upstream.accepted
    sock, head = _send(port, f"GET http://{PROVIDER}:{upstream.port}/ HTTP/1.1\r\nHost: {PROVIDER}\r\n\r\n".encode())
    sock.close()
    assert head.startswith(b"HTTP/1.1 403 Forbidden\r\n")
    assert upstream.untouched_since(before)


def test_allowed_connect_carries_tls_only(proxy, upstream):
    port, _ = proxy
    before = upstream.accepted
    sock, head = _connect(port, f"{PROVIDER}:{upstream.port}")
    assert head.startswith(b"HTTP/1.1 200 ")
    sock.sendall(f"GET / HTTP/1.1\r\nHost: {PROVIDER}\r\n\r\n".encode())
    assert _read_all(sock) == b""
    assert upstream.untouched_since(before)


def test_one_client_cannot_hold_more_than_its_share_of_connections(proxy, upstream):
    """Before, one session pod could open connections until the proxy's file descriptors ran
    out, and every other session's CONNECT failed."""
    port, proxy_cert = proxy
    held = []
    for _ in range(MAX_CLIENT_CONNECTIONS):
        sock, head = _connect(port, f"{PROVIDER}:{upstream.port}")
        assert head.startswith(b"HTTP/1.1 200 "), head
        held.append(sock)
    before = upstream.accepted
    answer = _refusal(port, proxy_cert, f"{PROVIDER}:{upstream.port}")  # one more: refused
    assert answer.startswith(b"HTTP/1.1 403 Forbidden\r\n") and upstream.untouched_since(before)
    for s in held:
        s.close()
    deadline = time.monotonic() + 10  # Squid counts a connection until it has seen it close
    while True:
        sock, head = _connect(port, f"{PROVIDER}:{upstream.port}")
        ctx = ssl.create_default_context(cafile=str(upstream.cert))
        try:
            with ctx.wrap_socket(sock, server_hostname=PROVIDER) as tls:
                tls.sendall(b"ping")
                assert tls.recv(100) == b"upstream:ping"
                break
        except ssl.SSLError:
            assert time.monotonic() < deadline, "the connections given back were never counted as closed"
            time.sleep(0.2)


def test_each_tunnel_is_logged_with_the_server_name_it_asked_for(proxy, upstream):
    port, _ = proxy
    sock, head = _connect(port, f"{PROVIDER}:{upstream.port}")
    ctx = ssl.create_default_context(cafile=str(upstream.cert))
    with ctx.wrap_socket(sock, server_hostname=PROVIDER) as tls:
        tls.sendall(b"ping")
        assert tls.recv(100) == b"upstream:ping"
    until(lambda: any(f"CONNECT {PROVIDER}:{upstream.port} sni={PROVIDER} " in line  # written when the tunnel closes
                      for line in ACCESS_LOG[0].read_text().splitlines()),
          10, "the tunnel's access log line", interval=0.1, seen=lambda: ACCESS_LOG[0].read_text()[-2000:])
