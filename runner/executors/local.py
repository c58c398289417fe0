"""The local executor, the embedded default: each session is a process under bubblewrap.

The session's filesystem holds exactly what the recorder contract lists: /usr and /etc
read-only (with /bin, /lib and their siblings as the host has them), a private /proc, /dev
and /tmp, the workspace read-write at /workspace, the harness binary read-only at a path of its
own, the session's configuration directory read-write at /run/probe/config and the run's log
directory read-write at /run/probe/log. The workspace and configuration paths are the session
pod's (runner/sandbox.py), so every session of either executor sees the same paths: what
a call returns (``pwd``, a path in a command's output, the harness's error messages that name
its working directory) does not depend on where on the host the workspace was sealed, and the
capture record names these in-sandbox paths. The host paths serve only the driver (collecting
the workspace and the logs). The environment is built from nothing (bwrap is started with
exactly the variables the harness needs, so no secret appears in an argument list). Network
egress is NOT confined here: the session shares the host's network, and every transcript says so.

The harness's standard output is the stream the recorder trusts, so the session must have no
handle on it. A pipe or a file would not do: any process of the session can reopen a pipe or
file through /proc/PID/fd/1 of the harness (its ancestor, same uid), and a forged line then
lands in the stream. So stdout is one end of a Unix socket pair whose other end only the driver
holds, and the sandbox is laid out so that no process of the session can reach that end or the
harness's copy of it:

* open() of a socket through /proc fails (ENXIO), and the harness is not dumpable, so the
  kernel's ptrace access check refuses its /proc/PID/fd and /proc/PID/mem outright. A process
  cannot be made non-dumpable from outside, and prctl() is reset by execve(); but execve()
  leaves a process non-dumpable when its ELF loader is not readable by it. So the harness's
  loader is bound into the sandbox execute-only (mode 0111), and every process that starts
  inside is non-dumpable. The sandbox's first process checks that premise on every session.
* The session holds no capability (``--cap-drop ALL``; run as root, bwrap would otherwise keep
  every capability inside its user namespace, CAP_SYS_PTRACE included), so the access check
  has no exception for it. A seccomp filter (``seccomp.py``) makes ptrace, process_vm_readv,
  process_vm_writev and pidfd_getfd fail with EPERM for every process of the sandbox, as a
  second layer that does not rest on dumpability, Yama or capabilities.
* bwrap's own init would hold its stdio unfiltered and dumpable, so the sandbox's first
  process is ours (``--as-pid-1``): a shell that starts the harness with the socket as its
  stdout, lets go of its own copy before the harness runs, and only reaps. The driver and the
  outer bwrap lie outside the sandbox's PID namespace, where nothing of the session can name
  them.

Where bwrap cannot create its namespaces the executor refuses before any harness call (the
contract's exit 12); there is no switch that turns confinement off.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from runner import harnesses, hooks
from runner.aio import own_thread
from runner.clock import now
from runner.errors import ConfinementError, UserError
from runner.executors import seccomp
from runner.executors.base import CaptureRecord, Halt, Live, Phases, Remedies, Slot, StreamRecord
from runner.executors.capture import collect_workspace, host_skill_names
from runner.executors.elf import elf_loader
from runner.gateway.local import LocalGateway
from runner.harnesses.contract import Reach
from runner.layout import SessionKeys
from runner.metrics import GatewayMetrics
from runner.phases import FirstReply
from runner.plan import Plan, Probe
from runner.sandbox import CONFIG_DIR, WORKSPACE
from runner.seal import SealedWorkspace
from runner.settings import Settings
from runner.share import WHOLE, Share
from runner.store import Store

LOG_DIR = "/run/probe/log"  # the log directory inside the sandbox (PROBE_LOG_DIR names it)
_ROOT_SIBLINGS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_READ_CHUNK = 1 << 16

CONFINEMENT_PROSE = (
    "Each session ran under bubblewrap (local executor): its filesystem held /usr and /etc "
    "read-only, a private /proc, /dev and /tmp, the workspace read-write at /workspace (the same "
    "path for every session and for both executors), the harness binary read-only, and its log and "
    "configuration directories; its environment was cleared. "
    "Network egress was not confined: a session could reach any host the recording host reaches. "
    "The harness's standard output, the stream this transcript was made from, was one end of a "
    "Unix socket pair whose other end only the driver held, outside the sandbox's PID namespace, "
    "where no process of the session could name the driver. "
    "Reopening /proc/PID/fd/1 of the harness or of any other ancestor was closed twice: the kernel "
    "cannot open a socket through /proc, and it refused the harness's /proc/PID/fd to the session "
    "because the harness was not dumpable (its ELF loader was execute-only inside the sandbox); "
    "the sandbox's first process, a shell that only started the harness and reaped, closed its copy "
    "of the socket before the harness ran. "
    "Writing another process's descriptors found under /proc/*/fd was closed the same way, since no "
    "process of the session held the socket. "
    "Writing /proc/PID/mem of the harness was closed by the kernel's ptrace access check, which "
    "refuses a process that is not dumpable to a session holding no capability (all were dropped). "
    "ptrace, process_vm_writev, process_vm_readv and pidfd_getfd were closed by a seccomp filter "
    "on every process of the sandbox (EPERM, for every ABI of the machine), and again by that "
    "access check. "
    "A session could still end or stop its own harness, as any process may signal another of its "
    "uid; a stream cut short that way has no result line, and the recorder states it incomplete."
)


def root_siblings(root: Path = Path("/")) -> list[str]:
    """bwrap arguments that lay out /bin, /lib and their siblings as the host has them."""
    args: list[str] = []
    for name in _ROOT_SIBLINGS:
        p = root / name
        if p.is_symlink():
            args += ["--symlink", os.readlink(p), f"/{name}"]
        elif p.is_dir():
            args += ["--ro-bind", str(p), f"/{name}"]
    return args


def pid1_script(loader: str) -> str:
    """The sandbox's first process: check the premise, start the harness on the socket, reap.

    The harness's stdout arrives as this shell's fd 1 and its task as fd 0. They move to fds 4
    and 5, the harness gets them, and the shell closes its copies before it waits, so from then
    on the harness is the one process of the sandbox that holds the socket. (A background job's
    stdin would be /dev/null without the explicit redirection.) The shell is pid 1, so orphans
    of the session are reaped while it waits, and its exit status is the harness's. If the
    loader is readable here, execve() would leave the harness dumpable: the sandbox refuses.
    """
    q = shlex.quote(loader)
    return (
        f"if (: <{q}) 2>/dev/null; then echo 'probe sandbox: the ELF loader is readable, so the harness "
        "would be dumpable; refused' >&2; exit 125; fi; "
        'exec 4<&0 5>&1 </dev/null >/dev/null; '
        '"$0" "$@" <&4 >&5 4<&- 5>&- & '
        'exec 4<&- 5>&-; wait $!'
    )


def bwrap_args(bwrap: str, harness: str, workspace: str, config_dir: str, log_dir: str, siblings: list[str],
               loader: str, loader_fd: int, seccomp_fd: int) -> list[str]:
    """The bubblewrap command line for one session; the harness argv follows it.

    ``workspace``, ``config_dir`` and ``log_dir`` are host paths; the session sees them at
    :data:`WORKSPACE`, :data:`CONFIG_DIR` and :data:`LOG_DIR`, whatever the host paths are.
    bwrap makes those mount points in its own new root (/run is not bound from the host), and
    none lies under another bind. ``loader_fd`` holds the bytes of ``loader`` and ``seccomp_fd``
    the filter program; bwrap reads both when it starts (see :func:`sandbox_fds`).
    """
    return [
        bwrap,
        "--unshare-all", "--unshare-user", "--share-net",
        "--die-with-parent", "--new-session", "--as-pid-1",
        "--cap-drop", "ALL",
        "--ro-bind", "/usr", "/usr",
        "--ro-bind", "/etc", "/etc",
        *siblings,
        "--perms", "0111", "--ro-bind-data", str(loader_fd), loader,
        "--proc", "/proc",
        "--dev", "/dev",
        "--tmpfs", "/tmp",
        "--ro-bind", harness, harness_path(),
        "--bind", workspace, WORKSPACE,
        "--bind", log_dir, LOG_DIR,
        "--bind", config_dir, CONFIG_DIR,
        "--seccomp", str(seccomp_fd),
        "--chdir", WORKSPACE,
        "--", "/bin/sh", "-c", pid1_script(loader),
    ]


@contextmanager
def sandbox_fds(loader: str, program: bytes) -> Iterator[tuple[int, int]]:
    """(loader_fd, seccomp_fd) for :func:`bwrap_args`, to pass to bwrap and close after it starts.

    The program is a few dozen bytes, so it fits a pipe's buffer and bwrap can read it later.
    """
    loader_fd = os.open(loader, os.O_RDONLY | os.O_CLOEXEC)
    r, w = os.pipe()
    try:
        os.write(w, program)
    finally:
        os.close(w)
    try:
        yield loader_fd, r
    finally:
        os.close(r)
        os.close(loader_fd)


def harness_path() -> str:
    """The harness binary's own path inside the sandbox."""
    return f"/run/probe-harness/{harnesses.HARNESS.executable}"


