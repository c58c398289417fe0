"""A session's attempts to write into the recorder's channel (run by the Bash calls of test_channel).

``python3 channel_attack.py ROUTE`` tries one route against every ancestor of its own process
(the Bash tool's shell, the harness, the sandbox's first process) and prints one line per
attempt: ``ROUTE PID COMM: OUTCOME``, where OUTCOME is an errno name when the route was
refused, or WROTE / ATTACHED / OPEN when it was not. Wherever a route yields a descriptor or
a process to write through, it writes a forged stream-json line carrying a marker, so a hole
shows up in the captured stream as well as in the outcome. The marker is built at run time
and never printed, so it cannot reach the stream as the text of a call or of a tool result.

Routes: ``reopen-fd1`` (open /proc/PID/fd/1 of each ancestor for writing), ``any-fd`` (open
and write every descriptor under /proc/*/fd of any other process), ``pidfd-getfd`` (copy fd 1
out of each ancestor), ``ptrace`` (attach, then inject write(1, line) into the tracee),
``vm-write`` (process_vm_writev), ``proc-mem`` (open /proc/PID/mem for writing),
``controls`` (the same calls against this process itself, where no ptrace access check
applies, so only seccomp can refuse them), and ``processes`` (every process the session can
see, by its command line).
"""

import ctypes
import errno
import os
import sys

MARK = "FORGED" + "-MARKER-" + sys.argv[1]
LINE = ('{"type":"forged","marker":"%s"}\n' % MARK).encode()
SYS_PTRACE, SYS_PROCESS_VM_READV, SYS_PROCESS_VM_WRITEV, SYS_PIDFD_GETFD = 101, 310, 311, 438
PTRACE_TRACEME, PTRACE_PEEKTEXT, PTRACE_POKEDATA, PTRACE_GETREGS, PTRACE_SETREGS = 0, 1, 5, 12, 13
PTRACE_ATTACH, PTRACE_DETACH, PTRACE_SINGLESTEP = 16, 17, 9

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
MINE = {(st.st_dev, st.st_ino) for st in (os.fstat(1), os.fstat(2))}  # this call's own output


def syscall(nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return r if r >= 0 else -ctypes.get_errno()


def name(err):
    return errno.errorcode.get(abs(err), str(err))


def report(route, pid, outcome):
    try:
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().strip()
    except OSError:
        comm = "?"
    print(f"{route} {pid} {comm}: {outcome}", flush=True)


def ancestors():
    pid = os.getppid()
    while pid > 0:
        yield pid
        with open(f"/proc/{pid}/status") as f:
            pid = next(int(line.split()[1]) for line in f if line.startswith("PPid:"))


def write_through(fd):
    """Write the forged line to fd unless fd is this call's own output (a tool result)."""
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) in MINE:
        return "own output, not written"
    try:
        os.write(fd, LINE)
        return "WROTE"
    except OSError as e:
        return f"open, write {name(e.errno)}"


