"""A third executor, test-only (issue 30's sketch: "a third executor (a fake one, through its
conformance suite)"): the harness as a plain child process of this host, in the sealed
workspace itself, with no sandbox and no network limit, so its records say so. It is a module
beside runner/executors/ built on the contract alone (runner/executors/base.py) and the
harness seam; tests/integration/test_executor_conformance.py holds it to the same suite as the
product's executors and runs a whole campaign through it. Never a product executor: it confines
nothing."""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from runner import harnesses
from runner.aio import own_thread
from runner.clock import now
from runner.errors import UserError
from runner.executors.base import CaptureRecord, Halt, Live, Phases, Remedies, Slot
from runner.executors.capture import collect_workspace, host_skill_names
from runner.harnesses.contract import Reach
from runner.layout import SessionKeys
from runner.phases import FirstReply
from runner.plan import Plan, Probe
from runner.seal import SealedWorkspace
from runner.settings import Settings
from runner.share import WHOLE, Share
from runner.store import Store

_READ_CHUNK = 1 << 16


@dataclass
class PlainExecutor:
    settings: Settings
    name: str = "plain"
    confinement: str = "unconfined: the harness ran as a plain process of the test host (a test executor)"
    waiting_room: int = 0
    harness: str | None = None
    harness_version: str | None = None  # what the harness says it is (``--version``), as the local executor records it

    def remedies(self, campaign: str) -> Remedies:
        return Remedies(campaign, "run the test again", "--corpus DIR", "fix the provider's key")

    def preflight(self) -> None:
        found = shutil.which(self.settings.harness.command)
        if not found:
            raise UserError(f"harness {self.settings.harness.command!r} not found ({harnesses.HARNESS.install})")
        self.harness = found
        done = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=60, check=False)
        self.harness_version = done.stdout.strip() or None

    def prepare(self, plan: Plan, final: set[Live], share: Share = WHOLE) -> set[Live]:
        return set()  # nothing of this executor outlives its process

    async def run(self, plan: Plan, probe: Probe, sealed: SealedWorkspace, scratch: Path, store: Store, keys: SessionKeys,
                  also_collect: Callable[[SessionKeys, str], set[str]], started: Callable[[], None], slot: Slot) -> CaptureRecord:
        return await own_thread(self._drive, plan, probe, sealed, scratch, store, keys, also_collect, started)

    def _drive(self, plan: Plan, probe: Probe, sealed: SealedWorkspace, scratch: Path, store: Store, keys: SessionKeys,
               also_collect: Callable[[SessionKeys, str], set[str]], started: Callable[[], None]) -> CaptureRecord:
        assert self.harness is not None, "preflight() first"
        s, harness = self.settings, harnesses.HARNESS
        config = scratch / "config"
        config.mkdir(mode=0o700)
        key = s.provider.api_key
        env = {**harness.environment(Reach(str(config), s.provider.base_url, None if key is None else key.get_secret_value())),
               **s.harness.env}
        argv = [self.harness, *harness.flags(plan, s)]
        started()
        started_at = now()
        timed_out = threading.Event()
        phases: Phases = {}
        reply = FirstReply()
        with open(scratch / "stderr.log", "wb") as err, store.writer(keys.stream) as out:
            proc = subprocess.Popen(argv, cwd=sealed.path, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=err, start_new_session=True)
            phases["harness_started"] = now()
            timer = threading.Timer(s.harness.timeout_seconds, lambda: (timed_out.set(), proc.kill()))
            timer.start()
            try:
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(probe.task.encode())
                proc.stdin.close()
                while chunk := proc.stdout.read(_READ_CHUNK):
                    if reply.saw(chunk):
                        phases["first_reply"] = now()
                    out.write(chunk)
                exit_code = proc.wait()
                phases["harness_exited"] = now()
            finally:
                timer.cancel()
            out.commit()
            phases["stream_collected"] = now()
            stream = {"key": keys.stream, "bytes": out.size, "sha256": out.sha256}
        store.put(keys.stderr, (scratch / "stderr.log").read_bytes())
        workspace = str(sealed.path)
        return {
            "executor": self.name,
            "confinement": self.confinement,
            "network_confined": False,
            "harness": {"path": self.harness, "version": self.harness_version, "argv": argv,
                        "allowed_tools": s.harness.allowed_tools, "disallowed_tools": s.harness.disallowed_tools},
            "started_at": started_at,
            "ended_at": now(),
            "exit_code": exit_code,
            "timed_out": timed_out.is_set(),
            "stream": stream,
            "workspace": workspace,
            "config_dir": str(config),
            "host_skills": host_skill_names(env),
            "artifacts": collect_workspace(sealed.path, sealed.manifest, also_collect(keys, workspace), store, keys),
            "phases": phases,
        }

    def finish(self, keys: SessionKeys) -> None:
        pass

    def halted(self) -> Halt | None:
        return None

    def close(self) -> None:
        pass
