"""The recorder's Kafka adapter: `chat.answers` in, finished answers stored.

Commit policy: per partition, below the marker of any answer still open, so after a
restart an unfinished answer is read again whole. Finishing an answer is idempotent
(the store only finishes one still in progress), so a replay never stores twice. A
store that fails for a moment (locked, unreachable, timing out) is retried with
backoff, holding the stage where it is: nothing is dead-lettered for it.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time

from aiokafka import ConsumerRebalanceListener
from aiokafka.structs import ConsumerRecord, TopicPartition

from bus.clients import KafkaConfig, Publisher
from bus.offsets import OffsetTracker
from bus.subscriber import consume, decode_record
from conversations.recorder import Recorder
from conversations.store import ConversationStore, NewMessage
from schemas import topics
from schemas.codec import ANSWER_EVENT

log = logging.getLogger(__name__)

STAGE = "recorder"
GROUP = "chatpipe-recorder"
RETRY_BACKOFF_S = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
_TRANSIENT_NAMES = {"Unavailable", "NoHostAvailable", "OperationTimedOut", "WriteTimeout",
                    "ReadTimeout", "CoordinationFailure"}


def is_transient(error: BaseException) -> bool:
    """A store error that goes away by itself: retry, do not dead-letter."""
    return (isinstance(error, sqlite3.OperationalError | OSError | TimeoutError)
            or type(error).__name__ in _TRANSIENT_NAMES)


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, stage: RecorderStage) -> None:
        self.stage = stage

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        for tp in revoked:
            self.stage.recorder.forget_partition(tp.partition)
        self.stage.tracker.forget(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        pass


class RecorderStage:
    def __init__(self, kafka: KafkaConfig, store: ConversationStore,
                 idle_timeout_s: float = 120.0) -> None:
        self.kafka = kafka
        self.store = store
        self.recorder = Recorder(idle_timeout_s=idle_timeout_s)
        self.tracker = OffsetTracker()
        self.store_retries = 0

    async def run(self) -> None:
        producer = self.kafka.producer()
        self.consumer = self.kafka.consumer(group_id=GROUP, bulk=True)
        self.consumer.subscribe([topics.ANSWERS], listener=_Rebalance(self))
        await producer.start()
        await self.consumer.start()
        try:
            await consume(self.consumer, STAGE, Publisher(producer), self._handle,
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
        attempt = 0
        while True:
            try:
                await self.store.finish_answer(message)
                return
            except Exception as error:
                if not is_transient(error):
                    raise
                delay = RETRY_BACKOFF_S[min(attempt, len(RETRY_BACKOFF_S) - 1)]
                log.warning("storing %s failed (%s); retrying in %.1f s", message.message_id,
                            error, delay)
                self.store_retries += 1
                attempt += 1
                await asyncio.sleep(delay)

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
