"""Entry points inside a session pod: ``reader`` and ``harness`` (``python3 -m runner.entrypoints.pod``).

``reader`` (its own container, its own uid) waits until the controller has delivered the
workspace, then listens on a Unix socket in the volume it shares with the harness, accepts
exactly one connection (from the harness uid, checked with SO_PEERCRED), removes the socket's
path so nothing else can connect, and copies every byte to ``stream.jsonl`` on the volume only
it mounts, with a record of the byte count and sha256 written when the stream ends. It then
stays up so the controller can fetch the stream and the artifacts by exec.

``harness`` connects to that socket, makes it the CLI's standard output, copies the
credentials into the configuration directory, gives the CLI the task on stdin, enforces the
time limit, removes the credentials and exits with the CLI's exit code (124 on the time
limit). When it exits, the runtime ends every process left in the container.

The session runs under the harness's uid, so the socket alone does not keep it off the stream:
it could attach to the CLI (the container runtime's RuntimeDefault seccomp profile allows
ptrace), write the CLI's memory through ``/proc/PID/mem`` or reopen its stream through
``/proc/PID/fd``. So the entry point installs the filter of runner/executors/seccomp.py
(ptrace, pidfd_getfd, process_vm_readv/writev fail with EPERM) on itself before it starts the
CLI, and it refuses to start the CLI (exit 125, nothing spent) unless the CLI's descendants
will be refused its memory and its stream (``unconfined_because``), which holds when either

(a) the CLI's ELF loader is execute-only: under runc, execve() then leaves every process of
    the container non-dumpable, which closes ``/proc/PID/fd`` and ``/proc/PID/mem`` to the
    session. The harness image makes its loader execute-only for that reason; or
(b) Yama's ptrace_scope is 1 or more and a child of this entry point, under the filter and
    its uid, is refused this process's ``/proc/PID/mem`` and the reopening of its stream
    through ``/proc/PID/fd`` (``probe_stream``). gVisor's loader cannot start anything through
    an execute-only loader and leaves every process dumpable, but its kernel applies Yama's
    relational scope to ``/proc/PID/mem``, and the stream, a socket, cannot be reopened
    through ``/proc`` at all (ENXIO). docs/security.md has the measured routes.

Paths come from the environment (the pod manifest sets them), so the same code runs in a
container and on the simulated nodes of the tests.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import re
import select
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple, NotRequired, TypedDict

from runner.clock import now  # the standard library alone, as everything here
from runner.phases import FirstReply

SOCKET_NAME = "stdout.sock"
STREAM_NAME = "stream.jsonl"
RECORD_NAME = "record.json"
DELIVERED_NAME = "delivered"
PACKED_NAME = "workspace.tar"
TIMEOUT_EXIT = 124  # the session hit its time limit and was killed
UNCONFINED_EXIT = 125  # the session could have reached the CLI's memory or stream: refused before the CLI ran
OPEN_NETWORK_EXIT = 126  # the pod's network policy was not in force: refused before the CLI ran
GAVE_UP_EXIT = 3  # the reader's deadline passed: no controller finished with the pod
# Where the kubelet reads a container's termination message (the default terminationMessagePath):
# the harness's entry point leaves its HarnessReport there, which the pod watch delivers.
TERMINATION_LOG = Path("/dev/termination-log")
_STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
_CHUNK = 1 << 16
_CONNECT_WAIT_SECONDS = 3600.0
# How often the reader looks for the delivered workspace and the harness for the reader's
# socket: each wait is on every session's way to its CLI (a stat or a refused connect costs
# microseconds; at 0.1 s the two waits cost 0.1 s on average).
_POLL_SECONDS = 0.02


# The harness's first byte on the stream's socket, before anything of the CLI's: it carries the
# connecting process's credentials (SCM_CREDENTIALS, which the kernel fills in and a process
# without privileges cannot forge), the reader's proof of who connected. Not SO_PEERCRED: gVisor
# answers it with the asking process's own credentials (its netstack.go), so a reader in gVisor
# could tell no peer apart; credentials passed with a message are the sender's in both kernels.
HELLO = b"\0"
_HELLO_SECONDS = 10.0  # how long the reader waits for a connected peer's first byte


def _hello_uid(conn: socket.socket) -> int | None:
    """The uid the connected peer's first byte came with (the listening socket passes
    credentials, SO_PASSCRED), or None where it sent none, or not HELLO, in time."""
    conn.settimeout(_HELLO_SECONDS)
    try:
        data, ancillary, _, _ = conn.recvmsg(1, socket.CMSG_SPACE(struct.calcsize("3i")))
    except (TimeoutError, OSError):
        return None
    finally:
        conn.settimeout(None)
    creds = [struct.unpack("3i", d[:struct.calcsize("3i")]) for level, kind, d in ancillary
             if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS]
    return int(creds[0][1]) if data == HELLO and len(creds) == 1 else None


class ReaderRecord(TypedDict):
    """What the reader records at the stream's end (record.json; the capture record's ``reader``):
    the stream's bytes and digest as they arrived, that the harness closed it, the uid of the peer
    it accepted and those it refused, when it began and ended (the stream's end: the CLI and
    whatever held its output have ended), and when the first byte after the stream's first line
    arrived (runner/phases.py's FirstReply; absent where none did, or from a reader before it)."""

    bytes: int
    sha256: str
    eof: bool
    peer_uid: int
    refused_peers: list[int]
    started_at: str
    ended_at: str
    first_reply_at: NotRequired[str]


class HarnessReport(TypedDict):
    """What the harness's entry point reports of itself as its container ends (its termination
    message, TERMINATION_LOG): when it started the CLI, by its own clock, and how long it waited
    for the pod's network policy before that (seconds, its monotonic clock)."""

    harness_started: str
    policy_wait_seconds: float


def harness_report(message: str | None) -> HarnessReport | None:
    """The entry point's report in a harness container's termination message, or None where
    the message is not one (none written: a refusal, an entry point before it). Read strictly:
    the session runs under the entry point's uid and could have written the file before its
    last process was ended."""
    try:
        report = json.loads(message or "")
    except ValueError:
        return None
    if not isinstance(report, dict) or set(report) != {"harness_started", "policy_wait_seconds"}:
        return None
    started, waited = report["harness_started"], report["policy_wait_seconds"]
    if not isinstance(started, str) or not _STAMP.fullmatch(started) or type(waited) not in (int, float) or not 0 <= waited < 1e6:
        return None
    return {"harness_started": started, "policy_wait_seconds": float(waited)}


def _report(report: HarnessReport, path: Path = TERMINATION_LOG) -> None:
    """Leave ``report`` as the container's termination message, where the kubelet reads one
    (outside a pod there is no such file, and nothing to report to)."""
    if not path.exists():
        return
    try:
        with open(path, "w") as f:
            f.write(json.dumps(report, sort_keys=True))
    except OSError as e:  # a report of timing: its loss is said, the session's end is not changed
        print(f"probe harness: could not write the start report to {path}: {e}", file=sys.stderr)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def reader(capture_dir: Path, socket_dir: Path, harness_uid: int | None) -> None:
    while not (capture_dir / DELIVERED_NAME).exists():
        time.sleep(_POLL_SECONDS)
    path = socket_dir / SOCKET_NAME
    path.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)  # each accepted socket passes its peer's (HELLO)
    # The harness runs under another uid and may connect the moment the path exists, so the
    # socket is made with mode 0666 at bind (a chmod after bind leaves a window in which its
    # connect fails with EACCES); the path is removed on accept.
    umask = os.umask(0o111)
    try:
        server.bind(str(path))
    finally:
        os.umask(umask)
    server.listen(1)
    refused: list[int] = []
    while True:
        conn, _ = server.accept()
        said = _hello_uid(conn)
        if said is not None and (harness_uid is None or said == harness_uid):
            uid = said
            break
        refused.append(-1 if said is None else said)  # -1: no credentials came
        conn.close()
    server.close()
    path.unlink(missing_ok=True)
    started = now()
    sha, size = hashlib.sha256(), 0
    reply, replied = FirstReply(), None
    # Unbuffered: every chunk is in the file as it arrives, for the controller to follow while
    # the session runs (a pod evicted mid-session then loses at most the last poll's worth).
    with conn, open(capture_dir / STREAM_NAME, "wb", buffering=0) as out:
        while chunk := conn.recv(_CHUNK):
            if reply.saw(chunk):
                replied = now()
            view = memoryview(chunk)
            while view:  # an unbuffered write may take part of it
                view = view[out.write(view) or 0:]
            sha.update(chunk)
            size += len(chunk)
        out.flush()
        os.fsync(out.fileno())
    record: ReaderRecord = {"bytes": size, "sha256": "sha256:" + sha.hexdigest(), "eof": True, "peer_uid": uid,
                            "refused_peers": refused, "started_at": started, "ended_at": now()}
    if replied is not None:
        record["first_reply_at"] = replied
    _write_atomic(capture_dir / RECORD_NAME, json.dumps(record, sort_keys=True).encode())
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        signal.pause()


