"""The one consume/commit/rebalance loop every stage adapter runs.

A stage says only what differs: its name, group and topics, how it handles one record
(`Stage.handle`), and whatever else of the `Stage` protocol it needs; every other
method of `Stage` has a default that does nothing. The plain values (fetch less often,
how long a poll waits, how many records it takes, by assignment) are `RunnerOptions`.
The runner builds the producer and the consumer, subscribes, starts and stops them,
and commits::

    class BillingStage(Stage):
        def __init__(self, kafka: KafkaConfig, ledger: UsageLedger) -> None:
            self.runner = StageRunner(kafka, "billing", "chatpipe-billing",
                                      [topics.USAGE], self, RunnerOptions(bulk=True))

        async def run(self) -> None:
            await self.runner.run()

        async def handle(self, record: ConsumerRecord) -> None:
            ...  # decode, act, await what must be durable before the commit

What the runner calls, on the stage it runs:

- `handle(record)`: each record; `after_batch()` after each poll batch, before the
  commit; `on_failure(record, exc)` once a record whose handler raised is dead-lettered.
- `commit_floor(tp)`, `commit_rule(done)`, `after_commit(committed)`: what (not) to
  commit, below.
- `on_assign(partitions)`, `on_revoke(tp)`: the rebalance, below.
- `busy()`, `wakes(topic)`, `eager(batch)`: the stage's word on how much work it has
  (streams open), which topics' records are work and when a stream's first event is on
  its way (`PacedConsumer.busy_while`).

While `run` runs, the handler may use `runner.publisher` (a `RetryingPublisher`: it
sends events), `runner.tracker` (to hold a record open: `started`, later `done`) and
`runner.consumer`. Work a handler holds open and finishes later (the tools stage's
rounds) that fails calls `runner.failed(record, exc)`: the same dead letter and
`on_failure` as a handler that raised. A stage that runs more than this loop (the
workers' control consumer and drain, the scheduler's claim and journal replay) calls
`start`, `consume`, `commit` and `stop` itself instead of `run`.

A stage that must not wait for a group to rebalance (the scheduler: a restart would wait
out a dead member's session) reads by assignment (`RunnerOptions(assign=True)`): every
partition of its topics, from the group's committed offsets (`committed`), without
joining the group; no revoke or assign is ever told. Its commits are the same as a
member's.

What the runner guarantees, the same for every stage:

- A record's offset is committed only once it is done: its handler returned (and did
  not hold it open with `tracker.started`), or it raised and the record was
  dead-lettered to chat.dlq (`on_failure` then ends what it belonged to); a failed
  record is committed past, so one bad event never stops a stage.
- Never past `commit_floor(partition)`: the first record of something the stage still
  needs (an answer still open), so a restart reads it again whole.
- Only after what the stage published is acknowledged (the publisher is flushed first).
- Commits happen after each poll batch, after the stage's own `after_batch` step; a
  stage with its own cadence says which done offsets to commit now (`commit_rule`),
  and one that commits offsets it keeps itself does it once the runner's are
  committed (`after_commit`: the scheduler's journal). If
  that step or the commit raises, it is logged and retried after a backoff; records
  not committed stay uncommitted, nothing is skipped.
- A revoked partition is its next owner's: the stage's `on_revoke(tp)` drops its
  state for that topic partition and the tracker forgets it; the next owner reads from
  the committed offset (`RunnerOptions(commit_on_revoke=True)` commits what is done
  first).

Why our own runner and not FastStream: FastStream's Kafka subscriber acknowledges one
message at a time (`AckPolicy`; `KafkaMessage.ack()` calls aiokafka's `commit()` with no
offsets, i.e. everything the consumer has fetched, 0.7.8). It has no per-partition
commit floor below work still open, no commit once per batch of exactly the offsets
that are done, and no hook for the fetch pacing (`PacedConsumer`) or the rebalance
order (commit, then forget) the stages need. Getting them would mean `AckPolicy.MANUAL`
and this same loop written around its handler. Latency does not decide it
either: the measured figures and the command that reproduces them are in
docs/decisions.md, *Our own stage runner*.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from aiokafka import AIOKafkaProducer, ConsumerRebalanceListener
from aiokafka.structs import ConsumerRecord, TopicPartition

from bus.clients import KafkaConfig
from bus.fetch_pace import BEATS, Batch, PacedConsumer
from bus.offsets import OffsetTracker
from bus.produce_failures import RetryingPublisher
from bus.subscriber import consume, failed
from bus.topics import topic_partitions

log = logging.getLogger(__name__)

Offsets = dict[TopicPartition, int]


class Stage:
    """What a stage runner calls on the stage it runs. A stage defines `handle`; every
    other method's default does nothing (commits everything done, no floor, no pacing
    of its own)."""

    async def handle(self, record: ConsumerRecord) -> None:
        """One record; once it returns the record is done (unless `tracker.started`
        holds it open)."""
        raise NotImplementedError

    async def after_batch(self) -> None:
        """After each poll batch's records, before the commit."""

    async def on_failure(self, record: ConsumerRecord, exc: Exception) -> None:
        """`record`'s handler raised and it is dead-lettered: end what it belonged to."""

    def commit_floor(self, tp: TopicPartition) -> int | None:
        """The first offset of `tp` the stage still needs, or None."""
        return None

    def commit_rule(self, done: Offsets) -> Offsets:
        """Of the offsets done and below their floors, those to commit now."""
        return done

    async def after_commit(self, committed: Offsets) -> None:
        """After each commit step, told what it committed (maybe nothing)."""

    def on_assign(self, partitions: set[TopicPartition]) -> None:
        """The partitions this member holds after a rebalance."""

    def on_revoke(self, tp: TopicPartition) -> None:
        """`tp` is another member's now: drop what is kept for it."""

    def busy(self) -> int:
        """How much work the stage has in hand (streams open): 0 is none."""
        return 0

    def wakes(self, topic: str) -> bool:
        """Whether records of `topic` are work (by default: any but status and
        heartbeats)."""
        return topic not in BEATS

    def eager(self, batch: Batch) -> bool:
        """Told a poll's records (not yet handled): a stream's first event is on its way."""
        return False


