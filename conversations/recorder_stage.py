"""The recorder's Kafka adapter: `chat.tokens` in, finished assistant messages stored;
`chat.moderation` in, retracted answers replaced.

Commit policy: per partition, commit below the first event of any generation
still open, so after a restart an unfinished message is read again whole.
Storing is idempotent on message_id, so a replay never stores twice.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import replace

from aiokafka import ConsumerRebalanceListener
from aiokafka.structs import ConsumerRecord, TopicPartition

from bus.clients import KafkaConfig, Publisher
from bus.offsets import OffsetTracker
from bus.subscriber import consume, decode_record
from conversations.recorder import Recorder
from conversations.store import ConversationStore, NewMessage
from schemas import topics
from schemas.codec import TOKEN_EVENT
from schemas.events import ModerationEvent
from schemas.lifecycle import RequestStatus

STAGE = "recorder"
REMEMBERED_RETRACTIONS = 10_000
GROUP = "chatpipe-recorder"


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, stage: RecorderStage) -> None:
        self.stage = stage

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.stage.release(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        pass


class RecorderStage:
    def __init__(self, kafka: KafkaConfig, store: ConversationStore) -> None:
        self.kafka = kafka
        self.store = store
        self.recorder = Recorder()
        self.tracker = OffsetTracker()
        self._committed: dict[TopicPartition, int] = {}
        self._retracted: OrderedDict[str, str] = OrderedDict()

    async def run(self) -> None:
        producer = self.kafka.producer()
        self.consumer = self.kafka.consumer(group_id=GROUP, bulk=True)
        self.consumer.subscribe([topics.TOKENS, topics.MODERATION], listener=_Rebalance(self))
        await producer.start()
        await self.consumer.start()
        try:
            await consume(self.consumer, STAGE, Publisher(producer), self._handle,
                          self._after_batch, poll_ms=200, tracker=self.tracker)
        finally:
            await self.consumer.stop()
            await producer.stop()

    def release(self, revoked: set[TopicPartition]) -> None:
        """Revoked partitions: their open generations are the next owner's now."""
        for tp in revoked:
            self.recorder.forget_partition(tp.partition)
            self._committed.pop(tp, None)
        self.tracker.forget(revoked)

    async def _handle(self, record: ConsumerRecord) -> None:
        if record.topic == topics.MODERATION:
            await self._on_moderation(decode_record(ModerationEvent, record))
        else:
            event = decode_record(TOKEN_EVENT, record)
            message = self.recorder.on_event(event, partition=record.partition,
                                             offset=record.offset, now=time.monotonic())
            if message is not None:
                await self._store(message)
        self.tracker.seen(TopicPartition(record.topic, record.partition), record.offset)

    async def _on_moderation(self, event: ModerationEvent) -> None:
        """A retracted answer is stored as its replacement, whichever event comes first."""
        if event.action != "retract" or event.message_id is None:
            return
        if not await self.store.retract_message(event.message_id, event.replacement):
            self._retracted[event.message_id] = event.replacement
            while len(self._retracted) > REMEMBERED_RETRACTIONS:
                self._retracted.popitem(last=False)

    async def _store(self, message: NewMessage) -> None:
        replacement = self._retracted.pop(message.message_id, None)
        if replacement is not None:
            message = replace(message, content=replacement,
                              status=RequestStatus.FINISHED_FILTERED)
        await self.store.add_message(message)

    async def _after_batch(self) -> None:
        for message in self.recorder.expire(time.monotonic()):
            await self._store(message)
        offsets = {}
        for tp, next_offset in self.tracker.to_commit().items():
            floor = self.recorder.commit_floor(tp.partition) if tp.topic == topics.TOKENS else None
            offsets[tp] = next_offset if floor is None else min(floor, next_offset)
        offsets = {tp: o for tp, o in offsets.items() if o > self._committed.get(tp, 0)}
        if offsets:
            await self.consumer.commit(offsets)
            self._committed.update(offsets)