def reopen_fd1():
    for pid in ancestors():
        try:
            fd = os.open(f"/proc/{pid}/fd/1", os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError as e:
            report("reopen-fd1", pid, name(e.errno))
            continue
        try:
            report("reopen-fd1", pid, write_through(fd))
        finally:
            os.close(fd)


def any_fd():
    for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
        if pid == os.getpid():
            continue
        try:
            entries = os.listdir(f"/proc/{pid}/fd")
        except OSError as e:
            report("any-fd", pid, f"fd directory {name(e.errno)}")
            continue
        outcomes = []
        for n in sorted(entries, key=int):
            try:
                fd = os.open(f"/proc/{pid}/fd/{n}", os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_NOCTTY)
            except OSError as e:
                outcomes.append(f"{n}={name(e.errno)}")
                continue
            try:
                outcomes.append(f"{n}={write_through(fd)}")
            finally:
                os.close(fd)
        report("any-fd", pid, ", ".join(outcomes) or "no descriptors")


def pidfd_getfd():
    for pid in ancestors():
        try:
            pidfd = os.pidfd_open(pid)
        except OSError as e:
            report("pidfd-getfd", pid, f"pidfd_open {name(e.errno)}")
            continue
        fd = syscall(SYS_PIDFD_GETFD, pidfd, 1, 0)
        os.close(pidfd)
        if fd < 0:
            report("pidfd-getfd", pid, name(fd))
            continue
        try:
            report("pidfd-getfd", pid, write_through(fd))
        finally:
            os.close(fd)


class Regs(ctypes.Structure):
    _fields_ = [(n, ctypes.c_ulonglong) for n in (
        "r15 r14 r13 r12 rbp rbx r11 r10 r9 r8 rax rcx rdx rsi rdi orig_rax rip cs eflags rsp ss "
        "fs_base gs_base ds es fs gs").split()]


def ptrace(req, pid, addr=0, data=0):
    return syscall(SYS_PTRACE, req, pid, addr, data)


def inject_write(pid):
    """With the tracee stopped in a system call, run write(1, LINE) through its own syscall instruction."""
    os.waitpid(pid, 0x40000000)  # __WALL
    try:
        st = os.stat(f"/proc/{pid}/fd/1")
        if (st.st_dev, st.st_ino) in MINE:
            return "ATTACHED (its fd 1 is this call's own output; nothing injected)"
    except OSError:
        pass
    saved = Regs()
    ptrace(PTRACE_GETREGS, pid, 0, ctypes.addressof(saved))
    word = ctypes.c_ulong()
    ptrace(PTRACE_PEEKTEXT, pid, saved.rip - 2, ctypes.addressof(word))  # the raw call stores the word at data
    if word.value & 0xFFFF != 0x050F:
        return "ATTACHED (not stopped in a syscall; nothing injected)"
    buf = (saved.rsp - 8192) & ~0xF
    data = LINE + b"\0" * (-len(LINE) % 8)
    for i in range(0, len(data), 8):
        ptrace(PTRACE_POKEDATA, pid, buf + i, int.from_bytes(data[i:i + 8], "little", signed=True))
    regs = Regs.from_buffer_copy(saved)
    regs.rax, regs.rdi, regs.rsi, regs.rdx = 1, 1, buf, len(LINE)
    regs.orig_rax, regs.rip = 2**64 - 1, saved.rip - 2
    ptrace(PTRACE_SETREGS, pid, 0, ctypes.addressof(regs))
    ptrace(PTRACE_SINGLESTEP, pid)
    os.waitpid(pid, 0x40000000)
    ptrace(PTRACE_SETREGS, pid, 0, ctypes.addressof(saved))
    return "ATTACHED, write injected"


def ptrace_route():
    for pid in ancestors():
        r = ptrace(PTRACE_ATTACH, pid)
        if r < 0:
            report("ptrace", pid, name(r))
            continue
        try:
            report("ptrace", pid, inject_write(pid))
        finally:
            ptrace(PTRACE_DETACH, pid)


class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def vm_write():
    for pid in ancestors():
        # Read 8 bytes of a writable mapping and write the same bytes back: the route is open
        # exactly when both succeed, and the tracee is left as it was.
        try:
            with open(f"/proc/{pid}/maps") as f:
                addr = next(int(line.split("-")[0], 16) for line in f if line.split()[1].startswith("rw"))
        except OSError:
            addr = 0x10000  # unknown: an access check that passed would then say EFAULT
        buf = ctypes.create_string_buffer(8)
        local, remote = IoVec(ctypes.addressof(buf), 8), IoVec(addr, 8)
        r = syscall(SYS_PROCESS_VM_READV, pid, ctypes.addressof(local), 1, ctypes.addressof(remote), 1, 0)
        if r >= 0:
            r = syscall(SYS_PROCESS_VM_WRITEV, pid, ctypes.addressof(local), 1, ctypes.addressof(remote), 1, 0)
        else:
            w = syscall(SYS_PROCESS_VM_WRITEV, pid, ctypes.addressof(local), 1, ctypes.addressof(remote), 1, 0)
            r = w if w < 0 else r
        report("vm-write", pid, "OPEN" if r >= 0 else ("OPEN (access granted, EFAULT)" if r == -errno.EFAULT else name(r)))


def proc_mem():
    for pid in ancestors():
        try:
            fd = os.open(f"/proc/{pid}/mem", os.O_RDWR)
        except OSError as e:
            report("proc-mem", pid, name(e.errno))
            continue
        os.close(fd)
        report("proc-mem", pid, "OPEN")


def controls():
    """The calls against this very process: no ptrace access check stands in the way, only seccomp."""
    me = os.getpid()
    try:
        pidfd = os.pidfd_open(me)
    except OSError as e:  # gVisor has no pidfd_open (ENOSYS): nothing to take a descriptor through
        report("controls", me, f"pidfd_getfd(self) pidfd_open {name(e.errno)}")
    else:
        r = syscall(SYS_PIDFD_GETFD, pidfd, 1, 0)
        os.close(pidfd)
        report("controls", me, f"pidfd_getfd(self) {'OPEN' if r >= 0 else name(r)}")
    buf = ctypes.create_string_buffer(8)
    iov = IoVec(ctypes.addressof(buf), 8)
    r = syscall(SYS_PROCESS_VM_WRITEV, me, ctypes.addressof(iov), 1, ctypes.addressof(iov), 1, 0)
    report("controls", me, f"process_vm_writev(self) {'OPEN' if r >= 0 else name(r)}")
    child = os.fork()
    if child == 0:
        os._exit(-min(ptrace(PTRACE_TRACEME, 0), 0))
    code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
    report("controls", me, f"ptrace(TRACEME) {'OPEN' if code == 0 else name(code)}")
    with open("/proc/self/status") as f:
        report("controls", me, next(line.strip() for line in f if line.startswith("Seccomp:")))


def processes():
    for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError as e:
            cmd = name(e.errno)
        report("processes", pid, cmd[:120])


ROUTES = {"reopen-fd1": reopen_fd1, "any-fd": any_fd, "pidfd-getfd": pidfd_getfd, "ptrace": ptrace_route,
          "vm-write": vm_write, "proc-mem": proc_mem, "controls": controls, "processes": processes}

if __name__ == "__main__":
    ROUTES[sys.argv[1]]()
