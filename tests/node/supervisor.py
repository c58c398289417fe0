"""The node's process supervisor: runs inside the node's network namespace and a private
mount namespace (started by realnode.py through nsenter + unshare), so that every mount the
kubelet and containerd make (overlay root filesystems, emptyDir tmpfs, pod network namespace
files) lives and dies with the node, never on the host.

Why a supervisor and not four Popen calls from pytest: the daemons must share one mount
namespace (the kubelet prepares volumes that containerd mounts into containers), and that
namespace is only this process's. It also keeps the kubelet's kernel tunables off the host:
the kubelet writes vm.overcommit_memory, kernel.panic and friends, which are not namespaced,
so files bound over them here take the writes.

Usage: python3 supervisor.py CONFIG.json   (stops its daemons on SIGTERM, in reverse order)
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# Host-wide sysctls the kubelet sets when protectKernelDefaults is false (kubelet's
# setupKernelTunables); bound over by files in this mount namespace.
KUBELET_TUNABLES = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic",
                    "kernel/panic_on_oops", "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes")


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def shield_host(state: Path) -> None:
    """Bind a private copy over each host-wide tunable, so the kubelet's writes stay here."""
    tunables = state / "sysctl"
    for name in KUBELET_TUNABLES:
        proc = Path("/proc/sys") / name
        copy = tunables / name
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(proc.read_text())
        _mount("--bind", str(copy), str(proc))


def main() -> int:
    config = json.loads(Path(sys.argv[1]).read_text())
    state = Path(config["state"])
    shield_host(state)
    # A /run of the node's own: containerd's pod network namespace files (/run/netns/cni-*),
    # runc's state (/run/containerd) and the iptables lock are files on the host's /run
    # otherwise, left there whenever a daemon dies before it removes them.
    _mount("-t", "tmpfs", "-o", "mode=0755,size=64m", "tmpfs", "/run")
    # Directories of the node's own at the paths daemons expect (the kubelet's root at
    # /var/lib/kubelet: gVisor's shim finds a pod's volumes there and nowhere else).
    for source, target in config.get("binds", []):
        Path(target).mkdir(parents=True, exist_ok=True)  # on the host: an empty mount point
        _mount("--bind", source, target)
    children: list[tuple[str, subprocess.Popen]] = []
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    def launch(daemon: dict) -> subprocess.Popen:
        log = open(daemon["log"], "ab")
        proc = subprocess.Popen(daemon["argv"], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=daemon["env"])
        children.append((daemon["name"], proc))
        print(f"supervisor: started {daemon['name']} pid {proc.pid}", flush=True)
        return proc

    # Daemons start in order; one with "start_when" waits for that file (the launcher writes
    # it, e.g. once the node is registered, which kube-router needs), one with
    # "wait_for_path" holds the next until that path exists (containerd's socket).
    pending = list(config["daemons"])
    failed = False
    while not stopping:
        if pending and (not pending[0].get("start_when") or os.path.exists(pending[0]["start_when"])):
            daemon = pending.pop(0)
            proc = launch(daemon)
            wait_for = daemon.get("wait_for_path")
            deadline = time.monotonic() + 60
            while wait_for and not os.path.exists(wait_for) and not stopping:
                if proc.poll() is not None or time.monotonic() > deadline:
                    print(f"supervisor: {daemon['name']} did not create {wait_for}", flush=True)
                    stopping = failed = True
                    break
                time.sleep(0.1)
            continue
        for name, proc in children:
            if proc.poll() is not None:
                # A node missing a daemon is broken: stop the rest so the launcher sees it.
                print(f"supervisor: {name} exited with {proc.returncode}; stopping", flush=True)
                stopping = failed = True
        time.sleep(0.2)
    for name, proc in reversed(children):
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        print(f"supervisor: stopped {name} ({proc.returncode})", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
