"""The dead-letter topic: events a stage could not parse or process."""

from __future__ import annotations

import base64
import logging

from aiokafka.structs import ConsumerRecord

from bus.clients import Publisher
from schemas.events import DeadLetter
from schemas.topics import DLQ

log = logging.getLogger(__name__)

MAX_KEPT_BYTES = 1 << 20
"""A record too big for the bus may be why it failed: the dead letter keeps its start."""


async def dead_letter(publisher: Publisher, stage: str, record: ConsumerRecord, error: str) -> None:
    """Park `record` on chat.dlq with the error, keyed like the original, with what
    `chatpipe dlq retry` needs to send it again as it was: its exact bytes (up to
    MAX_KEPT_BYTES) and its headers."""
    key = record.key.decode(errors="replace") if record.key is not None else None
    raw = record.value or b""
    kept = raw[:MAX_KEPT_BYTES]
    value = kept.decode(errors="replace")
    log.warning(
        "%s: dead-lettering %s[%d]@%d: %s",
        stage,
        record.topic,
        record.partition,
        record.offset,
        error,
    )
    await publisher.send_and_wait(
        DLQ,
        DeadLetter(
            stage=stage,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            key=key,
            value=value,
            truncated=len(raw) > MAX_KEPT_BYTES,
            error=error[:2000],
            value_base64=None if value.encode() == kept else base64.b64encode(kept).decode(),
            headers=tuple(
                (name, base64.b64encode(data or b"").decode())
                for name, data in record.headers or ()
            ),
            timestamp_ms=record.timestamp,
        ),
        key=key,
    )
