"""Issue 6, part 1: no process of a session can add, change or drop a byte of the stream.

One session of the real Claude Code CLI under the local executor, against the scripted
provider. Its Bash calls run ``channel_attack.py`` (copied into the workspace), one route per
call: reopen fd 1 of every ancestor, write every descriptor under /proc/*/fd, pidfd_getfd,
ptrace attach with an injected write, process_vm_writev, /proc/PID/mem, and the same calls
against the attacker itself (where only seccomp can refuse them). Every route that yields a
descriptor or a tracee writes a forged stream-json line with a marker through it.

Against the pipe-based capture this replaced, the same session put 11 forged lines into the
stored stream (reopen, any-fd, pidfd_getfd and ptrace all wrote), so these tests fail there.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import hostile  # tests/hostile.py
import pytest
from local_run import run_local
from pydantic import SecretStr

from runner import layout
from runner.demo.provider import ScriptedProvider
from runner.errors import ConfinementError
from runner.executors import local
from runner.executors.local import LocalExecutor
from runner.plan import parse_plan
from runner.settings import Settings
from runner.store.file import FileStore
from runner.transform.run import run_transform

ATTACK = Path(__file__).with_name("channel_attack.py")
ROUTES = ["processes", "reopen-fd1", "any-fd", "pidfd-getfd", "ptrace", "vm-write", "proc-mem", "controls"]
MARKER = b"FORGED-MARKER-"
PROBE = {"id": "HW-PRB-0101", "path": "docs/probes/channel.md", "title": "Channel integrity",
         "task": "TASK-CHANNEL: try every route into the recorder's stream.", "answers": ["sealed"],
         "examines": ["docs/a.md"]}
SCENARIOS = {"scenarios": [{"name": "channel", "match": "TASK-CHANNEL", "turns": [
    *({"tool_uses": [{"name": "Bash", "input": {"command": f"python3 tools/attack.py {r}"}}]} for r in ROUTES),
    {"text": "Every route tried.\nsealed"}]}]}
REPORT_LINE = re.compile(r"^(?P<route>[a-z0-9-]+) (?P<pid>\d+) (?P<comm>\S*): (?P<outcome>.*)$")


def channel_corpus(corpus: Path) -> Path:
    """A corpus with the channel probe and the attack script at tools/attack.py."""
    return hostile.corpus(corpus, PROBE, ATTACK, "attack.py")


def channel_plan_data(campaign: str) -> dict:
    """The plan as a user writes it (the real-node tier submits it with ``probe-runner submit``)."""
    return hostile.plan_data(campaign, PROBE)


def channel_plan(campaign: str):
    return parse_plan(channel_plan_data(campaign))


@pytest.fixture(scope="module")
def session(tmp_path_factory, claude_command):
    root = tmp_path_factory.mktemp("channel")
    corpus = channel_corpus(root / "corpus")
    plan = channel_plan("channel")
    store = FileStore(root / "store")
    with ScriptedProvider(SCENARIOS) as provider:
        settings = Settings(
            store=store.uri, provider={"base_url": provider.base_url, "api_key": SecretStr("test-key")},
            harness={"command": claude_command[0], "timeout_seconds": 120}, local={"workdir": root / "work"},
        )
        run_local(plan, corpus, store, settings, 1)
    run_transform(store, plan)
    keys = layout.SessionKeys("channel", PROBE["id"], "present-001")
    raw = store.get(keys.stream)
    lines = [json.loads(line) for line in raw.splitlines()]
    results = [b["content"] for o in lines if o.get("type") == "user"
               for b in o["message"]["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]
    reports = [m.groupdict() for text in results for line in (text if isinstance(text, str) else "").splitlines()
               if (m := REPORT_LINE.match(line))]
    return {"raw": raw, "lines": lines, "results": results, "reports": reports,
            "capture": json.loads(store.get(keys.capture)),
            "transcript": store.get(layout.transcript_key("channel", "regression", "present")).decode()}


def outcomes(session, route: str, comm: str | None = None) -> list[str]:
    return [r["outcome"] for r in session["reports"] if r["route"] == route and (comm is None or r["comm"] == comm)]


def test_no_forged_byte_reaches_the_stream(session):
    assert MARKER not in session["raw"]
    assert {o["type"] for o in session["lines"]} <= {"system", "assistant", "user", "result", "rate_limit_event"}


def test_the_session_ran_every_route_and_completed(session):
    assert len(session["results"]) == len(ROUTES), session["results"]
    assert {r["route"] for r in session["reports"]} == set(ROUTES)
    last = session["lines"][-1]
    assert last["type"] == "result" and last["subtype"] == "success" and not last["is_error"]
    assert session["capture"]["exit_code"] == 0


def test_the_harness_refuses_every_route(session):
    # The harness (comm "claude") is the session's ancestor and holds the stream's socket.
    expected = {"reopen-fd1": "EACCES", "proc-mem": "EACCES",  # not dumpable: /proc refuses
                "pidfd-getfd": "EPERM", "ptrace": "EPERM", "vm-write": "EPERM"}  # seccomp (and the access check)
    for route, errno_name in expected.items():
        assert outcomes(session, route, "claude") == [errno_name], (route, session["reports"])
    # Run as root the listing is allowed and each open is refused; run as another user the
    # listing itself is ("fd directory EACCES"). Either way EACCES is the only outcome.
    fds = outcomes(session, "any-fd", "claude")
    assert len(fds) == 1 and set(re.findall(r"\b[A-Z]{4,}\b", fds[0])) == {"EACCES"}, fds


def test_no_process_of_the_sandbox_yields_a_writable_descriptor(session):
    for route in ("reopen-fd1", "any-fd", "pidfd-getfd", "ptrace", "vm-write", "proc-mem"):
        for outcome in outcomes(session, route):
            assert not re.search(r"WROTE|ATTACHED|OPEN", outcome), (route, outcome)


def test_seccomp_refuses_the_calls_where_no_access_check_would(session):
    assert outcomes(session, "controls") == ["pidfd_getfd(self) EPERM", "process_vm_writev(self) EPERM",
                                             "ptrace(TRACEME) EPERM", "Seccomp:\t2"]


def test_the_driver_and_bwrap_are_out_of_sight(session):
    visible = {r["pid"]: r["outcome"] for r in session["reports"] if r["route"] == "processes"}
    assert visible["1"].startswith("/bin/sh -c "), visible  # the first process is ours, not bwrap's init
    # Only the sandbox's own processes: no bwrap, and no driver (a Python process other than the attacker).
    programs = {cmd.split()[0] for cmd in visible.values()}
    assert programs <= {"/bin/sh", "/run/probe-harness/claude", "/bin/bash", "python3"}, visible
    assert sum(cmd.startswith("python3 ") for cmd in visible.values()) == 1, visible


def test_the_transcript_states_the_closed_routes(session):
    text = " ".join(session["transcript"].split())
    for sentence in (
        "one end of a Unix socket pair whose other end only the driver held",
        "Reopening /proc/PID/fd/1 of the harness or of any other ancestor was closed twice",
        "Writing another process's descriptors found under /proc/*/fd was closed",
        "Writing /proc/PID/mem of the harness was closed by the kernel's ptrace access check",
        "ptrace, process_vm_writev, process_vm_readv and pidfd_getfd were closed by a seccomp filter",
    ):
        assert sentence in text, sentence


def test_a_sandbox_in_which_the_harness_would_be_dumpable_is_refused(monkeypatch, tmp_path, claude_command):
    # With a readable loader (0555 instead of 0111) execve() would leave the harness dumpable and
    # its /proc/PID/mem open; the sandbox's first process refuses to go on.
    real = local.bwrap_args

    def readable_loader(*args):
        argv = real(*args)
        argv[argv.index("--perms") + 1] = "0555"
        return argv

    monkeypatch.setattr(local, "bwrap_args", readable_loader)
    executor = LocalExecutor(Settings(store=f"file://{tmp_path}/store", provider={"api_key": SecretStr("k")},
                                      harness={"command": claude_command[0]}, local={"workdir": tmp_path / "work"}))
    with pytest.raises(ConfinementError, match="would be dumpable"):
        executor.preflight()
