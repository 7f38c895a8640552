"""The recorder's Kafka adapter: `chat.answers` in, finished answers stored.

Commit policy: per partition, below the marker of any answer still open, so after a
restart an unfinished answer is read again whole. Finishing an answer is idempotent
(the store only finishes one still in progress), so a replay never stores twice. A
store that fails for a moment (locked, unreachable, timing out) is retried with
backoff, holding the stage where it is: nothing is dead-lettered for it.
"""

from __future__ import annotations

import logging
import time

from aiokafka.structs import ConsumerRecord, TopicPartition

from bus.clients import KafkaConfig
from bus.offsets import ForgetRevoked, OffsetTracker
from bus.produce_failures import RetryingPublisher
from bus.subscriber import consume, decode_record
from common.durable import retried
from conversations.store import ConversationStore, NewMessage
from recorder.core import Recorder
from schemas import topics
from schemas.codec import ANSWER_EVENT

log = logging.getLogger(__name__)

STAGE = "recorder"
GROUP = "chatpipe-recorder"
class RecorderStage:
    def __init__(self, kafka: KafkaConfig, store: ConversationStore,
                 idle_timeout_s: float = 120.0) -> None:
        self.kafka = kafka
        self.store = store
        self.recorder = Recorder(idle_timeout_s=idle_timeout_s)
        self.tracker = OffsetTracker()

    async def run(self) -> None:
        producer = self.kafka.producer()
        self.consumer = self.kafka.consumer(group_id=GROUP, bulk=True)
        self.consumer.subscribe([topics.ANSWERS], listener=ForgetRevoked(
            self.tracker, self.recorder.forget_partition))
        await producer.start()
        await self.consumer.start()
        try:
            await consume(self.consumer, STAGE, RetryingPublisher(producer), self._handle,
                          self._after_batch, poll_ms=200, tracker=self.tracker)
        finally:
            await self.consumer.stop()
            await producer.stop()

    async def _handle(self, record: ConsumerRecord) -> None:
        event = decode_record(ANSWER_EVENT, record)
        message = self.recorder.on_event(event, partition=record.partition,
                                         offset=record.offset, now=time.monotonic())
        if message is not None:
            await self._store(message)
        self.tracker.seen(TopicPartition(record.topic, record.partition), record.offset)

    async def _store(self, message: NewMessage) -> None:
        started = time.monotonic()
        await retried(lambda: self.store.finish_answer(message), f"storing {message.message_id}")
        self.recorder.waited(time.monotonic() - started)

    async def _after_batch(self) -> None:
        for message in self.recorder.expire(time.monotonic()):
            log.warning("answer %s stopped without an end; stored as it was",
                        message.message_id)
            await self._store(message)
        offsets = self.tracker.to_commit(
            lambda tp: self.recorder.commit_floor(tp.partition))
        if offsets:
            await self.consumer.commit(offsets)
            self.tracker.committed(offsets)
