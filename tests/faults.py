"""Run probe-runner's CLI with a SIGKILL at one stage of a session (runner/hooks.py):

    python tests/faults.py STAGE ARGS...      # ARGS as for probe-runner

The fault tests must kill the runner at an exact stage (after the intent is journaled, in the
middle of the stream, ...); a timer or an outside ``kill`` cannot hit a window of a few
milliseconds deterministically. Before it kills, it prints one line to stderr,
``fault-injection: SIGKILL at <stage>`` plus the facts the product passed (e.g. how many stream
bytes the store had accepted), for the test to compare against.
"""

from __future__ import annotations

import os
import signal
import sys

from runner import hooks
from runner.cli import main


def kill_at(wanted: str) -> None:
    """Replace hooks.stage by one that SIGKILLs this process at ``wanted``."""
    if wanted not in hooks.STAGES:  # a typo must fail the test, not pass it unkilled
        raise SystemExit(f"faults.py: no stage {wanted!r}; stages are {', '.join(hooks.STAGES)}")

    def stage(name: str, **facts: object) -> None:
        if name not in hooks.STAGES:
            raise RuntimeError(f"hooks.stage({name!r}): stages are {', '.join(hooks.STAGES)}")
        if name != wanted:
            return
        said = " ".join(f"{k}={v}" for k, v in facts.items())
        print(f"fault-injection: SIGKILL at {name} {said}".rstrip(), file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    hooks.stage = stage


if __name__ == "__main__":
    kill_at(sys.argv[1])
    sys.exit(main(sys.argv[2:]))
