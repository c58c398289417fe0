"""The session pod's entry points (runner/entrypoints/pod.py) as real processes, without a cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from runner.entrypoints import pod

REPO = Path(__file__).resolve().parents[2]

# Runs the reader with socket.socket.bind wrapped so that the mode of the socket node is
# read the instant bind() returns, before the reader does anything else.
OBSERVED_READER = """
import os, socket, sys
from pathlib import Path
from runner.entrypoints import pod

class Observed(socket.socket):
    def bind(self, address):
        super().bind(address)
        print(oct(os.stat(address).st_mode & 0o777), flush=True)

pod.socket.socket = Observed
os.umask(0o022)
pod.reader(Path(sys.argv[1]), Path(sys.argv[2]), None)
"""


def test_reader_socket_is_connectable_by_another_uid_from_the_moment_it_exists(tmp_path):
    """The harness runs under another uid and connects as soon as the path exists: a socket
    created with the umask's mode and chmod-ed afterwards refused it with EACCES in that
    window (seen once in 400 sessions), and the session never started."""
    capture, sock_dir = tmp_path / "capture", tmp_path / "socket"
    capture.mkdir()
    sock_dir.mkdir()
    (capture / "delivered").touch()
    reader = subprocess.Popen([sys.executable, "-c", OBSERVED_READER, str(capture), str(sock_dir)],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert reader.stdout is not None
        assert reader.stdout.readline().strip() == "0o666"
        # as the harness connects: a refusal between bind and listen is retried, EACCES is not
        with pod._connect(sock_dir / "stdout.sock", 10) as s:
            s.sendall(b'{"type":"system"}\n')
        deadline = time.monotonic() + 10
        while not (capture / "record.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        record = json.loads((capture / "record.json").read_text())
        assert record["bytes"] == 18 and record["eof"] is True
        assert (capture / "stream.jsonl").read_bytes() == b'{"type":"system"}\n'
        assert not (sock_dir / "stdout.sock").exists()  # accepted once, then the path is gone
    finally:
        reader.kill()
        reader.wait()
