"""How long a consumer's fetches wait at the broker: short while it has work, long once idle,
and longer again while it carries many streams.

Tansu holds a fetch that finds no records until its wait (`fetch_max_wait_ms`) is over,
so an idle consumer costs the broker and its own process one fetch per
wait: 50 a second at 20 ms, for every consumer of every stage. A consumer that has seen
nothing to do for `idle_after_s` fetches with `idle_ms` instead; the first record that
matters (or the stage saying it is busy) brings the short wait back for the next fetch.
What that costs: a record that arrives while an idle fetch waits is read up to
`idle_ms` later, once per hop, for the first request after a quiet spell. Apache Kafka
answers a fetch as soon as a record is there, so there a long wait costs nothing.

Under load (the stage says it carries at least `loaded_at` streams) a fetch waits
`loaded_ms`: on Tansu every fetch of a busy consumer takes its whole wait, so the wait
sets how many fetches a second the consumer and the broker pay for, and each one
brings more records. What that costs: each hop of a stream adds up to `loaded_ms`
instead of `busy_ms` while the stage is that loaded (a few ms p50 per hop, where
the time to first token is already queueing); one stream at a time never waits it.

Below that load, a stage that knows a stream's first event is on its way (the gateway
once it has queued a request, safety once an attempt's marker came) fetches every
`eager_ms` until it comes: on Tansu that takes a few ms off each such hop of the time
to first token, for a few more fetches only while a stream starts. The gateway says so
as it queues (`PacedConsumer.expect`), not at its next poll: a poll returns only with
records, so at one stream at a time the first event itself would be the first to say.

Whatever the pace, a consumer the broker answered short fetches with a longer wait
until it has caught up, and reads again what a poll skipped (`bus.fetch_repair`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord, TopicPartition

from bus.fetch_repair import CATCH_UP_MS, Gaps, assignment_of, held_back, positions
from schemas import topics

Batch = Mapping[TopicPartition, list[ConsumerRecord]]
"""What one poll returned."""
BEATS = frozenset({topics.SCHEDULER, topics.WORKERS, topics.CONTROL})
"""Topics that carry periodic status and heartbeats: their records alone are no work."""


def never() -> int:
    return 0


def NO_RECORDS(topic: str) -> bool:
    return False


@dataclass
class FetchPace:
    """The fetch wait of one consumer; `polled` after every poll applies it."""

    busy_ms: int
    idle_ms: int
    idle_after_s: float
    busy: Callable[[], int] = never
    """How much work the stage has in hand (streams open; a bool will do): any keeps
    the short wait, `loaded_at` or more the loaded one."""
    wakes: Callable[[str], bool] = lambda topic: topic not in BEATS
    """Topics whose records are work; by default any but status and heartbeats."""
    long_polls: bool = True
    """While idle a poll may wait as long as a fetch (only records end idleness)."""
    loaded_ms: int = 0
    """The wait while the stage carries `loaded_at` streams or more; 0: never longer."""
    loaded_at: int = 0
    eager: Callable[[Batch], bool] = lambda batch: False
    """Told the poll's records (not yet handled): a stream's first event is on its way to
    this consumer, so the next fetch waits `eager_ms` (below the load)."""
    eager_ms: int = 0
    clock: Callable[[], float] = time.monotonic
    idle: bool = False
    _active_at: float = field(default=-1.0)

    def polled(self, batch: Batch) -> int:
        """Take a poll's records; returns the wait the next fetch should use."""
        now = self.clock()
        load = self.busy()
        if self._active_at < 0 or load or any(self.wakes(tp.topic) for tp in batch):
            self._active_at = now
            self.idle = False
        elif now - self._active_at >= self.idle_after_s:
            self.idle = True
        if self.idle:
            return self.idle_ms
        if self._loaded(load):
            return self.loaded_ms
        if self._eager_set() and self.eager(batch):
            return self.eager_ms
        return self.busy_ms

    def expecting(self) -> int | None:
        """The stage has just sent what a stream's first event answers (the gateway queued
        a request): the wait from the next fetch on, or None under load (the loaded wait
        stays). Told at once, not at the next poll: a poll returns only with records, and
        meanwhile aiokafka builds each next fetch with the wait it has."""
        if self._loaded(self.busy()):
            return None
        busy_ms = self.woken()
        return self.eager_ms if self._eager_set() else busy_ms

    def _loaded(self, load: int) -> bool:
        return self.loaded_ms > self.busy_ms and self.loaded_at > 0 and load >= self.loaded_at

    def _eager_set(self) -> bool:
        return 0 < self.eager_ms < self.busy_ms

    def woken(self) -> int:
        """The stage has work again now: the short wait, from the next fetch on."""
        self._active_at = self.clock()
        self.idle = False
        return self.busy_ms

    def poll_ms(self, poll_ms: int) -> int:
        """How long a poll may wait for records."""
        return max(poll_ms, self.idle_ms) if self.idle and self.long_polls else poll_ms


