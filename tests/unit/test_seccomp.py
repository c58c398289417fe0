"""The seccomp filter of local sessions, installed in a child process exactly as bwrap installs it.

Each check runs the same calls twice, without and with the filter: the call must work (or
fail for a reason of its own) before, and fail with EPERM after, so a filter that blocked
nothing, or blocked the wrong number, fails here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from runner.executors import seccomp

# Runs in a child: optionally installs the filter (seccomp.install: no_new_privs, then
# SECCOMP_MODE_FILTER, as bwrap does), then makes each call and prints its outcome as JSON.
_CHILD = r"""
import ctypes, json, mmap, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
if sys.argv[1] == "filtered":
    from runner.executors import seccomp
    seccomp.install(seccomp.program("x86_64"))

def call(nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return "ok" if r >= 0 else os.strerror(ctypes.get_errno())

def errno_of(nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return 0 if r >= 0 else ctypes.get_errno()

buf = ctypes.create_string_buffer(b"x" * 8)
other = ctypes.create_string_buffer(8)
class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
local, remote = IoVec(ctypes.addressof(other), 8), IoVec(ctypes.addressof(buf), 8)
pid = os.getpid()
out = {}
out["process_vm_readv"] = call(310, pid, ctypes.addressof(local), 1, ctypes.addressof(remote), 1, 0)
out["process_vm_writev"] = call(311, pid, ctypes.addressof(local), 1, ctypes.addressof(remote), 1, 0)
pidfd = os.pidfd_open(pid)
out["pidfd_getfd"] = call(438, pidfd, 0, 0)
child = os.fork()
if child == 0:
    os._exit(errno_of(101, 0, 0, 0, 0))                              # PTRACE_TRACEME
code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
out["ptrace"] = "ok" if code == 0 else os.strerror(code)
out["x32 getpid"] = call(0x40000000 | 39)
# i386 getpid (20) through int 0x80: mov eax, 20; int 0x80; ret
page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(bytes([0xB8, 20, 0, 0, 0, 0xCD, 0x80, 0xC3]))
fn = ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(page)))
r = fn()
out["i386 getpid"] = "ok" if r == pid else os.strerror(-r) if r < 0 else str(r)
out["getpid"] = call(39)
out["write"] = "ok" if os.write(1, b"") == 0 else "failed"
print(json.dumps(out))
"""


def _run(mode: str) -> dict[str, str]:
    # The probes are x86_64 machine code and syscall numbers; CI runs on x86_64. Elsewhere the
    # filter is unproven here, which is a failure, not a pass.
    assert os.uname().machine == "x86_64", f"the seccomp probes need an x86_64 host, not {os.uname().machine}"
    done = subprocess.run([sys.executable, "-c", _CHILD, mode], capture_output=True, timeout=30,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)


def test_the_blocked_calls_fail_with_eperm_and_nothing_else_changes():
    before, after = _run("plain"), _run("filtered")
    for name in seccomp.BLOCKED:
        assert before[name] == "ok", (name, before)
        assert after[name] == os.strerror(1), (name, after)
    assert before["getpid"] == after["getpid"] == "ok"
    assert after["write"] == "ok"


def test_other_abis_are_closed():
    before, after = _run("plain"), _run("filtered")
    # x32 (bit 30 set) and i386 (int 0x80) numbers: EPERM from the filter, whatever the kernel
    # says without it (a kernel built without x32 says ENOSYS).
    assert after["x32 getpid"] == os.strerror(1), before["x32 getpid"]
    # The CI kernel runs i386 calls, so the route is real there and the filter must close it.
    assert before["i386 getpid"] == "ok", f"this kernel runs no i386 calls ({before['i386 getpid']}): the route is unproven"
    assert after["i386 getpid"] == os.strerror(1)


def test_the_program_checks_the_architecture_first():
    prog = seccomp.program("aarch64")
    insns = [prog[i:i + 8] for i in range(0, len(prog), 8)]
    assert len(insns) == 2 + 1 + len(seccomp.BLOCKED) + 2  # no x32 check outside x86_64
    with pytest.raises(seccomp.UnsupportedArchitecture):
        seccomp.program("riscv64")
