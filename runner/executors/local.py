"""The local executor, the embedded default: each session is a process under bubblewrap.

The session's filesystem holds exactly what the recorder contract lists: /usr and /etc
read-only (with /bin, /lib and their siblings as the host has them), a private /proc, /dev
and /tmp, the workspace read-write at its own path, the harness binary read-only at a path of
its own, the run's log directory and the session's configuration directory read-write. The
environment is built from nothing (bwrap is started with exactly the variables the harness
needs, so no secret appears in an argument list). Network egress is NOT confined here: the
session shares the host's network, and every transcript says so.

Where bwrap cannot create its namespaces the executor refuses before any harness call (the
contract's exit 12); there is no switch that turns confinement off.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from runner.errors import ConfinementError, UserError
from runner.executors.capture import collect_workspace, host_skill_names
from runner.layout import SessionKeys
from runner.ledger import now
from runner.plan import Plan, Probe
from runner.seal import SealedWorkspace
from runner.settings import Settings
from runner.store import Store

HARNESS_PATH = "/run/probe-harness/claude"  # the harness binary's own path inside the sandbox
_ROOT_SIBLINGS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_READ_CHUNK = 1 << 16

CONFINEMENT_PROSE = (
    "Each session ran under bubblewrap (local executor): its filesystem held /usr and /etc "
    "read-only, a private /proc, /dev and /tmp, the workspace read-write, the harness binary "
    "read-only, and its log and configuration directories; its environment was cleared. "
    "Network egress was not confined: a session could reach any host the recording host reaches."
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


def bwrap_args(bwrap: str, harness: str, workspace: str, config_dir: str, log_dir: str, siblings: list[str]) -> list[str]:
    """The bubblewrap command line for one session (a pure function of its paths)."""
    return [
        bwrap,
        "--unshare-all", "--share-net",
        "--die-with-parent", "--new-session",
        "--ro-bind", "/usr", "/usr",
        "--ro-bind", "/etc", "/etc",
        *siblings,
        "--proc", "/proc",
        "--dev", "/dev",
        "--tmpfs", "/tmp",
        "--ro-bind", harness, HARNESS_PATH,
        "--bind", workspace, workspace,
        "--bind", log_dir, log_dir,
        "--bind", config_dir, config_dir,
        "--chdir", workspace,
        "--",
    ]


def harness_argv(plan: Plan, settings: Settings) -> list[str]:
    """DESIGN.md's harness flags; the prompt goes in on stdin, so no task text is an argument."""
    h = settings.harness
    argv = [
        HARNESS_PATH, "-p",
        "--output-format", "stream-json", "--verbose",
        "--setting-sources", "project,local",
        "--permission-mode", "dontAsk",
        "--model", plan.model,
        "--allowedTools", *h.allowed_tools,
        "--disallowedTools", *h.disallowed_tools,
    ]
    if h.max_turns:
        argv += ["--max-turns", str(h.max_turns)]
    return argv


def harness_env(settings: Settings, config_dir: str, log_dir: str) -> dict[str, str]:
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": config_dir,
        "CLAUDE_CONFIG_DIR": config_dir,
        "TMPDIR": "/tmp",
        "LANG": "C.UTF-8",
        "PROBE_LOG_DIR": log_dir,
        "ANTHROPIC_BASE_URL": settings.provider.base_url,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    if settings.provider.api_key is not None:
        env["ANTHROPIC_API_KEY"] = settings.provider.api_key.get_secret_value()
    env.update(settings.harness.env)
    return env


