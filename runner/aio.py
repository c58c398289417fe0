"""The campaign's event loop: what its coroutines wait on, and how they hand blocking work to
threads.

A campaign's sessions mostly wait (for the budget, a slot, their pod to start, their harness to
end). A thread per session cost the controller about 0.2 MiB and its share of every wake-up
for each session running (2,000 threads at 2,000 at once, bench/scale.py); a coroutine waits
for a few kilobytes and no thread. What blocks (the ledger, the store, an exec, unpacking a
workspace) runs on the loop's bounded pool of threads (``blocking``), sized by the
``io_threads`` setting, never on the loop itself; what blocks for a whole session by its nature
(the local executor reaping its child process) runs on a thread of its own (``own_thread``), so
it never takes the pool's threads from the rest.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


async def blocking(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` on the running loop's pool of threads (the caller's context, so
    its log records name its session)."""
    return await asyncio.to_thread(fn, *args, **kwargs)


async def own_thread(fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` on a thread of its own, for work that blocks as long as a session
    runs: on the pool it would hold a thread every other session's work needs."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)

    def settle(value: T | None, error: BaseException | None) -> None:
        if done.cancelled():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(value)  # type: ignore[arg-type]  # None only with an error

    def run() -> None:
        try:
            value = call()
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine, which raises it
            loop.call_soon_threadsafe(settle, None, e)
        else:
            loop.call_soon_threadsafe(settle, value, None)

    threading.Thread(target=run, name=getattr(fn, "__name__", "blocking"), daemon=True).start()
    return await done


class Changed:
    """Wakes the coroutines waiting for a state that only code on the same loop changes (no
    lock: nothing runs between two awaits). Whoever changes it calls ``notify``."""

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[None]] = []

    def notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for f in waiters:
            if not f.done():
                f.set_result(None)

    async def wait_for(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        """Wait until ``predicate()`` is true (checked at each change), at most ``timeout``
        seconds (None: as long as it takes); returns its last value."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + max(timeout, 0.0)
        while not predicate():
            if deadline is not None and loop.time() >= deadline:
                return False
            f: asyncio.Future[None] = loop.create_future()
            self._waiters.append(f)
            try:
                async with asyncio.timeout_at(deadline):
                    await f
            except TimeoutError:
                return predicate()
            finally:
                if not f.done():
                    f.cancel()
                if f in self._waiters:
                    self._waiters.remove(f)
        return True