class PacedConsumer(AIOKafkaConsumer):
    """An AIOKafkaConsumer whose fetch wait follows its `pace` (when one is set), and
    which reads every record the broker holds (`bus.fetch_repair`): it fetches with
    `catch_up_ms` while the broker holds records back, and fetches again from any offset
    a poll skipped."""

    def __init__(
        self,
        *topics: str,
        pace: FetchPace | None = None,
        catch_up_ms: int = CATCH_UP_MS,
        **config: object,
    ) -> None:
        super().__init__(*topics, **config)
        self.pace = pace
        self.catch_up_ms = catch_up_ms
        self.gaps = Gaps()
        self._own_wait_ms = self._fetch_max_wait_ms

    def busy_while(
        self,
        busy: Callable[[], int],
        wakes: Callable[[str], bool] | None = None,
        eager: Callable[[Batch], bool] | None = None,
    ) -> None:
        """The stage's own word on how much work it has (streams open: 0 is none), which
        topics' records are work (with none, a poll keeps its own timeout to see `busy`
        turn true), and when a stream's first event is on its way (`FetchPace.eager`)."""
        if self.pace is not None:
            self.pace.busy = busy
            if eager is not None:
                self.pace.eager = eager
            if wakes is not None:
                self.pace.wakes = wakes
                self.pace.long_polls = wakes is not NO_RECORDS

    def expect(self) -> None:
        """A stream's first event is on its way to this consumer now (`FetchPace.expecting`)."""
        if self.pace is not None and (wait_ms := self.pace.expecting()) is not None:
            set_fetch_wait(self, wait_ms)

    def listen(self, partitions: Iterable[TopicPartition], on: bool) -> None:
        """Fetch from `partitions` (resumed; the first fetch with the short wait, not an
        idle one) or not at all (paused: no fetch for them, their records wait there)."""
        paused = self.paused()
        partitions = tuple(tp for tp in partitions if (tp in paused) is on)
        if not partitions:
            return
        if not on:
            self.pause(*partitions)
            return
        if self.pace is not None:
            set_fetch_wait(self, self.pace.woken())
        self.resume(*partitions)

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        assignment, before = positions(self)
        batch = await super().getmany(*partitions, timeout_ms=timeout_ms, max_records=max_records)
        if before and assignment_of(self) is assignment:
            batch, again = self.gaps.cut(before, batch)
            for tp, offset in again.items():
                self.seek(tp, offset)
        wait_ms = self.pace.polled(batch) if self.pace is not None else self._own_wait_ms
        if held_back(self):
            wait_ms = max(wait_ms, self.catch_up_ms)
        set_fetch_wait(self, wait_ms)
        return batch


def set_fetch_wait(consumer: AIOKafkaConsumer, wait_ms: int) -> None:
    """The wait of the consumer's next fetch requests. aiokafka (0.14) reads it from its
    fetcher for every request it builds and has no public setter."""
    fetcher = getattr(consumer, "_fetcher", None)  # None until the consumer has started
    if fetcher is not None:
        fetcher._fetch_max_wait_ms = wait_ms
