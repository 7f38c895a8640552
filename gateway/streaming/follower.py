"""Following answers on `chat.answers`, where the safety stage puts every event a
stored answer's client may see: how a gateway resumes a stream it did not start.

One consumer per gateway, assigned only the partitions of the answers it follows
now, each read from the answer's marker (`AnswerStarted`, whose offset the store
keeps). Records are matched by key (the conversation id) before they are decoded,
so the rest of the partition costs little; a stream ends after its terminal event
or when its reader closes it. A follow that starts before the partition's position
seeks back; the other streams on that partition drop what they already had (one
answer rule, by position).
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord, TopicPartition

from bus.clients import KafkaConfig
from bus.request_reply import Inbox
from schemas import topics
from schemas.codec import ANSWER_EVENT, EventDecodeError, decode
from schemas.events import AnswerEvent

log = logging.getLogger(__name__)


class FollowedAnswer(Inbox[AnswerEvent]):
    """Events of one answer from its marker on, as they are read (duplicates included:
    the reader applies the one answer rule)."""

    def __init__(
        self, request_id: str, key: bytes, partition: int, follower: AnswerFollower
    ) -> None:
        super().__init__()
        self.request_id = request_id
        self.key = key
        self.partition = partition
        self._follower: AnswerFollower | None = follower

    async def aclose(self) -> None:
        if self._follower is not None:
            self._follower.unfollow(self)
            self._follower = None


class AnswerFollower:
    def __init__(self, kafka: KafkaConfig) -> None:
        self.kafka = kafka
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None
        self._follows: dict[int, set[FollowedAnswer]] = {}
        self._positions: dict[int, int] = {}
        self._lock = asyncio.Lock()

    async def follow(
        self, request_id: str, conversation_id: str, partition: int, offset: int
    ) -> FollowedAnswer:
        """Events of `request_id` on `chat.answers` partition `partition` from `offset`."""
        followed = FollowedAnswer(request_id, conversation_id.encode(), partition, self)
        async with self._lock:
            consumer = await self._started()
            self._follows.setdefault(partition, set()).add(followed)
            known = self._positions.get(partition)
            if known is None or offset < known:
                self._positions[partition] = offset
            self._assign(consumer)
        return followed

    def unfollow(self, followed: FollowedAnswer) -> None:
        streams = self._follows.get(followed.partition)
        if streams is None:
            return
        streams.discard(followed)
        if not streams:
            del self._follows[followed.partition]
            self._positions.pop(followed.partition, None)
            if self._consumer is not None:
                self._assign(self._consumer)

    def rewind(self) -> None:
        """Every partition followed is read again from its start (the broker lost it)."""
        for partition in self._positions:
            self._positions[partition] = 0
        if self._consumer is not None and self._follows:
            self._assign(self._consumer)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._consumer is not None:
            await self._consumer.stop()

    async def _started(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            self._consumer = self.kafka.consumer()
            await self._consumer.start()
            self._task = asyncio.create_task(self._read(self._consumer), name="answer-follower")
        return self._consumer

    def _assign(self, consumer: AIOKafkaConsumer) -> None:
        """Assign the followed partitions, each at the position it needs (assign resets
        every position, so each is sought again)."""
        partitions = [TopicPartition(topics.ANSWERS, p) for p in sorted(self._follows)]
        consumer.assign(partitions)
        for tp in partitions:
            consumer.seek(tp, self._positions[tp.partition])

    async def _read(self, consumer: AIOKafkaConsumer) -> None:
        while True:
            if not self._follows:
                await asyncio.sleep(0.05)
                continue
            try:
                batch = await consumer.getmany(timeout_ms=200, max_records=2000)
            except Exception:
                log.warning("reading chat.answers failed; retrying", exc_info=True)
                await asyncio.sleep(0.2)
                continue
            for tp, records in batch.items():
                for record in records:
                    self._route(tp.partition, record)

    def _route(self, partition: int, record: ConsumerRecord) -> None:
        if partition not in self._follows:
            return
        self._positions[partition] = record.offset + 1
        matching = [f for f in self._follows[partition] if f.key == record.key]
        if not matching:
            return
        try:
            event = decode(ANSWER_EVENT, record.value)
        except EventDecodeError:
            return
        for followed in matching:
            if followed.request_id == event.request_id:
                followed.put(event)