def give_up_after(seconds: int) -> None:
    """End the reader ``seconds`` from now (0: never), whatever it waits for: the workspace, the
    harness, or a controller that will never collect. With the reader gone the pod ends (its
    harness loses its standard output), so a pod whose controller is gone does not run on.
    The kubelet enforces the same bound as the pod's activeDeadlineSeconds; this holds where
    nothing enforces it."""
    if seconds <= 0:
        return

    def expire(*_: object) -> None:
        print(f"probe reader: no controller finished with this pod within {seconds} s; giving up", file=sys.stderr)
        os._exit(GAVE_UP_EXIT)

    signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)


def _connect(path: Path, wait: float) -> socket.socket:
    deadline = time.monotonic() + wait
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(str(path))
            return s
        except (FileNotFoundError, ConnectionRefusedError):
            s.close()
            if time.monotonic() > deadline:
                raise SystemExit(f"probe harness: no capture socket at {path} after {wait:g} s") from None
            time.sleep(_POLL_SECONDS)


def _loader_readable_because(executable: str) -> str | None:
    """Why the CLI's ELF loader is not execute-only here (condition (a) fails), or None."""
    from runner.errors import ConfinementError
    from runner.executors.elf import elf_loader

    found = shutil.which(executable)
    if found is None:
        return f"{executable} is not on PATH"
    try:
        loader = elf_loader(found)
    except ConfinementError as e:
        return str(e)
    return f"its ELF loader {loader} is readable" if os.access(loader, os.R_OK) else None


