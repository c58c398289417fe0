"""The campaign's slots (runner/executors/base.py): at most ``concurrency`` sessions hold one,
and a session whose start waits on the platform steps aside so another can run (issue 14,
item 8: "pending pods never hold the slots of running ones"). Sessions are coroutines of the
campaign's event loop (runner/aio.py), so each scenario is one loop's."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from runner.executors.base import Slots


def _run(scenario: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(scenario, 20))


def _taker(slots: Slots, entered: asyncio.Event, leave: asyncio.Event) -> asyncio.Task[None]:
    async def run() -> None:
        async with slots.take():
            entered.set()
            await leave.wait()

    return asyncio.create_task(run())


async def _set_within(event: asyncio.Event, seconds: float) -> bool:
    try:
        await asyncio.wait_for(event.wait(), seconds)
    except TimeoutError:
        return False
    return True


def test_a_slot_is_held_until_its_session_ends():
    async def scenario() -> None:
        slots = Slots(1)
        entered, leave = asyncio.Event(), asyncio.Event()
        async with slots.take() as slot:
            assert slot.held and slots.running == 1
            t = _taker(slots, entered, leave)
            assert not await _set_within(entered, 0.3), "a second session started while the only slot was held"
        assert await _set_within(entered, 5)
        leave.set()
        await t
        assert (slots.running, slots.waiting) == (0, 0)

    _run(scenario())


def test_a_waiting_session_steps_aside_and_another_starts():
    async def scenario() -> None:
        slots = Slots(1, waiting=1)
        entered, leave = asyncio.Event(), asyncio.Event()
        async with slots.take() as slot:
            t = _taker(slots, entered, leave)
            assert not await _set_within(entered, 0.2)
            assert slot.aside() and not slot.held
            assert await _set_within(entered, 5), "the slot stepped aside was not given to the next session"
            assert (slots.running, slots.waiting) == (1, 1)
            # Its pod now runs: it waits for the slot back, and gets it when the other ends.
            assert not await slot.back(0.2)
            leave.set()
            assert await slot.back(5) and slot.held
            assert (slots.running, slots.waiting) == (1, 0)
        await t
        assert (slots.running, slots.waiting) == (0, 0)

    _run(scenario())


def test_the_waiting_room_is_bounded():
    async def scenario() -> None:
        slots = Slots(2, waiting=1)
        async with slots.take() as a, slots.take() as b:
            assert a.aside()
            assert not b.aside(), "a second session stepped aside past the waiting room's size"
            assert b.held and (slots.running, slots.waiting) == (1, 1)
        assert (slots.running, slots.waiting) == (0, 0)

    _run(scenario())


def test_no_waiting_room_keeps_every_waiting_session_in_its_slot():
    async def scenario() -> None:
        slots = Slots(1, waiting=0)
        async with slots.take() as a:
            assert not a.aside() and a.held

    _run(scenario())


def test_a_session_coming_back_is_served_before_a_new_one():
    async def scenario() -> None:
        slots = Slots(1, waiting=1)
        order: list[str] = []
        async with slots.take() as a:
            assert a.aside()
            running, release = asyncio.Event(), asyncio.Event()
            t1 = _taker(slots, running, release)
            assert await _set_within(running, 5)

            async def back() -> None:
                await a.back(10)
                order.append("back")

            async def new() -> None:
                async with slots.take():
                    order.append("new")

            b = asyncio.create_task(back())
            await asyncio.sleep(0.2)  # a is waiting to come back before the new session asks
            t2 = asyncio.create_task(new())
            await asyncio.sleep(0.2)
            release.set()
            await b
            await t1
            assert order == ["back"], order
        await t2
        assert order == ["back", "new"]

    _run(scenario())


def test_an_adopted_session_is_followed_at_once_past_the_limit():
    async def scenario() -> None:
        slots = Slots(1)
        async with slots.take(), slots.take(force=True) as adopted:
            assert adopted.held and slots.running == 2
        assert slots.running == 0

    _run(scenario())


def test_a_session_may_wait_for_its_slot_as_long_as_it_takes():
    """back(None): no time limit. (A review found the executor's back(float("inf")) raised
    OverflowError from Condition.wait_for, which lost the session.)"""
    async def scenario() -> None:
        slots = Slots(1, waiting=1)
        entered, leave = asyncio.Event(), asyncio.Event()
        async with slots.take() as a:
            assert a.aside()
            t = _taker(slots, entered, leave)
            assert await _set_within(entered, 5)
            asyncio.get_running_loop().call_later(0.2, leave.set)
            assert await a.back(None) and a.held
        await t

    _run(scenario())


def test_a_session_waiting_for_its_slot_and_cancelled_gives_nothing_away():
    """A run stopped (SIGINT) while sessions wait for slots: each waiter's cancellation leaves
    the counts as they were, so no slot is lost or held twice."""
    async def scenario() -> None:
        slots = Slots(1, waiting=1)
        async with slots.take() as a:
            assert a.aside()
            blocker = _taker(slots, asyncio.Event(), asyncio.Event())
            await asyncio.sleep(0.05)
            back = asyncio.create_task(a.back(None))
            waiting = _taker(slots, asyncio.Event(), asyncio.Event())
            await asyncio.sleep(0.05)
            assert (slots.running, slots.waiting, slots.returning) == (1, 1, 1)
            for t in (back, waiting, blocker):
                t.cancel()
            await asyncio.gather(back, waiting, blocker, return_exceptions=True)
            assert (slots.running, slots.waiting, slots.returning) == (0, 1, 0)
        assert (slots.running, slots.waiting, slots.returning) == (0, 0, 0)

    _run(scenario())
