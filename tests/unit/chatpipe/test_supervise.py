"""Supervision on a fake clock: stages and a broker that stop when told, no real waiting."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import pytest

from chatpipe.supervise import (
    Backoff,
    SpinWatch,
    Supervisor,
    keep_broker,
)
from tests.support.clock import FakeClock


class ScriptedStage:
    """Each run lasts its scripted seconds, then raises its error (or returns on None);
    once the script is used up, a run waits until cancelled."""

    def __init__(self, clock: FakeClock, script: list[tuple[float, Exception | None]]) -> None:
        self.clock = clock
        self.script = script
        self.built = 0
        self.closed = 0
        self.hanging = asyncio.Event()

    def build(self) -> ScriptedStage:
        self.built += 1
        return self

    async def run(self) -> None:
        if not self.script:
            self.hanging.set()
            try:
                await asyncio.Event().wait()
            finally:
                self.closed += 1
        ran_s, error = self.script.pop(0)
        self.clock.now += ran_s
        if error is not None:
            raise error


async def supervised(
    script: list[tuple[float, Exception | None]],
) -> tuple[Supervisor, ScriptedStage, FakeClock]:
    """A restarting supervisor whose stage has run through `script` and now hangs."""
    clock = FakeClock()
    stage = ScriptedStage(clock, script)
    supervisor = Supervisor(sleep=clock.sleep, clock=clock)
    supervisor.restarting = True
    supervisor.start("scheduler", stage.build)
    await asyncio.wait_for(stage.hanging.wait(), timeout=5)
    return supervisor, stage, clock


class HeldBackoff:
    """A backoff sleep that lasts until `end()`."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self._ended = asyncio.Event()

    async def __call__(self, seconds: float) -> None:
        self.started.set()
        await self._ended.wait()

    def end(self) -> None:
        self._ended.set()


async def backing_off(name: str) -> tuple[Supervisor, ScriptedStage, HeldBackoff]:
    """A restarting supervisor whose stage failed once and waits in its backoff."""
    stage = ScriptedStage(FakeClock(), [(1.0, RuntimeError("boom"))])
    backoff = HeldBackoff()
    supervisor = Supervisor(sleep=backoff, clock=stage.clock)
    supervisor.restarting = True
    supervisor.start(name, stage.build)
    await asyncio.wait_for(backoff.started.wait(), timeout=5)
    return supervisor, stage, backoff


def test_backoff_doubles_to_its_cap_and_starts_over_after_a_healthy_run() -> None:
    backoff = Backoff()
    assert [backoff.after(1.0) for _ in range(9)] == [0.5, 1, 2, 4, 8, 16, 30, 30, 30]
    assert backoff.after(60.0) == 0.5
    assert backoff.after(59.9) == 1


async def test_failing_stage_is_built_anew_after_a_growing_backoff() -> None:
    boom = RuntimeError("boom")
    supervisor, stage, clock = await supervised([(1.0, boom)] * 7)
    assert clock.sleeps == [0.5, 1, 2, 4, 8, 16, 30]
    assert stage.built == 8
    assert not supervisor.tasks["scheduler"].done()
    await supervisor.stop()


async def test_backoff_starts_over_after_a_run_of_a_minute() -> None:
    boom = RuntimeError("boom")
    supervisor, _, clock = await supervised([(1.0, boom)] * 3 + [(61.0, boom), (1.0, boom)])
    assert clock.sleeps == [0.5, 1, 2, 0.5, 1]
    await supervisor.stop()


async def test_failure_is_logged_with_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="chatpipe.supervise"):
        supervisor, _, _ = await supervised([(1.0, RuntimeError("boom"))])
    [record] = caplog.records
    assert record.getMessage() == "scheduler stopped: RuntimeError('boom'); restarting in 0.5 s"
    assert record.exc_info is not None and record.exc_info[1].args == ("boom",)
    await supervisor.stop()


async def test_stage_that_returns_is_restarted(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="chatpipe.supervise"):
        supervisor, stage, clock = await supervised([(2.0, None)])
    assert clock.sleeps == [0.5]
    assert stage.built == 2
    assert "scheduler stopped: it returned; restarting in 0.5 s" in caplog.messages
    await supervisor.stop()


async def test_paused_stage_is_closed_and_a_new_one_starts_when_the_pause_ends() -> None:
    supervisor, stage, clock = await supervised([])
    stage.hanging.clear()
    async with supervisor.paused(["scheduler", "not-started"]):
        assert stage.closed == 1
        await asyncio.sleep(0.01)
        assert stage.built == 1
    await asyncio.wait_for(stage.hanging.wait(), timeout=5)
    assert stage.built == 2
    assert clock.sleeps == []
    await supervisor.stop()


async def test_pause_cancels_again_a_stage_that_goes_on_closing() -> None:
    running, closing, closed = asyncio.Event(), asyncio.Event(), asyncio.Event()

    class CommitsOnTheWayOut:
        async def run(self) -> None:
            running.set()
            try:
                await asyncio.Event().wait()
            finally:
                closing.set()
                try:
                    await asyncio.Event().wait()  # a commit to a broker that is gone
                finally:
                    closed.set()

    supervisor = Supervisor(stop_grace_s=0.01)
    supervisor.start("worker", CommitsOnTheWayOut)
    await asyncio.wait_for(running.wait(), timeout=5)
    async with supervisor.paused(["worker"]):
        assert closing.is_set() and closed.is_set()
    await supervisor.stop()


