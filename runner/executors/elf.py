"""The ELF loader an executable names: the handle by which a harness is made non-dumpable.

execve() leaves a process non-dumpable when the ELF loader it is started through is not
readable by it, and a non-dumpable process's /proc/PID/fd and /proc/PID/mem are closed to a
session that holds no capability. Both executors rely on that (runner/executors/local.py binds
the loader execute-only into the sandbox; the harness image makes it execute-only and
runner/entrypoints/pod.py checks it). Standard library only: the pod entry points import it.
"""

from __future__ import annotations

import os
import struct

from runner.errors import ConfinementError


def elf_loader(path: str) -> str:
    """The dynamic loader (PT_INTERP) an ELF executable names, resolved on the host.

    The harness is made non-dumpable through its loader (see above), so a
    harness without one (a static binary, or a script) cannot be confined here.
    """
    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2:
            raise ConfinementError(f"the harness {path} is not a 64-bit ELF executable; it could not be made non-dumpable")
        order = "<" if head[5] == 1 else ">"
        phoff, = struct.unpack_from(order + "Q", head, 0x20)
        phentsize, phnum = struct.unpack_from(order + "HH", head, 0x36)
        for i in range(phnum):
            f.seek(phoff + i * phentsize)
            p_type, _, p_offset, _, _, p_filesz = struct.unpack(order + "IIQQQQ", f.read(40))
            if p_type == 3:  # PT_INTERP
                f.seek(p_offset)
                return os.path.realpath(f.read(p_filesz).rstrip(b"\0").decode())
    raise ConfinementError(f"the harness {path} names no dynamic loader (a static binary); it could not be made non-dumpable")