YAMA_SCOPE = Path("/proc/sys/kernel/yama/ptrace_scope")
MEM_REFUSED = frozenset({"EACCES", "EPERM"})
# A socket cannot be reopened through /proc (ENXIO) whoever asks: the stream's own defence.
STREAM_REFUSED = frozenset({"EACCES", "EPERM", "ENXIO"})
_PR_GET_DUMPABLE = 3
_PROBE_WAIT_SECONDS = 5.0


def yama_scope(path: Path = YAMA_SCOPE) -> int | None:
    """Yama's ptrace_scope (0 classic, 1 relational: only an ancestor may trace or open a
    process's memory, 2 admin-only, 3 none), or None where the kernel has no Yama."""
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


class StreamProbe(NamedTuple):
    """What a child of the entry point met trying the session's two /proc routes against it:
    each an errno name, or "OPEN" where the open succeeded."""

    entry_dumpable: bool  # the entry point itself was dumpable: only then do the refusals show Yama's
    mem: str  # opening the entry point's /proc/PID/mem for reading and writing
    stream: str  # reopening the entry point's stream through /proc/PID/fd/N for writing


def _open_outcome(path: str, flags: int) -> str:
    try:
        os.close(os.open(path, flags))
    except OSError as e:
        return errno.errorcode.get(e.errno or 0, str(e.errno))
    return "OPEN"


