"""The harness entry point's stream probe and start rule on this host's kernel (the runc case):
runner/entrypoints/pod.py ``probe_stream`` and ``harness``, as real processes under the
harness's uid with the seccomp filter installed (tests/support/harness_driver.py).

This host's /proc/sys/kernel/yama/ptrace_scope decides what a dumpable entry point is refused:
the CI machine has no Yama at all (the file is absent), where /proc/PID/mem of a dumpable
process of the same uid opens, so the entry point must refuse a CLI whose loader is readable;
a kernel with Yama's relational scope refuses it, so the entry point starts the CLI. Each test
reads the file and expects the kernel's documented behaviour for it, and the non-dumpable case
holds whatever it says."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runner.entrypoints import pod
from tests.support.harness_driver import reports

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "tests" / "support" / "harness_driver.py"
PYTHON = "/usr/bin/python3"  # readable by the harness's uid (a pyenv under /root is not)


def _driver(*args: str) -> dict:
    if os.geteuid() != 0:  # .ci/run runs as root; a run that cannot play the harness's uid proves nothing here
        pytest.fail("this test plays the harness's uid with setpriv: run the tests as root (as .ci/run does)", pytrace=False)
    if not os.access(PYTHON, os.X_OK):
        pytest.fail(f"{PYTHON} is needed to run the entry point under the harness's uid", pytrace=False)
    out = subprocess.run([sys.executable, str(DRIVER), *args], capture_output=True, text=True, timeout=300, check=False,
                         env={"PATH": os.environ["PATH"]})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_child_is_refused_both_routes_against_a_non_dumpable_entry_point_whatever_yama_says():
    result = _driver("probe", PYTHON, "non-dumpable")
    assert result["probe"] == {"entry_dumpable": False, "mem": "EACCES", "stream": "EACCES"}, result
    assert result["ms"] < 50, result


def test_against_a_dumpable_entry_point_the_memory_is_refused_exactly_where_yama_is_relational():
    result = _driver("probe", PYTHON, "dumpable")
    scope = pod.yama_scope()
    assert result["yama"] == scope
    # the socket is refused by its kind (ENXIO) whoever asks; the memory only by Yama's scope 1 or more
    assert result["probe"] == {"entry_dumpable": True, "mem": "EACCES" if scope and scope >= 1 else "OPEN",
                               "stream": "ENXIO"}, result
    assert result["ms"] < 50, result


def test_the_entry_point_starts_a_cli_with_a_readable_loader_only_where_yama_keeps_the_session_out():
    """The CLI here is tests/support/attacking_cli.py under this host's python3, whose loader is
    readable (condition (a) fails). Without Yama the entry point refuses before it runs and says
    which conditions failed; with it, it runs, and every route against it is refused."""
    result = _driver("harness", PYTHON)
    scope = pod.yama_scope()
    if not scope:
        assert result["exit"] == pod.UNCONFINED_EXIT and result["stream"] == "", result
        loader = os.path.realpath("/lib64/ld-linux-x86-64.so.2")
        why = ("the kernel has no Yama (no /proc/sys/kernel/yama/ptrace_scope)" if scope is None
               else "Yama's ptrace_scope is 0, so a descendant may open the CLI's memory")
        assert result["stderr"] == (f"probe harness: refused: the session could write into the CLI's stream: its ELF loader "
                                    f"{loader} is readable, so the CLI would run dumpable; and {why}\n")
        return
    assert result["exit"] == 0 and result["stderr"] == "", result
    cli, found = reports(result["stream"])
    assert cli["dumpable"] == 1
    against_cli = {r["route"]: r["outcome"] for r in found if r["pid"] == str(cli["cli"])}
    assert against_cli == {"reopen-fd1": "ENXIO", "any-fd": "0=WROTE, 1=ENXIO, 2=EACCES, 3=own output, not written",
                           "pidfd-getfd": "EPERM", "ptrace": "EPERM", "vm-write": "EPERM", "proc-mem": "EACCES"}
    assert "FORGED" not in result["stream"]
