"""The session pod's entry points (runner/entrypoints/pod.py) as real processes, without a cluster."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

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
    first = _deliver(capture, workspace, {"task.md": b"sealed\n"})
    assert (first.returncode, first.stdout) == (0, b"delivered\n")
    assert (capture / "delivered").exists() and (workspace / "task.md").read_bytes() == b"sealed\n"
    (workspace / "task.md").write_bytes(b"edited by the session\n")
    again = _deliver(capture, workspace, {"task.md": b"sealed\n", "new.md": b"x"})
    # the tar on stdin is read to its end, not refused; the controller stamps no delivery of it
    assert (again.returncode, again.stdout) == (0, b"already\n"), again.stderr
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


# ---- the end of a session in one exec (runner/entrypoints/pod.py finish_argv) ---------------

def _finish(capture: Path, workspace: Path, offset: int, chunk: int, limit: int, wait: float = 0.0) -> subprocess.CompletedProcess[bytes]:
    env = {"PATH": os.environ["PATH"], "PROBE_CAPTURE_DIR": str(capture), "PROBE_WORKSPACE": str(workspace)}
    return subprocess.run(pod.finish_argv(offset, chunk, limit, wait), env=env, capture_output=True, timeout=60, check=False)


def _ended_session(tmp_path: Path, stream: bytes) -> tuple[Path, Path, dict]:
    """A capture volume as the reader leaves it at the stream's end, and a workspace with two files."""
    capture, workspace = tmp_path / "capture", tmp_path / "workspace"
    capture.mkdir()
    (workspace / "sub").mkdir(parents=True)
    (workspace / "task.md").write_bytes(b"the task\n")
    (workspace / "sub" / "out.txt").write_bytes(b"written by the session\n")
    (capture / pod.STREAM_NAME).write_bytes(stream)
    record = {"bytes": len(stream), "sha256": "sha256:" + hashlib.sha256(stream).hexdigest(), "eof": True}
    (capture / pod.RECORD_NAME).write_text(json.dumps(record))
    return capture, workspace, record


def _members(tar_bytes: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_one_exec_ends_a_session_with_its_record_stream_and_packed_files(tmp_path):
    """What took four execs at a session's end (the record, the stream, the packing, the
    packed files) comes in one when it fits in a chunk: framed, verified by the controller
    against the record's and the packing's sha256."""
    stream = b'{"type":"system"}\n{"type":"result"}\n'
    capture, workspace, record = _ended_session(tmp_path, stream)
    done = _finish(capture, workspace, 0, 1 << 20, 1 << 30)
    assert done.returncode == 0, done.stderr
    got = pod.read_finish(done.stdout)
    assert got is not None
    assert (got.record, got.offset, got.stream) == (record, 0, stream)
    packed = (capture / pod.PACKED_NAME).read_bytes()
    assert got.packed == pod.Packed(len(packed), hashlib.sha256(packed).hexdigest(), "0", packed)  # all of it came
    assert _members(got.packed.head) == {"./task.md": b"the task\n", "./sub/out.txt": b"written by the session\n"}


def test_the_finishing_exec_sends_at_most_a_chunk_and_the_rest_is_fetched_by_offset(tmp_path):
    stream = b"x" * 10_000
    capture, workspace, _ = _ended_session(tmp_path, stream)
    got = pod.read_finish(_finish(capture, workspace, 3000, 4096, 1 << 30).stdout)
    assert got is not None
    assert (got.offset, got.stream, got.packed.head) == (3000, stream[3000:7096], b"")  # the chunk is the stream's
    assert got.packed.size == (capture / pod.PACKED_NAME).stat().st_size > 0
    got = pod.read_finish(_finish(capture, workspace, 9000, 4096, 1 << 30).stdout)
    assert got is not None and (got.offset, got.stream) == (9000, stream[9000:])
    assert got.packed.head == (capture / pod.PACKED_NAME).read_bytes()[:4096 - 1000]  # the chunk's rest
    # A spool longer than the stream (a follow of another attempt's stream): from the start.
    got = pod.read_finish(_finish(capture, workspace, 20_000, 1 << 20, 1 << 30).stdout)
    assert got is not None and (got.offset, got.stream) == (0, stream)


def test_the_finishing_exec_sends_none_of_a_workspace_past_the_limit(tmp_path):
    capture, workspace, _ = _ended_session(tmp_path, b"{}\n")
    got = pod.read_finish(_finish(capture, workspace, 0, 1 << 20, 100).stdout)
    assert got is not None and got.packed.size == 101 and got.packed.head == b""  # limit + 1: past it, not fetched


def test_the_finishing_exec_waits_for_the_record_and_says_when_there_is_none(tmp_path):
    """The reader writes its record at the stream's end, which may trail the harness
    container's end by milliseconds: the exec waits for it in the pod, at most as told."""
    capture, workspace, record = _ended_session(tmp_path, b"{}\n")
    (capture / pod.RECORD_NAME).unlink()
    t0 = time.monotonic()
    none = _finish(capture, workspace, 0, 1 << 20, 1 << 30, wait=0.3)
    assert (none.returncode, pod.read_finish(none.stdout)) == (0, None)
    assert 0.3 <= time.monotonic() - t0 < 5 and not (capture / pod.PACKED_NAME).exists()  # nothing packed
    env = {"PATH": os.environ["PATH"], "PROBE_CAPTURE_DIR": str(capture), "PROBE_WORKSPACE": str(workspace)}
    waiting = subprocess.Popen(pod.finish_argv(0, 1 << 20, 1 << 30, 20), env=env, stdout=subprocess.PIPE)
    time.sleep(0.3)
    (capture / pod.RECORD_NAME).write_text(json.dumps(record))
    out, _ = waiting.communicate(timeout=20)
    got = pod.read_finish(out)
    assert got is not None and got.record == record


def test_a_finishing_exec_cut_short_is_refused_not_misread():
    good = b'2\n{}0 ' + b"a" * 64 + b' 0\n0 3\nabc1\nX'
    assert pod.read_finish(good) == pod.Finish({}, 0, b"abc", pod.Packed(0, "a" * 64, "0", b"X"))
    for cut in (good[:-1], good[:9], good + b"more"):
        with pytest.raises(ValueError):
            pod.read_finish(cut)
