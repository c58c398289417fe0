"""Fixtures every test tier shares, and ``tests/`` on the import path for the test-only
modules every tier may use (``fuzz_targets``, ``faults``, ``local_run``, ``ports``): they are not part of the product."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from moto.server import ThreadedMotoServer

sys.path.insert(0, str(Path(__file__).parent))
from ports import free_port  # noqa: E402


@pytest.fixture(scope="module")
def moto_endpoint():
    """moto in server mode on loopback: S3 over real HTTP, through boto3's own code path."""
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()
