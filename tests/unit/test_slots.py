"""The campaign's slots (runner/executors/base.py): at most ``concurrency`` sessions hold one,
and a session whose start waits on the platform steps aside so another can run (issue 14,
item 8: "pending pods never hold the slots of running ones")."""

from __future__ import annotations

import threading
import time

from runner.executors.base import Slots


def _taker(slots: Slots, entered: threading.Event, leave: threading.Event) -> threading.Thread:
    def run() -> None:
        with slots.take():
            entered.set()
            leave.wait(10)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_slot_is_held_until_its_session_ends():
    slots = Slots(1)
    entered, leave = threading.Event(), threading.Event()
    with slots.take() as slot:
        assert slot.held and slots.running == 1
        t = _taker(slots, entered, leave)
        assert not entered.wait(0.3), "a second session started while the only slot was held"
    assert entered.wait(5)
    leave.set()
    t.join(5)
    assert (slots.running, slots.waiting) == (0, 0)


def test_a_waiting_session_steps_aside_and_another_starts():
    slots = Slots(1, waiting=1)
    entered, leave = threading.Event(), threading.Event()
    with slots.take() as slot:
        t = _taker(slots, entered, leave)
        assert not entered.wait(0.2)
        assert slot.aside() and not slot.held
        assert entered.wait(5), "the slot stepped aside was not given to the next session"
        assert (slots.running, slots.waiting) == (1, 1)
        # Its pod now runs: it waits for the slot back, and gets it when the other ends.
        assert not slot.back(0.2)
        leave.set()
        assert slot.back(5) and slot.held
        assert (slots.running, slots.waiting) == (1, 0)
    t.join(5)
    assert (slots.running, slots.waiting) == (0, 0)


def test_the_waiting_room_is_bounded():
    slots = Slots(2, waiting=1)
    with slots.take() as a, slots.take() as b:
        assert a.aside()
        assert not b.aside(), "a second session stepped aside past the waiting room's size"
        assert b.held and (slots.running, slots.waiting) == (1, 1)
    assert (slots.running, slots.waiting) == (0, 0)


def test_no_waiting_room_keeps_every_waiting_session_in_its_slot():
    slots = Slots(1, waiting=0)
    with slots.take() as a:
        assert not a.aside() and a.held


def test_a_session_coming_back_is_served_before_a_new_one():
    slots = Slots(1, waiting=1)
    order: list[str] = []
    with slots.take() as a:
        assert a.aside()
        running, release = threading.Event(), threading.Event()
        t1 = _taker(slots, running, release)
        assert running.wait(5)
        back = threading.Thread(target=lambda: (a.back(10), order.append("back")), daemon=True)
        back.start()
        time.sleep(0.2)  # a is waiting to come back before the new session asks

        def new() -> None:
            with slots.take():
                order.append("new")

        t2 = threading.Thread(target=new, daemon=True)
        t2.start()
        time.sleep(0.2)
        release.set()
        back.join(5)
        t1.join(5)
        assert order == ["back"], order
    t2.join(5)
    assert order == ["back", "new"]


def test_an_adopted_session_is_followed_at_once_past_the_limit():
    slots = Slots(1)
    with slots.take(), slots.take(force=True) as adopted:
        assert adopted.held and slots.running == 2
    assert slots.running == 0


def test_a_session_may_wait_for_its_slot_as_long_as_it_takes():
    """back(None): no time limit. (A review found the executor's back(float("inf")) raised
    OverflowError from Condition.wait_for, which lost the session.)"""
    slots = Slots(1, waiting=1)
    entered, leave = threading.Event(), threading.Event()
    with slots.take() as a:
        assert a.aside()
        t = _taker(slots, entered, leave)
        assert entered.wait(5)
        threading.Timer(0.2, leave.set).start()
        assert a.back(None) and a.held
    t.join(5)
