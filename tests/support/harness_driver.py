"""Run as root, on the host or inside gVisor (``runsc do``), with the repository on PYTHONPATH:

``harness PYTHON``: play the pod around the harness's entry point (runner/entrypoints/pod.py):
listen on the capture socket as the reader does, start ``python3 -m runner.entrypoints.pod
harness -- PYTHON tests/support/attacking_cli.py`` under the harness's uid with no capability
(setpriv), read the stream to its end, and print one JSON object: the entry point's exit code,
its standard error and the stream.

``probe PYTHON dumpable|non-dumpable``: under the harness's uid, install the seccomp filter,
make the process non-dumpable or leave it as exec left it, run ``probe_stream`` against a
socket's end, and print the StreamProbe and its duration (ms) as JSON."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HARNESS_UID = 10001
PROBE = """
import ctypes, json, socket, sys, time
from runner.entrypoints import pod
from runner.executors import seccomp
if sys.argv[1] == "non-dumpable":
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
seccomp.install(seccomp.program())
ours, theirs = socket.socketpair()
started = time.perf_counter()
probe = pod.probe_stream(theirs.fileno())
print(json.dumps({"probe": probe._asdict(), "ms": (time.perf_counter() - started) * 1000, "yama": pod.yama_scope()}))
"""


def _as_harness(*argv: str) -> list[str]:
    return ["setpriv", "--reuid", str(HARNESS_UID), "--regid", str(HARNESS_UID), "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", *argv]


def harness(python: str) -> dict[str, object]:
    top = Path(tempfile.mkdtemp(prefix="harness-", dir="/tmp"))
    try:
        top.chmod(0o755)
        sock_dir, workspace = top / "socket", top / "workspace"
        for d in (sock_dir, workspace):
            d.mkdir()
            os.chown(d, HARNESS_UID, HARNESS_UID)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(sock_dir / "stdout.sock"))
        (sock_dir / "stdout.sock").chmod(0o666)
        server.listen(1)
        server.settimeout(120)
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "PROBE_SOCKET_DIR": str(sock_dir),
               "PROBE_TIMEOUT_SECONDS": "300"}
        entry = subprocess.Popen(_as_harness(python, "-m", "runner.entrypoints.pod", "harness", "--",
                                             python, str(REPO / "tests" / "support" / "attacking_cli.py")),
                                 # its stdout and stderr pipes are root's, as a container runtime's are
                                 env=env, cwd=workspace, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        conn, _ = server.accept()
        stream = b""
        with conn:
            conn.settimeout(300)
            while chunk := conn.recv(65536):
                stream += chunk
        _, err = entry.communicate(timeout=120)
        # the entry point's first byte is its HELLO (runner/entrypoints/pod.py: the reader's proof of who
        # connected), then the CLI's stream
        assert stream.startswith(b"\0") or not stream, stream[:40]
        return {"exit": entry.returncode, "stderr": err, "stream": stream.removeprefix(b"\0").decode(errors="replace")}
    finally:
        shutil.rmtree(top, ignore_errors=True)


REPORT = re.compile(r"(?P<route>[a-z0-9-]+) (?P<pid>\d+) (?P<comm>[^:]*): (?P<outcome>.*)")


def reports(stream: str) -> tuple[dict[str, int], list[dict[str, str]]]:
    """The attacking CLI's first line (its pid, its parent's, its dumpability) and every report
    line of channel_attack.py it passed on (route, pid, comm, outcome)."""
    lines = [json.loads(line) for line in stream.splitlines()]
    found = [m.groupdict() for line in lines[1:] if (m := REPORT.fullmatch(line["line"]))]
    assert len(found) == len(lines) - 1, lines  # nothing but report lines: no traceback
    return lines[0], found


def probe(python: str, mode: str) -> dict[str, object]:
    out = subprocess.run(_as_harness(python, "-c", PROBE, mode), capture_output=True, text=True, timeout=60, check=False,
                         env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO)}, cwd="/")
    if out.returncode != 0:
        return {"error": out.stderr}
    return json.loads(out.stdout)


if __name__ == "__main__":
    result = harness(sys.argv[2]) if sys.argv[1] == "harness" else probe(sys.argv[2], sys.argv[3])
    print(json.dumps(result))
