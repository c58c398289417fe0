"""Named points in a session's life where the tests act: tests/faults.py runs the CLI with
:func:`stage` replaced by a SIGKILL at one of them, to show that nothing the harness emitted is
lost and no session runs twice. In the product :func:`stage` does nothing, and no setting,
flag or variable changes that: it is a seam for tests, not a feature.

Stages, in the order a session passes them:

- ``before-intent``: nothing of the session is journaled yet.
- ``after-intent``: its intent is journaled, its start is not.
- ``mid-stream``: the harness runs and the first bytes of its stream were handed to the store.
- ``stream-stored``: the stream is committed and verified; artifacts and the capture record are not.
- ``before-outcome``: everything is stored; the outcome is not journaled.
"""

from __future__ import annotations

STAGES = ("before-intent", "after-intent", "mid-stream", "stream-stored", "before-outcome")


def stage(name: str, **facts: object) -> None:
    """A session reached ``name`` (one of STAGES); ``facts`` are what a test may compare
    (e.g. how many stream bytes the store had accepted). Callers call it through the module
    (``hooks.stage``), so that a test's replacement is the one called."""