def probe_stream(stream_fd: int, wait: float = _PROBE_WAIT_SECONDS) -> StreamProbe:
    """Fork a child (this process's uid, its seccomp filter, no exec: about 2 ms on Linux, 35 in gVisor) that
    tries, as a session would against the CLI, to open this process's memory and to reopen
    ``stream_fd`` through /proc; the child is reaped before this returns."""
    parent = os.getpid()
    dumpable = ctypes.CDLL(None, use_errno=True).prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) == 1
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # two opens and a write, then _exit: no cleanup of the parent runs twice
        try:
            os.close(r)
            os.write(w, " ".join((_open_outcome(f"/proc/{parent}/mem", os.O_RDWR),
                                  _open_outcome(f"/proc/{parent}/fd/{stream_fd}",
                                                os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY))).encode())
        finally:
            os._exit(0)
    os.close(w)
    try:
        said = os.read(r, 256).decode() if select.select([r], [], [], wait)[0] else ""
    finally:
        os.close(r)
        if not said:
            os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    mem, stream = said.split() if said.count(" ") == 1 else ("no answer", "no answer")
    return StreamProbe(dumpable, mem, stream)


def unconfined_because(loader: str | None, yama: int | None, probe: StreamProbe) -> str | None:
    """Why the CLI's descendants (the session) could reach its memory or reopen its stream,
    or None when they cannot: the rule the entry point starts the CLI by.

    ``loader``: why the CLI's ELF loader is not execute-only (None: it is, condition (a));
    ``yama``: ptrace_scope (None: no Yama); ``probe``: what ``probe_stream`` met. Condition (b)
    needs Yama's relational scope or stricter and the probe refused both routes by a dumpable
    entry point (a non-dumpable one refuses them whatever Yama does: they then show nothing).
    """
    if loader is None:
        return None
    if yama is None:
        why = "the kernel has no Yama (no /proc/sys/kernel/yama/ptrace_scope)"
    elif yama < 1:
        why = f"Yama's ptrace_scope is {yama}, so a descendant may open the CLI's memory"
    elif not probe.entry_dumpable:
        why = (f"Yama's ptrace_scope is {yama} but the probe ran against a non-dumpable entry point, "
               "so its refusals do not show that Yama keeps the session out of a dumpable CLI")
    else:
        opened = ([f"its /proc/PID/mem ({probe.mem})"] if probe.mem not in MEM_REFUSED else []) + \
                 ([f"its stream through /proc/PID/fd ({probe.stream})"] if probe.stream not in STREAM_REFUSED else [])
        if not opened:
            return None
        why = f"Yama's ptrace_scope is {yama} but a child of the entry point was not refused " + " nor ".join(opened)
    return f"{loader}, so the CLI would run dumpable; and {why}"


