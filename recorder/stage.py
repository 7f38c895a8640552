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
from bus.stage_runner import RunnerOptions, Stage, StageRunner
from bus.subscriber import decode_record
from common.durable import retried
from conversations.answers import finish_answer
from conversations.store import ConversationStore, NewMessage
from recorder.core import Recorder
from schemas import topics
from schemas.codec import ANSWER_EVENT

log = logging.getLogger(__name__)

STAGE = "recorder"
GROUP = "chatpipe-recorder"


class RecorderStage(Stage):
    def __init__(
        self, kafka: KafkaConfig, store: ConversationStore, idle_timeout_s: float = 120.0
    ) -> None:
        self.store = store
        self.recorder = Recorder(idle_timeout_s=idle_timeout_s)
        self.runner = StageRunner(
            kafka,
            STAGE,
            GROUP,
            [topics.ANSWERS],
            self,
            RunnerOptions(bulk=True),
        )

    async def run(self) -> None:
        await self.runner.run()

    def commit_floor(self, tp: TopicPartition) -> int | None:
        return self.recorder.commit_floor(tp.partition)

    def on_revoke(self, tp: TopicPartition) -> None:
        self.recorder.forget_partition(tp.partition)

    async def after_batch(self) -> None:
        await self._expire()

    async def handle(self, record: ConsumerRecord) -> None:
        event = decode_record(ANSWER_EVENT, record)
        message = self.recorder.on_event(
            event, partition=record.partition, offset=record.offset, now=time.monotonic()
        )
        if message is not None:
            await self._store(message)

    async def _store(self, message: NewMessage) -> None:
        started = time.monotonic()
        await retried(lambda: finish_answer(self.store, message), f"storing {message.message_id}")
        self.recorder.waited(time.monotonic() - started)

    async def _expire(self) -> None:
        for message in self.recorder.expire(time.monotonic()):
            log.warning("answer %s stopped without an end; stored as it was", message.message_id)
            await self._store(message)