async def test_stage_backing_off_during_a_pause_waits_for_its_end() -> None:
    supervisor, stage, backoff = await backing_off("worker")
    async with supervisor.paused(["worker"]):
        backoff.end()
        await asyncio.sleep(0.01)
        assert stage.built == 1
    await asyncio.wait_for(stage.hanging.wait(), timeout=5)
    assert stage.built == 2
    await supervisor.stop()


async def test_stop_cancels_a_running_stage_and_builds_no_other() -> None:
    supervisor, stage, _ = await supervised([])
    await supervisor.stop()
    assert supervisor.tasks["scheduler"].cancelled()
    assert stage.built == 1


async def test_stop_during_a_backoff_builds_no_other() -> None:
    supervisor, stage, _ = await backing_off("billing")
    await supervisor.stop()
    assert supervisor.tasks["billing"].cancelled()
    assert stage.built == 1


async def test_failure_before_restarting_ends_the_task_with_its_error() -> None:
    clock = FakeClock()
    stage = ScriptedStage(clock, [(0.0, RuntimeError("cannot start"))])
    supervisor = Supervisor(sleep=clock.sleep, clock=clock)
    supervisor.start("gateway", stage.build)
    with pytest.raises(RuntimeError, match="cannot start"):
        await asyncio.wait_for(supervisor.tasks["gateway"], timeout=5)
    assert stage.built == 1
    assert clock.sleeps == []


async def test_stage_that_cannot_be_built_is_tried_again() -> None:
    clock = FakeClock()
    stage = ScriptedStage(clock, [(1.0, RuntimeError("boom"))])

    def no_file() -> ScriptedStage:
        raise OSError("no file")

    builds = iter([stage.build, no_file, stage.build])
    supervisor = Supervisor(sleep=clock.sleep, clock=clock)
    supervisor.restarting = True
    supervisor.start("recorder", lambda: next(builds)())
    await asyncio.wait_for(stage.hanging.wait(), timeout=5)
    assert clock.sleeps == [0.5, 1]
    assert supervisor.stages["recorder"] is stage
    await supervisor.stop()


class FakeBroker:
    """Exits after `up_s` on the fake clock; `restart` fails `failures` times first."""

    bootstrap_servers = "127.0.0.1:9"

    def __init__(self, clock: FakeClock, up_s: float, failures: int) -> None:
        self.clock = clock
        self.up_s = up_s
        self.failures = failures
        self.exits = 0
        self.restarts = 0
        self.waiting_again = asyncio.Event()

    async def exited(self) -> int:
        if self.exits:
            self.waiting_again.set()
            await asyncio.Event().wait()
        self.exits += 1
        self.clock.now += self.up_s
        return -9

    async def restart(self) -> None:
        if self.failures:
            self.failures -= 1
            raise OSError("port in use")
        self.restarts += 1


async def test_broker_that_exits_is_restarted_with_its_topics(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    broker = FakeBroker(clock, up_s=120.0, failures=2)
    steps: list[str] = []

    async def create_topics() -> None:
        steps.append(f"topics after {broker.restarts} restart")

    @contextlib.asynccontextmanager
    async def pause() -> AsyncIterator[None]:
        steps.append("pause")
        yield
        steps.append("resume")

    with caplog.at_level(logging.WARNING, logger="chatpipe.supervise"):
        task = asyncio.create_task(keep_broker(broker, create_topics, pause, clock.sleep, clock))
        await asyncio.wait_for(broker.waiting_again.wait(), timeout=5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert clock.sleeps == [0.5, 1, 2]
    assert steps == ["pause", "topics after 1 restart", "resume"]
    assert caplog.messages[0] == (
        "embedded broker exited with code -9; restarting it on the same port in 0.5 s — "
        "every topic, message and committed offset is gone"
    )
    assert caplog.messages[1:3] == [
        "could not restart the embedded broker: OSError('port in use'); trying again in 1.0 s",
        "could not restart the embedded broker: OSError('port in use'); trying again in 2.0 s",
    ]
    assert caplog.messages[3] == "embedded broker restarted on 127.0.0.1:9, with empty topics"


def test_a_broker_spins_once_it_has_used_the_cpu_while_idle_for_the_whole_time():
    watch = SpinWatch(cpu=0.5, spin_s=60)
    assert not watch.observe(0, 0.9, idle=True)
    assert not watch.observe(30, 0.9, idle=True)
    assert not watch.observe(45, 0.9, idle=False)  # under load: that says nothing
    assert not watch.observe(50, 0.9, idle=True)  # starts over
    assert not watch.observe(100, 0.3, idle=True)  # calm again
    assert [watch.observe(t, 1.0, idle=True) for t in (200, 230, 260)] == [False, False, True]
    assert not watch.observe(265, 1.0, idle=True)  # starts over after it said so
