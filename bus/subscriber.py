"""The consume loop every stage shares: decode, handle, dead-letter what fails."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord, TopicPartition
from pydantic import BaseModel, TypeAdapter

from bus.clients import Publisher
from bus.dead_letters import dead_letter
from bus.offsets import OffsetTracker
from schemas.codec import decode

log = logging.getLogger(__name__)

E = TypeVar("E", bound=BaseModel)
RecordHandler = Callable[[ConsumerRecord], Awaitable[None]]


def decode_record(kind: type[E] | TypeAdapter[Any], record: ConsumerRecord) -> E:
    return decode(kind, record.value)


async def consume(
    consumer: AIOKafkaConsumer,
    stage: str,
    publisher: Publisher,
    handle: RecordHandler,
    after_batch: Callable[[], Awaitable[None]] | None = None,
    poll_ms: int = 200,
    tracker: OffsetTracker | None = None,
) -> None:
    """Run until cancelled. A record whose handler raises goes to chat.dlq; the
    stage carries on with the next one, so one bad event never stops a stage."""
    while True:
        batch = await consumer.getmany(timeout_ms=poll_ms, max_records=500)
        for records in batch.values():
            for record in records:
                try:
                    await handle(record)
                except Exception as exc:  # noqa: BLE001 - any failure is dead-lettered
                    if not isinstance(exc, ValueError):
                        log.exception("%s: failed on %s@%d", stage, record.topic, record.offset)
                    await dead_letter(publisher, stage, record, f"{type(exc).__name__}: {exc}")
                    if tracker is not None:
                        tracker.seen(TopicPartition(record.topic, record.partition), record.offset)
        if after_batch is not None:
            await after_batch()