def harness_argv(plan: Plan, settings: Settings) -> list[str]:
    """The harness's flags; the prompt goes in on stdin, so no task text is an argument."""
    return [harness_path(), *harnesses.HARNESS.flags(plan, settings)]


def harness_env(settings: Settings) -> dict[str, str]:
    """The harness's whole environment but its credential (see LocalExecutor._session_env); its
    directories are the paths inside the sandbox."""
    reach = Reach(CONFIG_DIR, settings.provider.base_url)
    return {**harnesses.HARNESS.environment(reach), "PROBE_LOG_DIR": LOG_DIR, **settings.harness.env}


def local_remedies(campaign: str) -> Remedies:
    """A campaign on this host is run again by `run` (or `ledger resume --corpus`)."""
    return Remedies(campaign, "`probe-runner run` it again", "--corpus DIR", "fix the provider's key")


@dataclass
class LocalExecutor:
    settings: Settings
    name: str = "local"
    confinement: str = CONFINEMENT_PROSE
    waiting_room: int = 0  # a session here starts at once: nothing waits on a platform
    gateway: LocalGateway | None = None  # the run's provider gateway: sessions hold a token of their attempt, not the key
    harness: str | None = None
    harness_version: str | None = None
    bwrap: str | None = None
    loader: str | None = None
    seccomp_program: bytes | None = None
    gateway_metrics: GatewayMetrics | None = None  # counts the run gateway's calls (metrics.port set), else none

    def preflight(self) -> None:
        """Refuse, before anything can spend, a host that cannot confine a session."""
        s = self.settings
        home = Path(os.environ.get("HOME", "/nonexistent")).resolve()
        workdir = s.local.workdir.resolve()
        if workdir == home or home in workdir.parents:
            raise UserError(f"the work directory {workdir} lies under $HOME ({home}); set RUNNER_LOCAL__WORKDIR outside it")
        found = shutil.which(s.harness.command)
        if not found:
            raise UserError(f"harness {s.harness.command!r} not found ({harnesses.HARNESS.install}, or set RUNNER_HARNESS__COMMAND)")
        self.harness = os.path.realpath(found)
        if s.provider.api_key is None and s.provider.credentials_file is None:
            raise UserError("no credentials for the harness: set RUNNER_PROVIDER__API_KEY or RUNNER_PROVIDER__CREDENTIALS_FILE")
        if s.provider.credentials_file is not None and not s.provider.credentials_file.is_file():
            raise UserError(f"credentials file {s.provider.credentials_file} does not exist")
        bwrap = shutil.which(s.local.bwrap)
        if not bwrap:
            raise ConfinementError(f"bubblewrap ({s.local.bwrap}) is not installed: a session cannot be confined, so none runs")
        try:
            self.seccomp_program = seccomp.program()
        except seccomp.UnsupportedArchitecture as exc:
            raise ConfinementError(f"{exc}: a session cannot be confined, so none runs") from None
        self.bwrap, self.loader = bwrap, elf_loader(self.harness)
        workdir.mkdir(parents=True, exist_ok=True)
        probe = workdir / ".preflight"
        probe.mkdir(exist_ok=True)
        try:
            with sandbox_fds(self.loader, self.seccomp_program) as fds:
                args = self._bwrap_args(str(probe), str(probe), str(probe), fds)
                done = subprocess.run(args + [harness_path(), "--version"], env=harness_env(s),
                                      stdin=subprocess.DEVNULL, capture_output=True, timeout=60, pass_fds=fds)
        except subprocess.TimeoutExpired:
            raise ConfinementError("bubblewrap did not start the harness within 60 s") from None
        if done.returncode != 0:
            err = done.stderr.decode(errors="replace").strip().splitlines()
            raise ConfinementError(f"bubblewrap cannot confine a session here ({err[-1] if err else 'exit ' + str(done.returncode)}); none runs")
        self.harness_version = done.stdout.decode(errors="replace").strip()

    def prepare(self, plan: Plan, final: set[Live], share: Share = WHOLE) -> set[Live]:
        """Start the run's provider gateway on loopback (where the key is given as
        provider.api_key and gateway.enabled); nothing outlives a local run, so nothing is
        adopted: a session whose runner died died with it."""
        s = self.settings
        if s.gateway.enabled and s.provider.api_key is not None and self.gateway is None:
            self.gateway = LocalGateway(s, plan.campaign, plan.model, self.gateway_metrics).__enter__()
        return set()

    def finish(self, keys: SessionKeys) -> None:
        """The outcome is journaled: the attempt's token is refused from now on (its scratch
        directory is the campaign's to remove)."""
        if self.gateway is not None:
            self.gateway.revoke(keys)

    def _session_env(self, keys: SessionKeys) -> dict[str, str]:
        """The harness's environment: with the gateway, its base URL and a token of this
        attempt (valid for the session's time limit and a margin) in place of the key."""
        harness, env, key = harnesses.HARNESS, harness_env(self.settings), self.settings.provider.api_key
        if self.gateway is not None:
            token = self.gateway.token(keys, self.settings.harness.timeout_seconds + 300)
            env.update(harness.route(Reach(CONFIG_DIR, self.gateway.url, token)))
        elif key is not None:  # gateway.enabled false: the key itself, readable by the session
            env[harness.credential_variable] = key.get_secret_value()
        return env

    def remedies(self, campaign: str) -> Remedies:
        return local_remedies(campaign)

    def halted(self) -> Halt | None:
        """bwrap's confinement is checked per session, before its harness runs (preflight too)."""
        return None

    def close(self) -> None:
        """Stop the gateway: no token of this run is served after it."""
        if self.gateway is not None:
            self.gateway.__exit__(None, None, None)
            self.gateway = None

    def _bwrap_args(self, workspace: str, config_dir: str, log_dir: str, fds: tuple[int, int]) -> list[str]:
        """bwrap's argv for the host directories ``workspace``, ``config_dir`` and ``log_dir``."""
        assert self.bwrap and self.harness and self.loader, "preflight() first"
        return bwrap_args(self.bwrap, self.harness, workspace, config_dir, log_dir, root_siblings(), self.loader, *fds)

    async def run(self, plan: Plan, probe: Probe, sealed: SealedWorkspace, scratch: Path, store: Store, keys: SessionKeys,
                  also_collect: Callable[[SessionKeys, str], set[str]], started: Callable[[], None],
                  slot: Slot) -> CaptureRecord:
        """Run one session, holding ``slot`` throughout; returns its capture record (the stream
        is in the store). The driver reads the stream as the harness writes it and reaps the
        harness, so it blocks as long as the session runs: on a thread of its own
        (runner/aio.py), as many as the host's concurrency. Its phases are this driver's: the
        harness started (bwrap's process made), its first reply and its exit as the driver
        reads the stream and reaps it, the stream and the files stored."""
        return await own_thread(self._drive, plan, probe, sealed, scratch, store, keys, also_collect, started)

    def _drive(self, plan: Plan, probe: Probe, sealed: SealedWorkspace, scratch: Path, store: Store, keys: SessionKeys,
               also_collect: Callable[[SessionKeys, str], set[str]], started: Callable[[], None]) -> CaptureRecord:
        s = self.settings
        assert self.harness is not None, "preflight() first"
        config_dir, log_dir = scratch / "config", scratch / "log"
        for d in (config_dir, log_dir):
            d.mkdir(mode=0o700, parents=True, exist_ok=False)
        if s.provider.credentials_file is not None:
            target = config_dir / harnesses.HARNESS.credentials_file
            shutil.copyfile(s.provider.credentials_file, target)
            target.chmod(0o600)
        started()  # journaled before the harness can run
        started_at = now()
        timed_out = threading.Event()
        phases: Phases = {}
        reply = FirstReply()
        # The stream's channel: the harness writes to one end, only this driver holds the other.
        reader, writer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with reader, writer, open(scratch / "stderr.log", "wb") as err, store.writer(keys.stream) as out:
                try:
                    assert self.loader is not None and self.seccomp_program is not None, "preflight() first"
                    with sandbox_fds(self.loader, self.seccomp_program) as fds:
                        proc = subprocess.Popen(self._bwrap_args(str(sealed.path), str(config_dir), str(log_dir), fds) + harness_argv(plan, s),
                                                env=self._session_env(keys), stdin=subprocess.PIPE,
                                                stdout=writer.fileno(), stderr=err, pass_fds=fds, start_new_session=True)
                        phases["harness_started"] = now()
                finally:
                    writer.close()  # from here the sandbox holds the only write end: its end is the stream's end

                def kill() -> None:
                    timed_out.set()
                    _killpg(proc)

                timer = threading.Timer(s.harness.timeout_seconds, kill)
                timer.start()
                try:
                    assert proc.stdin
                    try:
                        proc.stdin.write(probe.task.encode())
                        proc.stdin.close()
                    except BrokenPipeError:
                        pass
                    fd = reader.fileno()
                    while chunk := os.read(fd, _READ_CHUNK):
                        if reply.saw(chunk):
                            phases["first_reply"] = now()
                        out.write(chunk)
                        hooks.stage("mid-stream", accepted=out.size)
                    exit_code = proc.wait()
                    phases["harness_exited"] = now()
                finally:
                    timer.cancel()
                    _killpg(proc)  # nothing the session started outlives it
                out.commit()
                phases["stream_collected"] = now()
                hooks.stage("stream-stored")
                stream: StreamRecord = {"key": keys.stream, "bytes": out.size, "sha256": out.sha256}
        finally:
            (config_dir / harnesses.HARNESS.credentials_file).unlink(missing_ok=True)
        ended_at = now()
        store.put(keys.stderr, (scratch / "stderr.log").read_bytes())
        # The stream names paths as the session saw them (under WORKSPACE); the bytes are read on the host.
        collected = collect_workspace(sealed.path, sealed.manifest, also_collect(keys, WORKSPACE), store, keys)
        for f in log_dir.rglob("*"):
            if f.is_file() and not f.is_symlink():
                store.put(f"{keys.prefix}/log/{f.relative_to(log_dir).as_posix()}", f.read_bytes())
        capture: CaptureRecord = {
            "executor": self.name,
            "confinement": self.confinement,
            "network_confined": False,
            "harness": {"path": self.harness, "version": self.harness_version, "argv": harness_argv(plan, s),
                        "allowed_tools": s.harness.allowed_tools, "disallowed_tools": s.harness.disallowed_tools},
            "started_at": started_at,
            "ended_at": ended_at,
            "exit_code": exit_code,
            "timed_out": timed_out.is_set(),
            "stream": stream,
            "workspace": WORKSPACE,  # the paths as the session saw them, as the transform reads its stream
            "config_dir": CONFIG_DIR,
            "host_skills": host_skill_names(),
            "artifacts": collected,
            "phases": phases,
        }
        if self.gateway is not None:
            capture["gateway"] = self.gateway.meter(keys)
        phases["artifacts_collected"] = now()
        return capture


def _killpg(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