def harness(argv: list[str], socket_dir: Path, timeout: float, credentials: tuple[Path, Path] | None) -> int:
    """``credentials``: (the file, where the harness reads it), both given by the pod's builder."""
    from runner.entrypoints.canary import wait_until_confined
    from runner.executors import seccomp

    workspace = Path.cwd()  # the container's workingDir
    conn = _connect(socket_dir / SOCKET_NAME, _CONNECT_WAIT_SECONDS)
    conn.sendall(HELLO)  # with this process's credentials: the reader's proof of who connected
    seccomp.install(seccomp.program())  # before the probe, whose child must meet what the session will
    why = unconfined_because(_loader_readable_because(argv[0]), yama_scope(), probe_stream(conn.fileno()))
    if why is not None:  # the reader sees an empty stream; the exit code says why
        print(f"probe harness: refused: the session could write into the CLI's stream: {why}", file=sys.stderr)
        return UNCONFINED_EXIT
    # An enforcer programs a new pod's policy after the pod has its address (about a second
    # with kube-router, every route open meanwhile): the CLI starts only once the API server,
    # which must be out of reach, is.
    limit = float(os.environ.get("PROBE_POLICY_WAIT_SECONDS", "30"))
    waited = time.monotonic()
    if os.environ.get("KUBERNETES_SERVICE_HOST") and wait_until_confined(limit) is None:
        print(f"probe harness: refused: the API server was still reachable {limit:g} s after the pod started; "
              "its network policy is not in force", file=sys.stderr)
        return OPEN_NETWORK_EXIT
    waited = round(time.monotonic() - waited, 3)
    task = os.environ.get("PROBE_TASK", "")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROBE_")}
    copied = None
    if credentials is not None and credentials[0].is_file():
        copied = credentials[1]
        shutil.copyfile(credentials[0], copied)
        copied.chmod(0o600)
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=conn.fileno(), env=env, start_new_session=True)
        started = now()
        conn.close()  # only the CLI holds the stream now: its exit is the reader's end of stream
        assert proc.stdin is not None
        try:
            proc.stdin.write(task.encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            print(f"probe harness: time limit of {timeout:g} s reached; session killed", file=sys.stderr)
            code = TIMEOUT_EXIT
        _end_session(proc.pid)
        proc.wait()  # reaped: the CLI, killed at the limit or not, is gone before the modes change
        _open_to_group(workspace)
        _report({"harness_started": started, "policy_wait_seconds": waited})  # no process of the session is left to overwrite it
    finally:
        if copied is not None:
            copied.unlink(missing_ok=True)
    return code


def _end_session(group: int) -> None:
    """No process of the session outlives the CLI: its process group, and where this entry
    point is the container's first process (a pod), every other process of the container,
    which catches one that left the group (setsid)."""
    for pid in ([-1] if os.getpid() == 1 else []) + [-group]:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _open_to_group(root: Path) -> None:
    """Make what the session left readable by the pod's group (fsGroup, which the reader also
    has), so the reader's tar can pack a 0600 file or a 0700 directory (mktemp makes both).
    Runs once no session process is left to change a mode again; links are not followed."""
    uid = os.getuid()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
                if st.st_uid == uid and not stat.S_ISLNK(st.st_mode):
                    os.chmod(path, stat.S_IMODE(st.st_mode) | (0o050 if stat.S_ISDIR(st.st_mode) else 0o040))
            except OSError:
                pass  # gone, or not ours: the reader's tar reports what it cannot read


# Commands the controller runs by exec in the reader container. Shell and coreutils only, so a
# transfer costs no interpreter start; paths come from the reader's environment.
def deliver_argv() -> list[str]:
    """Unpack the tar on stdin into the workspace, then let the reader open the socket; print
    ``delivered``, or ``already`` where an earlier exec delivered it (a pod a restarted
    controller adopts, or a retry whose first run's exit status was lost): once delivered,
    never again, since the session may already be changing the workspace. The tar is then
    read to its end and dropped (read by tar, which stops at the archive's end as the
    unpacking one does: an exec's stdin has no end of file under the v4 channel protocol).
    One exec, where asking first cost a second (about 0.1 s before every CLI's start on the
    real node, bench/realnode.py)."""
    return ["sh", "-c", f'if [ -e "$PROBE_CAPTURE_DIR/{DELIVERED_NAME}" ]; then tar -t -f - >/dev/null && echo already; '
                        f'exit; fi; tar -x -p -f - --no-same-owner -C "$PROBE_WORKSPACE" && '
                        f'touch "$PROBE_CAPTURE_DIR/{DELIVERED_NAME}" && echo delivered']


def fetch_argv(offset: int, length: int, name: str = STREAM_NAME) -> list[str]:
    """Bytes [offset, offset+length) of a file of the capture volume: the stream, or the
    packed workspace."""
    return ["sh", "-c", 'tail -c +$(($1 + 1)) "$PROBE_CAPTURE_DIR/$3" | head -c "$2"', "fetch",
            str(offset), str(length), name]


def finish_argv(offset: int, chunk: int, limit: int, wait_seconds: float) -> list[str]:
    """The end of a session in one exec, where it took four (the record, the stream, the
    packing, the packed files: about 0.25 s of the outcome's latency on the real node): wait
    up to ``wait_seconds`` for the reader's record (it follows the stream's end, which may
    trail the harness container's by milliseconds), then pack the workspace, then print,
    framed for ``read_finish``: the record; the packing's size, sha256 and status; the stream
    from ``offset`` (from 0 where the stream is shorter), at most ``chunk`` bytes; and the
    first bytes of the packed workspace, up to ``chunk`` in all, none past ``limit``.
    Without a record it prints ``0`` and packs nothing.

    The packing: the workspace (links stored as links, never followed) into a file of the
    capture volume, at most ``limit`` + 1 bytes of it, which the controller fetches on in
    chunks past what fits here; a file tar cannot read is left out with a warning on stderr,
    not a failure."""
    ticks = max(0, round(wait_seconds / 0.05))
    script = (f'c="$PROBE_CAPTURE_DIR"; o=$1; k=$2; lim=$3; i=0; '
              f'while [ ! -e "$c/{RECORD_NAME}" ]; do [ $i -ge $4 ] && {{ echo 0; exit 0; }}; sleep 0.05; i=$((i + 1)); done; '
              f'wc -c <"$c/{RECORD_NAME}"; cat "$c/{RECORD_NAME}"; '
              f'{{ tar -c -f - --ignore-failed-read -C "$PROBE_WORKSPACE" . 2>"$c/pack.err"; echo $? >"$c/pack.status"; }} '
              f'| head -c $((lim + 1)) >"$c/{PACKED_NAME}"; p=$(wc -c <"$c/{PACKED_NAME}"); '
              f'echo "$p $(sha256sum "$c/{PACKED_NAME}" | cut -d" " -f1) $(cat "$c/pack.status")"; '
              f's=$(wc -c <"$c/{STREAM_NAME}"); [ "$o" -gt "$s" ] && o=0; n=$((s - o)); [ $n -gt $k ] && n=$k; '
              f'echo "$o $n"; tail -c +$((o + 1)) "$c/{STREAM_NAME}" | head -c $n; '
              f'm=$((k - n)); [ $m -gt $p ] && m=$p; [ $p -gt $lim ] && m=0; '
              f'echo $m; head -c $m "$c/{PACKED_NAME}"; tail -c 2000 "$c/pack.err" >&2')
    return ["sh", "-c", script, "finish", str(offset), str(chunk), str(limit), str(ticks)]


class Packed(NamedTuple):
    """The workspace as finish_argv packed it, and its first ``head`` bytes."""

    size: int
    sha256: str  # hex
    status: str  # tar's exit status
    head: bytes


class Finish(NamedTuple):
    """What finish_argv printed: the reader's record, the stream's bytes from ``offset``, the packing."""

    record: ReaderRecord
    offset: int
    stream: bytes
    packed: Packed


def read_finish(out: bytes) -> Finish | None:
    """finish_argv's output; None where the reader had no record; ValueError where it is not
    finish_argv's (cut short, or a reader of another version)."""
    at = 0

    def line() -> str:
        nonlocal at
        end = out.index(b"\n", at)
        text, at = out[at:end].decode(), end + 1
        return text

    def take(n: int) -> bytes:
        nonlocal at
        if n < 0 or at + n > len(out):
            raise ValueError(f"finish: {n} bytes announced, {len(out) - at} left")
        data, at = out[at:at + n], at + n
        return data

    size = int(line())
    if size == 0:
        return None
    record: ReaderRecord = json.loads(take(size))
    size_text, sha, status = line().split()
    offset, n = (int(v) for v in line().split())
    stream = take(n)
    head = take(int(line()))
    if at != len(out):
        raise ValueError(f"finish: {len(out) - at} bytes past the end")
    return Finish(record, offset, stream, Packed(int(size_text), sha, status, head))


def main(args: list[str]) -> int:
    env = os.environ
    if args[:1] == ["reader"]:
        uid = env.get("PROBE_HARNESS_UID")
        give_up_after(int(env.get("PROBE_DEADLINE_SECONDS") or 0))
        reader(Path(env["PROBE_CAPTURE_DIR"]), Path(env["PROBE_SOCKET_DIR"]), int(uid) if uid else None)
        return 0
    if args[:2] == ["harness", "--"] and len(args) > 2:
        creds, target = env.get("PROBE_CREDENTIALS_FILE"), env.get("PROBE_CREDENTIALS_TARGET")
        if creds and not target:  # a pod built by another version: the login would be silently lost
            print("probe harness: refused: PROBE_CREDENTIALS_FILE without PROBE_CREDENTIALS_TARGET (where the harness "
                  "reads it); the controller and the harness image are of different versions", file=sys.stderr)
            return 2
        return harness(args[2:], Path(env["PROBE_SOCKET_DIR"]), float(env.get("PROBE_TIMEOUT_SECONDS", "1800")),
                       (Path(creds), Path(target)) if creds and target else None)
    print("usage: python3 -m runner.entrypoints.pod reader | harness -- COMMAND...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