@dataclass(frozen=True, slots=True)
class RunnerOptions:
    """How a stage runner reads."""

    bulk: bool = False
    """Off a stream's path, so it fetches less often (`KafkaConfig.consumer`)."""
    poll_ms: int = 200
    max_records: int = 500
    assign: bool = False
    """Read every partition by assignment, never joining the group."""
    commit_on_revoke: bool = False
    """Commit what is done before a revoked partition is forgotten."""


class StageRunner:
    """One stage's consumer group member: subscribe (or assign), handle, commit, rebalance."""

    publisher: RetryingPublisher
    """Sends the stage's events; set by `start`."""
    consumer: PacedConsumer
    """The group's consumer; set by `start`."""
    committed: Offsets
    """With `assign`: where each partition was read from (the group's commit, or 0);
    set by `start`."""

    def __init__(
        self,
        kafka: KafkaConfig,
        name: str,
        group: str,
        topics: Sequence[str],
        stage: Stage,
        options: RunnerOptions = RunnerOptions(),
    ) -> None:
        """`name`: the stage's, in logs, metrics and dead letters."""
        self.kafka = kafka
        self.name = name
        self.group = group
        self.topics = tuple(topics)
        self.stage = stage
        self.options = options
        self.tracker = OffsetTracker()
        self._producer: AIOKafkaProducer | None = None

    async def run(self, until: Callable[[], bool] | None = None) -> None:
        """Start, consume until cancelled (or until `until()` is true after a batch's
        step and commit), then stop."""
        await self.start()
        try:
            await self.consume(until)
        finally:
            await self.stop()

    async def start(self) -> None:
        self._producer = self.kafka.producer()
        self.publisher = RetryingPublisher(self._producer)
        self.consumer = self.kafka.consumer(group_id=self.group, bulk=self.options.bulk)
        if _paces(self.stage):
            self.consumer.busy_while(self.stage.busy, self.stage.wakes, self.stage.eager)
        if not self.options.assign:
            self.consumer.subscribe(list(self.topics), listener=_Rebalance(self))
        await self._producer.start()
        try:
            await self.consumer.start()
        except BaseException:
            await self._producer.stop()
            raise
        if self.options.assign:
            try:
                await self._assign_all()
            except BaseException:
                await self.stop()
                raise

    async def _assign_all(self) -> None:
        """Every partition of the stage's topics, each read from the group's commit."""
        every: list[TopicPartition] = []
        for topic in self.topics:
            every += await topic_partitions(self.consumer, topic)
        self.consumer.assign(every)
        offsets = await asyncio.gather(*(self.consumer.committed(tp) for tp in every))
        self.committed = {tp: offset or 0 for tp, offset in zip(every, offsets, strict=True)}
        for tp, offset in self.committed.items():
            self.consumer.seek(tp, offset)

    def partitions(self, topic: str) -> list[TopicPartition]:
        """With `assign`: the partitions of `topic` this runner reads, in order."""
        return [tp for tp in self.committed if tp.topic == topic]

    async def stop(self) -> None:
        try:
            await self.consumer.stop()
        finally:
            if self._producer is not None:
                await self._producer.stop()

    async def consume(self, until: Callable[[], bool] | None = None) -> None:
        """The loop alone (`start` first): handle each record, then after each batch the
        stage's `after_batch` and the commit."""
        stage = self.stage

        async def handled(record: ConsumerRecord) -> None:
            await stage.handle(record)
            self.tracker.seen(TopicPartition(record.topic, record.partition), record.offset)

        async def step() -> None:
            await stage.after_batch()
            await self.commit()

        await consume(
            self.consumer,
            self.name,
            self.publisher,
            handled,
            step,
            poll_ms=self.options.poll_ms,
            tracker=self.tracker,
            on_failure=stage.on_failure,
            max_records=self.options.max_records,
            until=until,
        )

    async def failed(self, record: ConsumerRecord, exc: Exception) -> None:
        """`record`, held open (`tracker.started`), failed after its handler returned:
        dead-letter it and end what it belonged to (`on_failure`), as for a handler
        that raised. It never raises; the caller then marks the record done."""
        await failed(self.name, self.publisher, record, exc, self.stage.on_failure)

    async def commit(self) -> None:
        """Commit every partition's done records (below its floor, as the stage's rule
        allows), once what the stage published is on the bus; then `after_commit`."""
        offsets = self.stage.commit_rule(self.tracker.to_commit(self.stage.commit_floor))
        if offsets:
            await self.publisher.flush()
            await self.consumer.commit(offsets)
            self.tracker.committed(offsets)
        await self.stage.after_commit(offsets)

    async def revoked(self, partitions: set[TopicPartition]) -> None:
        if self.options.commit_on_revoke:
            try:
                await self.commit()
            except Exception:
                log.warning("%s: commit before a rebalance failed", self.name, exc_info=True)
        for tp in partitions:
            self.stage.on_revoke(tp)
        self.tracker.forget(partitions)


def _paces(stage: Stage) -> bool:
    """Whether `stage` has its own word on its work (`busy`, `wakes`, `eager`): the
    consumer's pace otherwise keeps its defaults, the same as `Stage`'s."""
    return any(
        getattr(getattr(stage, name), "__func__", None) is not getattr(Stage, name)
        for name in ("busy", "wakes", "eager")
    )


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, runner: StageRunner) -> None:
        self.runner = runner

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.runner.revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.runner.stage.on_assign(set(assigned))
