"""Fixtures every test tier shares."""

from __future__ import annotations

import socket

import pytest
from moto.server import ThreadedMotoServer


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def moto_endpoint():
    """moto in server mode on loopback: S3 over real HTTP, through boto3's own code path."""
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()
