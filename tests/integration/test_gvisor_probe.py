"""The harness entry point under gVisor (issue 31, item 4), with ``runsc --network=none do``:
the host's root filesystem read-only in a sandbox with gVisor's own kernel (the Sentry), as
root, so the driver plays the pod (tests/support/harness_driver.py) inside it.

gVisor cannot make the CLI non-dumpable (its loader needs read permission on the ELF loader, and
it leaves every process dumpable after exec), so the entry point starts the CLI there by
condition (b): the Sentry applies Yama's relational scope (ptrace_scope 1, its default) to
ptrace, process_vm_writev and /proc/PID/mem, and a socket cannot be reopened through /proc.
Shown here: the probe's outcomes, and a dumpable CLI whose descendants try every route of
channel_attack.py against it and the entry point, each refused with the errno measured, and no
forged byte in the stream. runsc comes from tests/node/build-gvisor.sh (cached; built when
missing, never skipped)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.builds import GVISOR
from tests.support.harness_driver import reports

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "tests" / "support" / "harness_driver.py"
PYTHON = "/usr/bin/python3"  # the host's, seen inside the sandbox at the same path


@pytest.fixture(scope="module")
def runsc() -> Path:
    if os.geteuid() != 0:  # runsc do needs root; .ci/run runs as root
        pytest.fail("runsc do needs root: run the tests as root (as .ci/run does)", pytrace=False)
    return GVISOR.built() / "runsc"


def _in_gvisor(runsc: Path, *args: str) -> dict:
    out = subprocess.run([str(runsc), "--network=none", "do", PYTHON, str(DRIVER), *args], capture_output=True,
                         text=True, timeout=300, check=False, stdin=subprocess.DEVNULL, cwd="/",
                         env={"PATH": os.environ["PATH"]})
    assert out.returncode == 0, (out.stdout, out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_gvisor_refuses_a_child_its_parents_memory_and_stream_dumpable_or_not(runsc):
    dumpable = _in_gvisor(runsc, "probe", PYTHON, "dumpable")
    assert dumpable["yama"] == 1, dumpable  # the Sentry's default: relational
    assert dumpable["probe"] == {"entry_dumpable": True, "mem": "EACCES", "stream": "ENXIO"}, dumpable
    # a fork in the Sentry costs tens of milliseconds (about 35 measured); the bound leaves room for a loaded machine
    assert dumpable["ms"] < 200, dumpable
    # gVisor's /proc/PID/fd ignores dumpability: the socket is refused by its kind alone
    non_dumpable = _in_gvisor(runsc, "probe", PYTHON, "non-dumpable")
    assert non_dumpable["probe"] == {"entry_dumpable": False, "mem": "EACCES", "stream": "ENXIO"}, non_dumpable


def test_under_gvisor_the_entry_point_starts_a_dumpable_cli_and_every_route_against_it_is_refused(runsc):
    result = _in_gvisor(runsc, "harness", PYTHON)
    assert result["exit"] == 0 and result["stderr"] == "", result  # the probe accepted: the CLI ran
    cli, found = reports(result["stream"])
    assert cli["dumpable"] == 1  # what runc's defence needs gVisor cannot give
    expected = {"reopen-fd1": "ENXIO",  # a socket: no reopening through /proc
                "pidfd-getfd": "pidfd_open ENOSYS",  # gVisor has no pidfd_open (and seccomp refuses pidfd_getfd)
                "ptrace": "EPERM", "vm-write": "EPERM",  # seccomp, and the Sentry's Yama
                "proc-mem": "EACCES"}  # the Sentry's Yama: the CLI is not the attacker's descendant
    # fd 0, the task's pipe (the entry point's, of the same uid, read to its end before any tool
    # runs), opens: gVisor checks no ptrace access on /proc/PID/fd. fd 1, the stream, does not.
    against_cli = {r["route"]: r["outcome"] for r in found if r["pid"] == str(cli["cli"])}
    assert against_cli == {**expected, "any-fd": "0=WROTE, 1=ENXIO, 2=EACCES, 3=own output, not written"}, found
    against_entry = {r["route"]: r["outcome"] for r in found if r["pid"] == str(cli["entry_point"])}
    # its stdin is /dev/null, as a pod's is; its stdout and stderr are the runtime's (root's) pipes
    assert against_entry == {**expected, "reopen-fd1": "EACCES", "any-fd": "0=WROTE, 1=EACCES, 2=EACCES"}, found
    assert [r["outcome"] for r in found if r["route"] == "controls"] == [
        "pidfd_getfd(self) pidfd_open ENOSYS", "process_vm_writev(self) EPERM", "ptrace(TRACEME) EPERM", "Seccomp:\t2"]
    for r in found:  # nothing anywhere attached, opened memory, or wrote but into a stdin (a pipe read out, /dev/null)
        if r["route"] != "any-fd":
            assert not re.search(r"WROTE|ATTACHED|OPEN", r["outcome"]), r
        else:
            assert all(entry.startswith("0=") for entry in re.findall(r"\d+=WROTE", r["outcome"])), r
    assert "FORGED" not in result["stream"]
