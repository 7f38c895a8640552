"""One scheduler acts at a time: epochs claimed on `chat.scheduler` and `chat.work`.

A starting scheduler claims with an epoch (wall-clock ms) above every claim since the
last claimer's commit on `chat.scheduler`, then on every `chat.work` partition, before
it dispatches anything. Workers skip assignments of an older epoch from then on, and an
older scheduler that reads the claim is fenced: it stops acting (`fences`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import RecordMetadata, TopicPartition

from bus.clients import KafkaConfig, Publisher
from bus.replay import read_between
from schemas import topics
from schemas.codec import SCHEDULER_EVENT
from schemas.events import SchedulerClaim

REFRESH_S = 60.0
"""How often the claim is written again on `chat.scheduler` and committed there, so a
restart reads back at most this much of the topic to find the highest epoch."""


def fences(claim: SchedulerClaim, scheduler_id: str, epoch: int, shard: str = "") -> bool:
    """Whether `claim` fences the scheduler `scheduler_id` of `shard` that claimed `epoch`:
    shards decide side by side, each fenced by its own successors only."""
    return claim.shard == shard and claim.scheduler_id != scheduler_id and claim.epoch > epoch


@dataclass
class Claim:
    """This scheduler's claim; `consumer` is the scheduler's (its group commits here)."""

    publisher: Publisher
    consumer: AIOKafkaConsumer
    kafka: KafkaConfig | str
    scheduler_id: str
    shard: str = ""
    epoch: int = 0
    _sent_at: float = 0.0

    def event(self) -> SchedulerClaim:
        return SchedulerClaim(scheduler_id=self.scheduler_id, epoch=self.epoch, shard=self.shard)

    async def take(self, committed: int) -> int:
        """Claim on `chat.scheduler` above every claim from its `committed` offset on
        (clocks may disagree: the newest claim must still win); returns the first
        claim's offset: every claim after it is read as it comes."""
        self.epoch = int(time.time() * 1000)
        first = await self._send()
        earlier = await read_between(
            self.kafka,
            topics.SCHEDULER,
            {first.partition: (committed, first.offset)},
            SCHEDULER_EVENT,
        )
        highest = max(
            (
                e.epoch
                for _, _, e in earlier
                if isinstance(e, SchedulerClaim) and e.shard == self.shard
            ),
            default=0,
        )
        if highest >= self.epoch:
            self.epoch = highest + 1
            await self._send()
        return first.offset

    async def on_journal(self, partitions: list[TopicPartition]) -> dict[int, int]:
        """Claim every partition of this shard's `chat.work`; the offset of each claim."""
        sent = await asyncio.gather(
            *(
                self.publisher.send_and_wait(
                    topics.work_topic(self.shard),
                    self.event(),
                    key=self.scheduler_id,
                    partition=tp.partition,
                )
                for tp in partitions
            )
        )
        return {record.partition: record.offset for record in sent}

    async def refresh(self) -> None:
        if time.monotonic() - self._sent_at > REFRESH_S:
            await self._send()

    def fenced_by(self, claim: SchedulerClaim) -> bool:
        return fences(claim, self.scheduler_id, self.epoch, self.shard)

    async def _send(self) -> RecordMetadata:
        sent = await self.publisher.send_and_wait(
            topics.SCHEDULER, self.event(), key=self.scheduler_id
        )
        await self.consumer.commit({TopicPartition(topics.SCHEDULER, sent.partition): sent.offset})
        self._sent_at = time.monotonic()
        return sent