@dataclass
class LocalExecutor:
    settings: Settings
    name: str = "local"
    confinement: str = CONFINEMENT_PROSE
    harness: str | None = None
    harness_version: str | None = None

    def preflight(self) -> None:
        """Refuse, before anything can spend, a host that cannot confine a session."""
        s = self.settings
        home = Path(os.environ.get("HOME", "/nonexistent")).resolve()
        workdir = s.local.workdir.resolve()
        if workdir == home or home in workdir.parents:
            raise UserError(f"the work directory {workdir} lies under $HOME ({home}); set RUNNER_LOCAL__WORKDIR outside it")
        found = shutil.which(s.harness.command)
        if not found:
            raise UserError(f"harness {s.harness.command!r} not found (install @anthropic-ai/claude-code or set RUNNER_HARNESS__COMMAND)")
        self.harness = os.path.realpath(found)
        if s.provider.api_key is None and s.provider.credentials_file is None:
            raise UserError("no credentials for the harness: set RUNNER_PROVIDER__API_KEY or RUNNER_PROVIDER__CREDENTIALS_FILE")
        if s.provider.credentials_file is not None and not s.provider.credentials_file.is_file():
            raise UserError(f"credentials file {s.provider.credentials_file} does not exist")
        bwrap = shutil.which(s.local.bwrap)
        if not bwrap:
            raise ConfinementError(f"bubblewrap ({s.local.bwrap}) is not installed: a session cannot be confined, so none runs")
        workdir.mkdir(parents=True, exist_ok=True)
        probe = workdir / ".preflight"
        probe.mkdir(exist_ok=True)
        args = bwrap_args(bwrap, self.harness, str(probe), str(probe), str(probe), root_siblings())
        try:
            done = subprocess.run(args + [HARNESS_PATH, "--version"], env=harness_env(s, str(probe), str(probe)),
                                  stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
        except subprocess.TimeoutExpired:
            raise ConfinementError("bubblewrap did not start the harness within 60 s") from None
        if done.returncode != 0:
            err = done.stderr.decode(errors="replace").strip().splitlines()
            raise ConfinementError(f"bubblewrap cannot confine a session here ({err[-1] if err else 'exit ' + str(done.returncode)}); none runs")
        self.harness_version = done.stdout.decode(errors="replace").strip()

    def run(self, plan: Plan, probe: Probe, sealed: SealedWorkspace, scratch: Path, store: Store, keys: SessionKeys,
            also_collect, started) -> dict:
        """Run one session; returns its capture record (the stream is in the store)."""
        s = self.settings
        assert self.harness is not None, "preflight() first"
        config_dir, log_dir = scratch / "config", scratch / "log"
        for d in (config_dir, log_dir):
            d.mkdir(mode=0o700, parents=True, exist_ok=False)
        if s.provider.credentials_file is not None:
            target = config_dir / ".credentials.json"
            shutil.copyfile(s.provider.credentials_file, target)
            target.chmod(0o600)
        workspace = str(sealed.path)
        args = bwrap_args(shutil.which(s.local.bwrap) or s.local.bwrap, self.harness, workspace, str(config_dir), str(log_dir), root_siblings())
        started()  # journaled before the harness can run
        started_at = now()
        timed_out = threading.Event()
        try:
            with open(scratch / "stderr.log", "wb") as err, store.writer(keys.stream) as out:
                proc = subprocess.Popen(args + harness_argv(plan, s), env=harness_env(s, str(config_dir), str(log_dir)),
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, start_new_session=True)

                def kill() -> None:
                    timed_out.set()
                    _killpg(proc)

                timer = threading.Timer(s.harness.timeout_seconds, kill)
                timer.start()
                try:
                    assert proc.stdin and proc.stdout
                    try:
                        proc.stdin.write(probe.task.encode())
                        proc.stdin.close()
                    except BrokenPipeError:
                        pass
                    fd = proc.stdout.fileno()
                    while chunk := os.read(fd, _READ_CHUNK):
                        out.write(chunk)
                    exit_code = proc.wait()
                finally:
                    timer.cancel()
                    _killpg(proc)  # nothing the session started outlives it
                out.commit()
                stream = {"key": keys.stream, "bytes": out.size, "sha256": out.sha256}
        finally:
            (config_dir / ".credentials.json").unlink(missing_ok=True)
        ended_at = now()
        store.put(keys.stderr, (scratch / "stderr.log").read_bytes())
        collected = collect_workspace(sealed.path, sealed.manifest, also_collect(keys, workspace), store, keys)
        for f in log_dir.rglob("*"):
            if f.is_file() and not f.is_symlink():
                store.put(f"{keys.prefix}/log/{f.relative_to(log_dir).as_posix()}", f.read_bytes())
        return {
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
            "workspace": workspace,
            "config_dir": str(config_dir),
            "host_skills": host_skill_names(),
            "artifacts": collected,
        }


def _killpg(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
