"""The session pod's entry points (runner/entrypoints/pod.py) as real processes, without a cluster."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from runner.entrypoints import pod
from tests.support.waiting import until

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
            s.sendall(pod.HELLO + b'{"type":"system"}\n')
        until((capture / "record.json").exists, 10, "the reader's record")
        record = json.loads((capture / "record.json").read_text())
        assert record["bytes"] == 18 and record["eof"] is True
        assert (capture / "stream.jsonl").read_bytes() == b'{"type":"system"}\n'
        assert not (sock_dir / "stdout.sock").exists()  # accepted once, then the path is gone
    finally:
        reader.kill()
        reader.wait()


PEER_READER = """
import sys
from pathlib import Path
from runner.entrypoints import pod
pod._HELLO_SECONDS = 1.0
pod.reader(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
"""
AS_UID = "import os, socket, sys; os.setgid(int(sys.argv[2])); os.setuid(int(sys.argv[2])); " \
         "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(bytes.fromhex(sys.argv[3])); s.close()"


def test_the_reader_takes_the_stream_only_from_the_harness_uid_by_the_credentials_of_its_first_byte():
    """Who connected is told by the credentials the kernel attaches to the connecting process's
    first byte (SCM_CREDENTIALS), not by SO_PEERCRED, which gVisor answers with the asking
    process's own: a peer of another uid is refused, and so is one that sends no HELLO first
    (its credentials never come), before the harness's connection is taken."""
    assert os.geteuid() == 0, "connecting as other uids needs root (this tier runs as root)"
    top = Path(tempfile.mkdtemp(prefix="peer-"))  # pytest's tmp_path is closed to other uids
    top.chmod(0o755)
    capture, sock_dir = top / "capture", top / "socket"
    capture.mkdir()
    sock_dir.mkdir()
    sock_dir.chmod(0o777)
    (capture / "delivered").touch()
    path = sock_dir / "stdout.sock"
    reader = subprocess.Popen([sys.executable, "-c", PEER_READER, str(capture), str(sock_dir), "10001"],
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        until(path.exists, 10, "the reader's socket")
        for uid, first in ((10002, pod.HELLO + b"forged"), (10001, b"{no hello}")):  # another uid; no HELLO first
            subprocess.run([sys.executable, "-c", AS_UID, str(path), str(uid), first.hex()], check=True, timeout=10)
        with pod._connect(path, 10) as s:  # as root: not the harness uid
            s.sendall(pod.HELLO + b"root")
        subprocess.run([sys.executable, "-c", AS_UID, str(path), "10001", (pod.HELLO + b'{"type":"system"}').hex()],
                       check=True, timeout=10)
        until((capture / "record.json").exists, 20, "the reader's record")
        record = json.loads((capture / "record.json").read_text())
        assert (record["peer_uid"], record["refused_peers"]) == (10001, [10002, -1, 0])
        assert (capture / "stream.jsonl").read_bytes() == b'{"type":"system"}'  # the HELLO is not the stream's
    finally:
        reader.kill()
        reader.wait()
        shutil.rmtree(top, ignore_errors=True)


def _deliver(capture: Path, workspace: Path, files: dict[str, bytes]) -> subprocess.CompletedProcess[bytes]:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    env = {"PATH": os.environ["PATH"], "PROBE_CAPTURE_DIR": str(capture), "PROBE_WORKSPACE": str(workspace)}
    return subprocess.run(pod.deliver_argv(), input=buf.getvalue() + b"\0" * 1024 * 1024, env=env, capture_output=True,
                          timeout=30, check=False)


def test_a_second_delivery_of_the_workspace_changes_nothing(tmp_path):
    """The controller retries an exec whose exit status was lost; the first run may have
    unpacked the workspace and let the session start, so a second must not unpack over it
    (it did: the session's own edit of task.md was overwritten with the sealed copy)."""
    capture, workspace = tmp_path / "capture", tmp_path / "workspace"
    capture.mkdir()
    workspace.mkdir()
    assert _deliver(capture, workspace, {"task.md": b"sealed\n"}).returncode == 0
    assert (capture / "delivered").exists() and (workspace / "task.md").read_bytes() == b"sealed\n"
    (workspace / "task.md").write_bytes(b"edited by the session\n")
    again = _deliver(capture, workspace, {"task.md": b"sealed\n", "new.md": b"x"})
    assert again.returncode == 0, again.stderr  # the tar on stdin is read to its end, not refused
    assert (workspace / "task.md").read_bytes() == b"edited by the session\n" and not (workspace / "new.md").exists()


def test_the_reader_gives_up_on_its_own_when_no_controller_comes(tmp_path):
    """A pod whose controller is gone (its Job deleted or out of retries) must not wait forever
    with the credentials mounted: the reader ends at its deadline, whatever it waits for (here
    the workspace that never comes), and with it the pod."""
    capture, sock_dir = tmp_path / "capture", tmp_path / "socket"
    capture.mkdir()
    sock_dir.mkdir()
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "PROBE_CAPTURE_DIR": str(capture),
           "PROBE_SOCKET_DIR": str(sock_dir), "PROBE_DEADLINE_SECONDS": "2"}
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "runner.entrypoints.pod", "reader"], env=env, capture_output=True,
                         text=True, timeout=30, check=False)
    assert out.returncode == pod.GAVE_UP_EXIT and 1.5 < time.monotonic() - started < 15
    assert "no controller finished with this pod within 2 s; giving up" in out.stderr


