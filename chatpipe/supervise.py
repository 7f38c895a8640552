"""`chatpipe up` keeps itself running: a stage that stops is replaced by a new one after
a backoff, the embedded broker is started again when its process exits, and killed
first when it spins while nothing streams (`restart_a_spinning_broker`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import psutil

log = logging.getLogger(__name__)

S = TypeVar("S")
Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]
Pause = Callable[[], AbstractAsyncContextManager[object]]


@dataclass
class Backoff:
    """Seconds to wait before the next start: `first_s`, doubling up to `max_s`; a run
    that lasted `healthy_after_s` starts the doubling over."""

    first_s: float = 0.5
    max_s: float = 30.0
    healthy_after_s: float = 60.0
    _next_s: float = field(init=False)

    def __post_init__(self) -> None:
        self._next_s = self.first_s

    def after(self, ran_s: float) -> float:
        """The wait after a run that lasted `ran_s` seconds."""
        if ran_s >= self.healthy_after_s:
            self._next_s = self.first_s
        delay = self._next_s
        self._next_s = min(delay * 2, self.max_s)
        return delay


def _run(stage: Any) -> Awaitable[None]:
    return stage.run()


class Supervisor:
    """Runs each stage in a task. Once `restarting`, a stage that stops (raises, or
    returns, which it never should) is logged, and after a backoff a new one from the
    stage's `build` runs: stages hold Kafka clients, which are not reused.

    Before `restarting` is set (start-up) and after `stop()`, a stage that stops ends its
    task instead, with the stage's error: a stage that cannot start fails the start."""

    def __init__(
        self,
        sleep: Sleep = asyncio.sleep,
        clock: Clock = time.monotonic,
        stop_grace_s: float = 1.0,
        stop_timeout_s: float = 10.0,
    ) -> None:
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.stages: dict[str, Any] = {}
        self.restarting = False
        self._runs: dict[str, asyncio.Future[None]] = {}
        self._paused: set[str] = set()
        self._unpaused = asyncio.Event()
        self._sleep = sleep
        self._clock = clock
        self._stop_grace_s = stop_grace_s
        self._stop_timeout_s = stop_timeout_s

    def start(
        self, name: str, build: Callable[[], S], run: Callable[[S], Awaitable[None]] = _run
    ) -> S:
        """Build a stage and run it (`stage.run()` unless told) in a task named `name`;
        returns the stage built, `stages[name]` the one running now."""
        stage = self.stages[name] = build()
        self.tasks[name] = asyncio.create_task(self._supervise(name, stage, build, run), name=name)
        return stage

    @contextlib.asynccontextmanager
    async def paused(self, names: Iterable[str]) -> AsyncIterator[None]:
        """Stop these stages and wait until they have closed their clients; when the
        block ends, new ones start at once. A stage still closing after the grace is
        cancelled again: the broker it would say goodbye to is gone, and one that
        commits once the broker is back commits offsets of topics that are gone."""
        self._paused = set(names) & self.tasks.keys()
        self._unpaused.clear()
        stopping = {self._runs[name]: name for name in self._paused if name in self._runs}
        runs = set(stopping)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._stop_timeout_s
        while runs and loop.time() < deadline:
            for run in runs:
                run.cancel()
            _, runs = await asyncio.wait(runs, timeout=self._stop_grace_s)
        if runs:
            log.warning(
                "still stopping after %.0f s: %s",
                self._stop_timeout_s,
                ", ".join(sorted(stopping[run] for run in runs)),
            )
        try:
            yield
        finally:
            self._paused = set()
            self._unpaused.set()

    async def _supervise(
        self, name: str, first: S, build: Callable[[], S], run: Callable[[S], Awaitable[None]]
    ) -> None:
        backoff = Backoff()
        stage: S | None = first
        while True:
            if name in self._paused:
                await self._unpaused.wait()
            started = self._clock()
            error: BaseException | None = None
            try:
                if stage is None:
                    stage = self.stages[name] = build()
                self._runs[name] = asyncio.ensure_future(run(stage))
                await self._runs[name]
            except asyncio.CancelledError:
                if _being_cancelled():
                    raise
                log.info("%s: paused; a new one starts after the pause", name)
                stage = None
                continue
            except (Exception, SystemExit) as exc:  # uvicorn exits when it cannot listen
                if not self.restarting:
                    raise
                error = exc
            if not self.restarting:
                return
            stage = None
            delay = backoff.after(self._clock() - started)
            log.error(
                "%s stopped: %s; restarting in %.1f s",
                name,
                repr(error) if error else "it returned",
                delay,
                exc_info=error,
            )
            await self._sleep(delay)

    async def stop(self) -> None:
        """Restart nothing more; cancel every stage and wait until they have stopped."""
        self.restarting = False
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)


