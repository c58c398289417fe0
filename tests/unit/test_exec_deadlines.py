"""Every exec has a connect, a per-frame and a total deadline, and no lock serialises unrelated
execs: an API server (or a relay in front of one) that accepts the connection and never
answers costs each exec its connect limit, in parallel, and nothing else. Before, the connect
had no timeout at all and ran under one process-wide lock: the first such exec hung forever
and every other session's exec queued behind it."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from kubernetes import client
from wire import read_head  # tests/ is on the path (tests/conftest.py)

from runner.k8s.api import ExecError, Kube
from runner.settings import KubeSettings


@pytest.fixture
def silent_server():
    """Accepts every connection and never sends a byte (TLS never starts)."""
    srv = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(srv.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield srv.getsockname()[1]
    srv.close()
    for c in held:
        c.close()


def test_execs_to_a_server_that_never_answers_each_end_at_the_connect_limit_in_parallel(silent_server):
    cfg = client.Configuration()
    cfg.host, cfg.verify_ssl = f"https://127.0.0.1:{silent_server}", False
    kube = Kube(KubeSettings(namespace="ns", exec_connect_timeout_seconds=1.5), api_client=client.ApiClient(cfg))
    errors: list[tuple[float, str]] = []
    started = time.monotonic()

    def one() -> None:
        try:
            kube.exec("pod", "reader", ["true"], timeout=60)
        except ExecError as e:
            errors.append((time.monotonic() - started, str(e)))

    threads = [threading.Thread(target=one, daemon=True) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert not any(t.is_alive() for t in threads), "an exec hung past its connect limit"
    assert len(errors) == 4
    # all four in about one connect limit: none waited behind another's stalled connect
    assert max(at for at, _ in errors) < 1.5 * 2
    assert all("exec reader in pod: no connection after 1." in why and "timed out" in why for _, why in errors), errors


def test_every_request_names_the_runner_exec_included(tmp_path):
    """The API server's audit log tells clients apart by user agent: the REST client and the
    exec handshake both send probe-runner/VERSION (the library's own default named only itself)."""
    import runner
    from runner.k8s.api import load_api_client

    srv = socket.create_server(("127.0.0.1", 0))
    got: list[bytes] = []

    def answer_once() -> None:
        conn, _ = srv.accept()
        with conn:
            got.append(read_head(conn))
            conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: k, cluster: {{server: 'http://127.0.0.1:{srv.getsockname()[1]}'}}}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n")
    settings = KubeSettings(namespace="ns", kubeconfig=kubeconfig, api_attempts=1)
    api = load_api_client(settings)
    agent = f"probe-runner/{runner.__version__}"
    assert api.user_agent == agent
    kube = Kube(settings, api_client=api)
    t = threading.Thread(target=answer_once, daemon=True)
    t.start()
    with pytest.raises(client.ApiException) as refused:
        kube.exec("pod", "reader", ["true"], timeout=10)
    t.join(5)
    srv.close()
    assert refused.value.status == 403
    (request,) = got
    assert request.startswith(b"GET /api/v1/namespaces/ns/pods/pod/exec?")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.decode().partition(":") for line in request.split(b"\r\n")[1:])}
    assert headers["user-agent"] == agent, request
