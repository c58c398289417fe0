"""Test-only fault injection: SIGKILL the runner at a named point of a session.

Why this exists: the fault tests must kill the runner at an exact stage (after the intent is
journaled, in the middle of the stream, ...) and a timer or an outside ``kill`` cannot hit a
window of a few milliseconds deterministically. The runner therefore calls
:func:`kill_point` at each stage; it does nothing unless BOTH variables are set::

    RUNNER_TEST_FAULTS=1 RUNNER_TEST_KILL_AT=<stage>

so no setting, flag or single stray variable can trigger it. It is not a feature: nothing
else reads these variables, and the settings (prefix ``RUNNER_``) ignore them.

Stages, in the order a session passes them:

- ``before-intent``: nothing of the session is journaled yet.
- ``after-intent``: its intent is journaled, its start is not.
- ``mid-stream``: the harness runs and the first bytes of its stream were handed to the store.
- ``stream-stored``: the stream is committed and verified; artifacts and the capture record are not.
- ``before-outcome``: everything is stored; the outcome is not journaled.

Before it kills, it prints one line to stderr, ``fault-injection: SIGKILL at <stage>`` plus
the facts the test compares against (e.g. how many stream bytes the store had accepted).
"""

from __future__ import annotations

import os
import signal
import sys

STAGES = ("before-intent", "after-intent", "mid-stream", "stream-stored", "before-outcome")


def kill_point(stage: str, **facts: object) -> None:
    """SIGKILL this process if the test environment asks for ``stage``; otherwise nothing."""
    if os.environ.get("RUNNER_TEST_FAULTS") != "1":
        return
    wanted = os.environ.get("RUNNER_TEST_KILL_AT", "")
    if wanted not in STAGES or stage not in STAGES:  # a typo must fail the test, not pass it unkilled
        raise RuntimeError(f"RUNNER_TEST_KILL_AT={wanted!r}, kill_point({stage!r}): stages are {', '.join(STAGES)}")
    if wanted != stage:
        return
    said = " ".join(f"{k}={v}" for k, v in facts.items())
    print(f"fault-injection: SIGKILL at {stage} {said}".rstrip(), file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
