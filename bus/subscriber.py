"""The consume loop under every stage (`bus.stage_runner`): decode, handle, dead-letter."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord, TopicPartition
from pydantic import BaseModel, TypeAdapter

from bus.clients import Publisher
from bus.dead_letters import dead_letter
from bus.fetch_pace import FetchPace
from bus.offsets import OffsetTracker
from ops import tracing
from ops.metrics import dead_lettered, watch_lag
from schemas.codec import decode

log = logging.getLogger(__name__)

E = TypeVar("E", bound=BaseModel)
RecordHandler = Callable[[ConsumerRecord], Awaitable[None]]
FailureHandler = Callable[[ConsumerRecord, Exception], Awaitable[None]]
"""Ends what a failed record belonged to; given the exception (a `RecordRejected` when
the bus refused one of its outputs), never to be shown to a client as it is."""
AFTER_BATCH_BACKOFF_S = (0.1, 0.5, 1.0, 2.0, 5.0)


def decode_record(kind: type[E] | TypeAdapter[E], record: ConsumerRecord) -> E:
    event = decode(kind, record.value)
    tracing.decoded(event)
    return event


async def consume(
    consumer: AIOKafkaConsumer,
    stage: str,
    publisher: Publisher,
    handle: RecordHandler,
    after_batch: Callable[[], Awaitable[None]] | None = None,
    poll_ms: int = 200,
    tracker: OffsetTracker | None = None,
    on_failure: FailureHandler | None = None,
    max_records: int = 500,
    until: Callable[[], bool] | None = None,
) -> None:
    """Run until cancelled, or until `until()` is true after a batch's `after_batch`.
    A record whose handler raises goes to chat.dlq and `on_failure` ends what it
    belonged to (a request's stream gets a terminal event); the stage carries on with
    the next one, so one bad event never stops a stage.
    `after_batch` (commits, decisions) that raises is logged and run again after a
    backoff: the records it had not finished stay uncommitted, nothing is skipped."""
    failures = 0
    pace: FetchPace | None = getattr(consumer, "pace", None)
    watch_lag(consumer, stage)
    while True:
        timeout_ms = pace.poll_ms(poll_ms) if pace is not None else poll_ms
        batch = await consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
        for records in batch.values():
            for record in records:
                with tracing.consuming(stage, record):  # its hop's span, from its headers
                    try:
                        await handle(record)
                    except Exception as exc:  # noqa: BLE001 - any failure is dead-lettered
                        await failed(stage, publisher, record, exc, on_failure)
                        if tracker is not None:
                            tracker.seen(
                                TopicPartition(record.topic, record.partition), record.offset
                            )
        if after_batch is None:
            continue
        try:
            await after_batch()
            failures = 0
            if until is not None and until():
                return
        except Exception:
            log.exception("%s: after-batch step failed; retrying", stage)
            await asyncio.sleep(
                AFTER_BATCH_BACKOFF_S[min(failures, len(AFTER_BATCH_BACKOFF_S) - 1)]
            )
            failures += 1


async def failed(
    stage: str,
    publisher: Publisher,
    record: ConsumerRecord,
    exc: Exception,
    on_failure: FailureHandler | None = None,
) -> None:
    """Dead-letter `record` with the error, then let the stage end what it belonged to.
    Neither step may stop the stage: their own failures are only logged."""
    error = f"{type(exc).__name__}: {exc}"
    tracing.failed(exc)
    if not isinstance(exc, ValueError):
        log.error(
            "%s: failed on %s@%d",
            stage,
            record.topic,
            record.offset,
            exc_info=(type(exc), exc, exc.__traceback__),
        )
    try:
        await dead_letter(publisher, stage, record, error)
        dead_lettered(stage, exc)
    except Exception:
        log.exception("%s: could not dead-letter %s@%d", stage, record.topic, record.offset)
    if on_failure is None:
        return
    try:
        await on_failure(record, exc)
    except Exception:
        log.exception(
            "%s: could not end what %s@%d belonged to", stage, record.topic, record.offset
        )
