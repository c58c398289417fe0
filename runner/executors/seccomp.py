"""The seccomp filter every process of a local session runs under (bwrap ``--seccomp FD``).

Why it exists: the harness's standard output is the one trusted account of a session, and the
session's own processes run beside the harness, under its uid and in its PID namespace. Four
system calls let one process write into, or take a descriptor from, another process it can
address: ``ptrace`` (attach, then poke memory or inject a ``write``), ``process_vm_writev``,
``process_vm_readv`` (the read half, which also serves an injection by finding its target) and
``pidfd_getfd`` (a copy of the harness's stdout descriptor). Each of them fails with EPERM here.
The kernel's ptrace access check stops the same calls once more, because the harness is not
dumpable (see ``local.py``); this filter does not depend on that, nor on Yama, which many
kernels (this repository's CI among them) do not have.

Why BPF assembled by hand: the program is ten instructions, and a dependency on libseccomp's
bindings (a Debian package for the system Python only) would outweigh it. What the program must
get right, and what ``tests/unit/test_seccomp.py`` checks in a child process:

* The architecture word comes first. A 64-bit x86 process can still enter the kernel through
  ``int 0x80`` with i386 numbers, where ``ptrace`` is 26 rather than 101; every call made
  through an ABI other than the native one fails with EPERM.
* x32 calls report the x86_64 architecture with bit 30 set in the number (``ptrace`` is
  ``0x40000000 + 521`` there); every such number fails with EPERM.

Nothing else is filtered, so the harness and every tool it starts run as before.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections.abc import Callable

BLOCKED = ("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd")

# Native syscall numbers (arch/x86/entry/syscalls/syscall_64.tbl; include/uapi/asm-generic/unistd.h).
_ARCHES = {
    "x86_64": (0xC000003E, {"ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "pidfd_getfd": 438}),
    "aarch64": (0xC00000B7, {"ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "pidfd_getfd": 438}),
}
_X32_SYSCALL_BIT = 0x40000000

# Classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h).
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_EPERM = 0x00050000 | errno.EPERM
_OFF_NR, _OFF_ARCH = 0, 4  # struct seccomp_data: int nr; __u32 arch; ...


class UnsupportedArchitecture(RuntimeError):
    pass


def _arch(machine: str) -> tuple[int, dict[str, int]]:
    try:
        return _ARCHES[machine]
    except KeyError:
        raise UnsupportedArchitecture(f"no seccomp filter is defined for {machine}") from None


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes:
    """The filter as an array of ``struct sock_filter``, the form bwrap's ``--seccomp`` reads."""
    machine = machine or os.uname().machine
    audit_arch, numbers = _arch(machine)
    checks = [numbers[name] for name in BLOCKED]
    # Layout: [ld arch][jeq arch][ld nr]([jge x32])[jeq nr]*n [ret allow][ret eperm]; a jump
    # offset counts the instructions it skips.
    x32 = machine == "x86_64"
    body = len(checks) + (1 if x32 else 0)
    out = [_insn(_LD_W_ABS, 0, 0, _OFF_ARCH),
           _insn(_JEQ_K, 0, body + 2, audit_arch),  # another ABI: jump to EPERM
           _insn(_LD_W_ABS, 0, 0, _OFF_NR)]
    remaining = body
    if x32:
        remaining -= 1
        out.append(_insn(_JGE_K, remaining + 1, 0, _X32_SYSCALL_BIT))
    for nr in checks:
        remaining -= 1
        out.append(_insn(_JEQ_K, remaining + 1, 0, nr))
    out += [_insn(_RET_K, 0, 0, _RET_ALLOW), _insn(_RET_K, 0, 0, _RET_EPERM)]
    return b"".join(out)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def install(prog: bytes) -> None:
    """Install ``prog`` on the calling thread and everything it starts, as bwrap does.

    For a process that starts the harness itself rather than through bwrap (the tests run the
    filter this way). no_new_privs comes first: the kernel refuses a filter from a process
    without CAP_SYS_ADMIN otherwise. Only the calling thread is filtered, so call it before the
    process starts threads or children.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    fprog = _SockFprog(len(prog) // 8, prog)
    steps: tuple[tuple[str, Callable[[], int]], ...] = (
        ("PR_SET_NO_NEW_PRIVS", lambda: libc.prctl(38, 1, 0, 0, 0)),
        ("PR_SET_SECCOMP", lambda: libc.prctl(22, 2, ctypes.byref(fprog), 0, 0)))  # mode FILTER
    for what, result in steps:
        if result() != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl({what}): {os.strerror(err)}")
