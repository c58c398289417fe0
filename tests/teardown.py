"""Teardown that also runs on SIGTERM, for the tiers that start processes of their own (the
control plane of tests/cluster/, the node of tests/node/) and the benches that start them.

pytest tears fixtures down on Ctrl-C, not on SIGTERM (a CI timeout, ``kill``): inside
:func:`sigterm_as_interrupt` a SIGTERM raises KeyboardInterrupt, so the ``finally`` blocks
that stop those processes still run."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Unless a SIGTERM handler is set already (then it is left alone), SIGTERM raises
    KeyboardInterrupt until the block ends; the default comes back after."""
    old = signal.getsignal(signal.SIGTERM)
    if old not in (signal.SIG_DFL, None):
        yield
        return

    def _on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)
