"""The rule the harness's entry point starts the CLI by (runner/entrypoints/pod.py,
``unconfined_because``): the CLI may start only if its descendants will be refused its memory
and its stream, either because its ELF loader is execute-only (runc: the CLI is non-dumpable)
or because Yama's relational scope (or stricter) is in force and a probe against a dumpable
entry point was refused both routes (gVisor)."""

from __future__ import annotations

import itertools

import pytest

from runner.entrypoints.pod import StreamProbe, unconfined_because

READABLE = "its ELF loader /lib64/ld-linux-x86-64.so.2 is readable"
DUMPABLE = f"{READABLE}, so the CLI would run dumpable; and "
GVISOR = StreamProbe(entry_dumpable=True, mem="EACCES", stream="ENXIO")  # measured under runsc (docs/security.md)

CASES = [
    # (a): an execute-only loader is enough, whatever Yama and the probe say
    (None, None, StreamProbe(True, "OPEN", "OPEN"), None),
    (None, 0, StreamProbe(True, "OPEN", "ENXIO"), None),
    (None, 1, StreamProbe(False, "EACCES", "EACCES"), None),
    # (b): relational or stricter, refused by a dumpable entry point
    (READABLE, 1, GVISOR, None),
    (READABLE, 2, StreamProbe(True, "EPERM", "EACCES"), None),
    (READABLE, 3, StreamProbe(True, "EACCES", "EPERM"), None),
    # neither
    (READABLE, None, GVISOR, DUMPABLE + "the kernel has no Yama (no /proc/sys/kernel/yama/ptrace_scope)"),
    (READABLE, 0, GVISOR, DUMPABLE + "Yama's ptrace_scope is 0, so a descendant may open the CLI's memory"),
    (READABLE, 1, StreamProbe(False, "EACCES", "EACCES"),
     DUMPABLE + "Yama's ptrace_scope is 1 but the probe ran against a non-dumpable entry point, so its refusals do "
                "not show that Yama keeps the session out of a dumpable CLI"),
    (READABLE, 1, StreamProbe(True, "OPEN", "ENXIO"),
     DUMPABLE + "Yama's ptrace_scope is 1 but a child of the entry point was not refused its /proc/PID/mem (OPEN)"),
    (READABLE, 1, StreamProbe(True, "EACCES", "OPEN"),
     DUMPABLE + "Yama's ptrace_scope is 1 but a child of the entry point was not refused its stream through "
                "/proc/PID/fd (OPEN)"),
    (READABLE, 2, StreamProbe(True, "no answer", "no answer"),
     DUMPABLE + "Yama's ptrace_scope is 2 but a child of the entry point was not refused its /proc/PID/mem "
                "(no answer) nor its stream through /proc/PID/fd (no answer)"),
    # ENOENT is no refusal: the probe did not reach the process (no /proc, another PID namespace)
    (READABLE, 1, StreamProbe(True, "ENOENT", "ENXIO"),
     DUMPABLE + "Yama's ptrace_scope is 1 but a child of the entry point was not refused its /proc/PID/mem (ENOENT)"),
    ("the harness /x names no dynamic loader (a static binary); it could not be made non-dumpable", None, GVISOR,
     "the harness /x names no dynamic loader (a static binary); it could not be made non-dumpable, so the CLI would "
     "run dumpable; and the kernel has no Yama (no /proc/sys/kernel/yama/ptrace_scope)"),
]


@pytest.mark.parametrize(("loader", "yama", "probe", "expected"), CASES)
def test_each_condition_and_the_message_that_names_the_one_that_failed(loader, yama, probe, expected):
    assert unconfined_because(loader, yama, probe) == expected


LOADERS = (None, READABLE)
SCOPES = (None, 0, 1, 2, 3)
MEM = ("OPEN", "EACCES", "EPERM", "ENOENT", "no answer")
STREAM = ("OPEN", "ENXIO", "EACCES", "EPERM", "ENOENT", "no answer")


def test_every_combination_starts_the_cli_exactly_where_a_condition_holds():
    allowed = {(loader, yama, StreamProbe(dumpable, mem, stream))
               for loader, yama, dumpable, mem, stream in itertools.product(LOADERS, SCOPES, (True, False), MEM, STREAM)
               if unconfined_because(loader, yama, StreamProbe(dumpable, mem, stream)) is None}
    by_loader = {(None, yama, StreamProbe(d, m, s)) for yama, d, m, s in itertools.product(SCOPES, (True, False), MEM, STREAM)}
    by_yama = {(READABLE, yama, StreamProbe(True, m, s))
               for yama in (1, 2, 3) for m in ("EACCES", "EPERM") for s in ("ENXIO", "EACCES", "EPERM")}
    assert len(by_loader) == 300 and len(by_yama) == 18
    assert allowed == by_loader | by_yama