HARNESS_UID, READER_UID = 10001, 10002  # the chart's defaults; the pod's fsGroup is the harness's gid


def _as(uid: int, *argv: str, groups: str = "") -> subprocess.CompletedProcess[str]:
    ids = ["--reuid", str(uid), "--regid", str(uid), *(["--groups", groups] if groups else ["--clear-groups"])]
    return subprocess.run(["setpriv", *ids, *argv], capture_output=True, text=True, timeout=60, check=False,
                          env={"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO)})


def test_the_reader_can_pack_every_file_the_session_left_whatever_its_mode():
    """The reader (its own uid, with the pod's fsGroup) packs the workspace after the session:
    its tar failed on any 0600 file or 0700 directory the session made (mktemp makes both), the
    session counted as failed and its files were lost. The harness entry point now opens what
    the session left to the group once no session process is left."""
    if os.geteuid() != 0:  # .ci/run runs as root; a run that cannot play two uids proves nothing here
        import pytest
        pytest.fail("this test plays the harness's and the reader's uids with setpriv: run the tests as root "
                    "(as .ci/run does)", pytrace=False)
    import shutil
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="workspace-", dir="/tmp"))  # pytest's tmp_path is closed to other uids
    top.chmod(0o755)
    ws = top / "workspace"
    ws.mkdir()
    os.chown(ws, HARNESS_UID, HARNESS_UID)
    try:
        _pack_as_the_reader(ws)
    finally:
        shutil.rmtree(top)


def _pack_as_the_reader(ws: Path) -> None:
    made = _as(HARNESS_UID, "sh", "-c", f'cd {ws} && d=$(mktemp -d -p .) && echo secret > "$d/notes" && chmod 600 "$d/notes" '
                                        '&& umask 077 && echo x > top.md && ln -s /etc/shadow link && echo "$d"')
    assert made.returncode == 0, made.stderr
    reader_tar = ["tar", "-c", "-f", "/dev/null", "-C", str(ws), "."]
    before = _as(READER_UID, *reader_tar, groups=str(HARNESS_UID))
    assert before.returncode != 0 and "Permission denied" in before.stderr  # what the reader met before
    opened = _as(HARNESS_UID, sys.executable, "-c", f"from runner.entrypoints.pod import _open_to_group; "
                                                    f"from pathlib import Path; _open_to_group(Path({str(ws)!r}))")
    assert opened.returncode == 0, opened.stderr
    after = _as(READER_UID, "sh", "-c", f'tar -c -f - -C {ws} . | tar -t -f -', groups=str(HARNESS_UID))
    assert after.returncode == 0 and not after.stderr, after.stderr
    tmpdir = made.stdout.strip().removeprefix("./")
    assert {f"./{tmpdir}/notes", "./top.md", "./link"} <= set(after.stdout.split())
    assert os.readlink(ws / "link") == "/etc/shadow"  # a link stays a link: nothing was followed


def test_the_harness_wrapper_refuses_credentials_it_cannot_place():
    """The pod's builder says where the harness reads a credentials file
    (PROBE_CREDENTIALS_TARGET, from the harness seam); a pod without it (built by another version)
    would lose the login silently, so the wrapper refuses before anything runs."""
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "PROBE_SOCKET_DIR": "/nonexistent",
           "PROBE_CREDENTIALS_FILE": "/run/probe/secret/credentials.json"}
    out = subprocess.run([sys.executable, "-m", "runner.entrypoints.pod", "harness", "--", "true"], env=env,
                         capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 2
    assert "PROBE_CREDENTIALS_FILE without PROBE_CREDENTIALS_TARGET" in out.stderr
