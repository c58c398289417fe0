"""Stands in for the Claude Code CLI under the harness's entry point (tests/support/harness_driver.py):
its standard output is the stream. It states its pid and whether it is dumpable, then runs each
of tests/integration/channel_attack.py's routes as the CLI's Bash tool would (a shell, its output
a pipe the CLI reads), so the attacks run as the CLI's descendants against it and the entry
point, and passes each report line on as a JSON line of the stream."""

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

ATTACK = Path(__file__).resolve().parents[1] / "integration" / "channel_attack.py"
ROUTES = ["reopen-fd1", "any-fd", "pidfd-getfd", "ptrace", "vm-write", "proc-mem", "controls"]

if __name__ == "__main__":
    dumpable = ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
    print(json.dumps({"cli": os.getpid(), "entry_point": os.getppid(), "dumpable": dumpable}), flush=True)
    for route in ROUTES:
        out = subprocess.run(["/bin/sh", "-c", f'"$0" "$1" {route}', sys.executable, str(ATTACK)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120, check=False)
        for line in out.stdout.splitlines():
            print(json.dumps({"route": route, "line": line}), flush=True)