def _being_cancelled() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


@dataclass
class SpinWatch:
    """Whether a broker spins: more than `cpu` of a core, sampled while the pipeline is
    idle, for `spin_s` in a row (a sample taken under load starts over)."""

    cpu: float
    spin_s: float
    _since: float | None = field(default=None, init=False)

    def observe(self, now: float, cpu: float, idle: bool) -> bool:
        """One sample at `now`: True once it has spun for `spin_s` (then it starts over)."""
        if not idle or cpu <= self.cpu:
            self._since = None
            return False
        if self._since is None:
            self._since = now
        if now - self._since < self.spin_s:
            return False
        self._since = None
        return True


async def restart_a_spinning_broker(
    pid: Callable[[], int | None],
    idle: Callable[[], bool],
    watch: SpinWatch,
    sample_s: float = 5.0,
    sleep: Sleep = asyncio.sleep,
    clock: Clock = time.monotonic,
) -> None:
    """Kill the embedded broker (`keep_broker` starts a new one) once it spins while
    nothing streams: the embedded broker can end up using a whole core after a while
    under load, and then stalls every answer; restarted, it serves again at once."""
    last: tuple[int, float] | None = None
    while True:
        await sleep(sample_s)
        process = pid()
        if process is None:
            last = None
            continue
        try:
            used = sum(psutil.Process(process).cpu_times()[:2])
        except psutil.Error:
            last = None
            continue
        now = clock()
        if last is not None and last[0] == process:
            share = (used - last[1]) / sample_s
            if watch.observe(now, share, idle()):
                log.error(
                    "the embedded broker used %.0f%% of a core for %.0f s with nothing "
                    "streaming; restarting it",
                    share * 100,
                    watch.spin_s,
                )
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process, signal.SIGKILL)
        last = (process, used)


class Broker(Protocol):
    """What `keep_broker` needs of `bus.broker.EmbeddedBroker`."""

    @property
    def bootstrap_servers(self) -> str: ...

    async def exited(self) -> int: ...

    async def restart(self) -> None: ...


async def keep_broker(
    broker: Broker,
    create_topics: Callable[[], Awaitable[object]],
    pause: Pause = contextlib.nullcontext,
    sleep: Sleep = asyncio.sleep,
    clock: Clock = time.monotonic,
) -> None:
    """Whenever the embedded broker's process exits, start a new one on the same port and
    create the topics again, retrying both with a backoff until they work. Tansu keeps
    everything in memory, so nothing survives. `pause()` is held meanwhile: Tansu takes a
    write from a client that still knows a topic before the topic exists again, and
    creating the topic then resets that partition's offsets (its next write fails)."""
    backoff = Backoff()
    while True:
        up_since = clock()
        code = await broker.exited()
        delay = backoff.after(clock() - up_since)
        log.error(
            "embedded broker exited with code %d; restarting it on the same port in "
            "%.1f s — every topic, message and committed offset is gone",
            code,
            delay,
        )
        async with pause():
            while True:
                await sleep(delay)
                try:
                    await broker.restart()
                    await create_topics()
                    break
                except Exception as exc:  # noqa: BLE001 - keep trying, and keep saying so
                    delay = backoff.after(0.0)
                    log.error(
                        "could not restart the embedded broker: %r; trying again in %.1f s",
                        exc,
                        delay,
                    )
        log.warning("embedded broker restarted on %s, with empty topics", broker.bootstrap_servers)


@contextlib.asynccontextmanager
async def broker_kept_up(
    broker: Broker,
    create_topics: Callable[[], Awaitable[object]],
    pause: Pause = contextlib.nullcontext,
) -> AsyncIterator[None]:
    """`keep_broker` for as long as the `async with` block runs."""
    task = asyncio.create_task(keep_broker(broker, create_topics, pause), name="broker")
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
