"""The bus's silence as a client judges it (`bus.request_reply.Silence`), under a fake
clock: time the client's own loop could not run is not the bus's silence."""

from __future__ import annotations

import asyncio

import pytest

from bus.request_reply import LATE_S, Silence


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_silence_counts_from_the_last_acknowledgement() -> None:
    clock = Clock()
    silence = Silence(clock)
    clock.now += 3
    assert silence.seconds() == 3
    silence.heard()
    clock.now += 1
    assert silence.seconds() == 1


async def test_heartbeat_periods_kept_on_time_all_count() -> None:
    clock = Clock()
    silence = Silence(clock)
    for _ in range(6):  # the broker is gone: the loop runs, nothing is acknowledged
        waiting = asyncio.create_task(silence.wait(0))
        clock.now += LATE_S / 2  # woke on time (within LATE_S)
        await waiting
    assert silence.seconds() == pytest.approx(3 * LATE_S)


async def test_time_the_loop_was_held_up_is_left_out_until_heard_again() -> None:
    clock = Clock()
    silence = Silence(clock)
    waiting = asyncio.create_task(silence.wait(1.0))
    await asyncio.sleep(0)  # asleep until 101
    clock.now = 109.0  # a blocking call held the loop for 8 s more
    assert silence.seconds() == 1.0  # asked before the loop woke: counted to its wake time
    await waiting
    assert silence.seconds() == 1.0  # after: the same
    clock.now += 2
    assert silence.seconds() == 3.0
    silence.heard()
    clock.now += 0.5
    assert silence.seconds() == 0.5
