"""The exec connections' TLS context (runner/k8s/api.py): websocket-client builds one per
connection from ssl options, loading the CA bundle each time, about a sixth of the controller's
CPU at 1,000 sessions at once (py-spy; bench/README.md, scale.py). It is built once, and
verifies as the options did: the server's certificate against the CA, its name checked."""

from __future__ import annotations

import base64
import hashlib
import re
import socket
import ssl
import threading
import time
from pathlib import Path

import certifi
import pytest
from kubernetes import client

from runner.k8s import api
from runner.k8s.api import _open_websocket, _tls_context
from tests.support.certs import self_signed


def test_the_exec_tls_context_is_built_once_and_verifies_the_api_server():
    _tls_context.cache_clear()
    first = _tls_context(certifi.where(), True, None, None)
    assert _tls_context(certifi.where(), True, None, None) is first
    assert _tls_context.cache_info().misses == 1
    assert (first.verify_mode, first.check_hostname) == (ssl.CERT_REQUIRED, True)
    assert first.get_ca_certs(), "the CA bundle was not loaded"
    unverified = _tls_context(None, True, None, None)  # verify_ssl false: as cert_reqs CERT_NONE did
    assert (unverified.verify_mode, unverified.check_hostname) == (ssl.CERT_NONE, False)
    no_name = _tls_context(certifi.where(), False, None, None)  # assert_hostname false
    assert (no_name.verify_mode, no_name.check_hostname) == (ssl.CERT_REQUIRED, False)


# ---- TLS session resumption --------------------------------------------------------------

def _cert(dir: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA) and its key, as files."""
    cert, key = self_signed(name)
    (dir / f"{name}.pem").write_bytes(cert)
    (dir / f"{name}.key").write_bytes(key)
    return dir / f"{name}.pem", dir / f"{name}.key"


class _UpgradeServer:
    """A TLS server answering every WebSocket upgrade with 101, as the API server answers an
    exec's; it records whether each connection resumed a session. Servers built on one
    ``context`` share its session-ticket keys, as replicas behind one name may."""

    def __init__(self, context: ssl.SSLContext, port: int = 0):
        self.context = context
        self.listener = socket.create_server(("127.0.0.1", port))
        self.port = self.listener.getsockname()[1]
        self.resumed: list[bool] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return
            try:
                with self.context.wrap_socket(raw, server_side=True) as conn:
                    self.resumed.append(conn.session_reused)
                    request = b""
                    while b"\r\n\r\n" not in request:
                        request += conn.recv(4096)
                    key = re.search(rb"(?i)sec-websocket-key: *(\S+)", request).group(1)  # type: ignore[union-attr]
                    accept = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
                    conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                                 b"Sec-WebSocket-Accept: " + accept + b"\r\nSec-WebSocket-Protocol: v4.channel.k8s.io\r\n\r\n")
            except (OSError, ssl.SSLError):
                self.resumed.append(False)  # a refused handshake: recorded, so a test waits on it

    def close(self) -> None:
        try:
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept, which holds the port till then
        except OSError:
            pass
        self.listener.close()


def _server_context(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    return ctx


def _connect(ca: Path, port: int) -> None:
    """One exec connection as Kube.exec opens it, closed as its end closes it."""
    configuration = client.Configuration()
    configuration.ssl_ca_cert = str(ca)
    _open_websocket(configuration, f"wss://127.0.0.1:{port}/api/v1/namespaces/ns/pods/p/exec", {}, 5.0).close()


def _wait_for(server: _UpgradeServer, n: int) -> list[bool]:
    deadline = time.monotonic() + 5
    while len(server.resumed) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    return server.resumed


def test_exec_connections_resume_the_tls_session_of_the_last_one_to_the_same_server(tmp_path):
    """Every exec is a new connection: resumed, neither side pays a full handshake again
    (bench/exec_cost.py). Without resumption every connection here is a full handshake."""
    _tls_context.cache_clear()
    ca, key = _cert(tmp_path, "api")
    server = _UpgradeServer(_server_context(ca, key))
    try:
        for _ in range(4):
            _connect(ca, server.port)
        assert _wait_for(server, 4) == [False, True, True, True]
    finally:
        server.close()


def test_a_session_is_offered_only_to_the_address_it_came_from(tmp_path):
    """Two servers sharing ticket keys (as replicas may): the first connection to the second
    is a full handshake, so no session travels from one address to another."""
    _tls_context.cache_clear()
    ca, key = _cert(tmp_path, "api")
    shared = _server_context(ca, key)
    one, two = _UpgradeServer(shared), _UpgradeServer(shared)
    try:
        _connect(ca, one.port)
        _connect(ca, one.port)
        _connect(ca, two.port)
        assert (_wait_for(one, 2), _wait_for(two, 1)) == ([False, True], [False])
    finally:
        one.close()
        two.close()


def test_a_held_session_does_not_stand_in_for_the_certificate(tmp_path):
    """A server that takes the real one's address with a certificate the CA did not sign
    cannot resume the real one's session (it lacks its ticket keys): the handshake is a full
    one and its certificate is refused, as without resumption."""
    _tls_context.cache_clear()
    ca, key = _cert(tmp_path, "api")
    real = _UpgradeServer(_server_context(ca, key))
    _connect(ca, real.port)
    _connect(ca, real.port)
    assert _wait_for(real, 2) == [False, True]
    port = real.port
    real.close()
    impostor_cert, impostor_key = _cert(tmp_path, "impostor")
    impostor = _UpgradeServer(_server_context(impostor_cert, impostor_key), port)
    try:
        with pytest.raises(ssl.SSLCertVerificationError):
            _connect(ca, port)
        assert _wait_for(impostor, 1) == [False]
    finally:
        impostor.close()


def test_a_held_session_is_replaced_by_a_newer_one_after_the_refresh_time(tmp_path, monkeypatch):
    """While fresh, the held session serves every connection (reading a connection's own
    copies it); past SESSION_REFRESH_SECONDS the next connection's replaces it, so a ticket
    the server will stop taking is not offered for ever."""
    _tls_context.cache_clear()
    ca, key = _cert(tmp_path, "api")
    server = _UpgradeServer(_server_context(ca, key))
    held = _tls_context(str(ca), True, None, None)._sessions
    try:
        _connect(ca, server.port)
        [first] = held.values()
        _connect(ca, server.port)
        assert next(iter(held.values())) is first, "a fresh session was replaced"
        monkeypatch.setattr(api, "SESSION_REFRESH_SECONDS", 0.0)
        _connect(ca, server.port)
        [newer] = held.values()
        assert newer is not first and newer.has_ticket
        assert _wait_for(server, 3) == [False, True, True]
    finally:
        server.close()
