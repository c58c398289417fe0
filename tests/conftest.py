"""Fixtures every test tier shares, and ``tests/`` on the import path for the test-only
modules every tier may use (``fuzz_targets``, ``faults``): they are not part of the product."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
from moto.server import ThreadedMotoServer

sys.path.insert(0, str(Path(__file__).parent))


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
