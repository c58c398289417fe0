"""A command run on a pseudo-terminal, as a user's shell runs it, for the tests of what the
CLI draws there (the live board)."""

from __future__ import annotations

import os
import pty
import re
import subprocess

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def on_a_terminal(argv: list[str], env: dict[str, str], timeout: float = 300) -> tuple[int, str]:
    """Run argv with its stdout and stderr on a pty; its exit status and what it drew, without
    the escapes."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, env=env, stdout=slave, stderr=slave, stdin=subprocess.DEVNULL)
    os.close(slave)
    drawn = b""
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # the last writer closed the terminal
            break
        if not chunk:
            break
        drawn += chunk
    os.close(master)
    return proc.wait(timeout=timeout), ANSI.sub("", drawn.decode(errors="replace"))
