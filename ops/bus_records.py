"""Records as an operator reads them: each topic's events decoded with `schemas/`, the
records of several topics put in one order, and one JSON object per record.

Pure: the Kafka reading is `bus.replay.read_records`; `BusRecord.of` takes what it
returns (an aiokafka `ConsumerRecord`)."""

from __future__ import annotations

import base64
import heapq
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import groupby
from typing import Any

from pydantic import TypeAdapter

from schemas import topics
from schemas.codec import (
    ANSWER_EVENT,
    CONTROL_EVENT,
    GATEWAY_EVENT,
    SCHEDULER_EVENT,
    TOKEN_EVENT,
    WORK_EVENT,
    EventDecodeError,
    decode,
)
from schemas.events import (
    DeadLetter,
    Event,
    FeedbackEvent,
    GenerationRequest,
    ModerationEvent,
    RolloutSet,
    ToolRound,
    UsageEvent,
    WorkerHeartbeat,
)


@dataclass(frozen=True, slots=True)
class BusRecord:
    """One record of a topic partition, as the broker keeps it."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None = None
    value: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()

    @classmethod
    def of(cls, record: Any) -> BusRecord:
        """From an aiokafka `ConsumerRecord`."""
        return cls(
            record.topic,
            record.partition,
            record.offset,
            record.timestamp,
            record.key,
            record.value,
            tuple((name, data or b"") for name, data in record.headers or ()),
        )

    def carries(self, text: str) -> bool:
        """`text` appears in the key or value: a cheap test before decoding."""
        needle = text.encode()
        return needle in (self.value or b"") or needle == self.key


@dataclass(frozen=True, slots=True)
class ReadRecord:
    """A record and its event, or why it has none (`event` None: not an event here)."""

    record: BusRecord
    event: Event | None
    error: str | None = None


_KINDS: dict[str, type[Event] | TypeAdapter[Any]] = {
    topics.WORK: WORK_EVENT,
    topics.WORKERS: WorkerHeartbeat,
    topics.SCHEDULER: SCHEDULER_EVENT,
    topics.TOKENS: TOKEN_EVENT,
    topics.ANSWERS: ANSWER_EVENT,
    topics.CONTROL: CONTROL_EVENT,
    topics.USAGE: UsageEvent,
    topics.MODERATION: ModerationEvent,
    topics.ROLLOUT: RolloutSet,
    topics.FEEDBACK: FeedbackEvent,
    topics.DLQ: DeadLetter,
    topics.TOOLS: ToolRound,
}

PIPELINE_ORDER = (
    "requests",
    topics.WORK,
    topics.TOKENS,
    topics.TOOLS,
    "deliver",
    topics.ANSWERS,
    topics.CONTROL,
    topics.USAGE,
    topics.MODERATION,
    topics.DLQ,
)
"""Where a topic stands in a request's life: records of the same millisecond are shown
in this order (the request before its dispatch, a chunk before its delivery)."""


def kind_of(topic: str) -> type[Event] | TypeAdapter[Any] | None:
    """What `topic` carries; None for a topic chatpipe does not know."""
    if topic.startswith(topics.REQUESTS_PREFIX):
        return GenerationRequest
    if topic.startswith(topics.DELIVER_PREFIX):
        return GATEWAY_EVENT
    if topic.startswith(topics.WORK_SHARD_PREFIX):  # a scheduler shard's journal
        return WORK_EVENT
    return _KINDS.get(topic)


def decoded(record: BusRecord) -> ReadRecord:
    kind = kind_of(record.topic)
    if kind is None:
        return ReadRecord(record, None, f"no event schema for topic {record.topic}")
    try:
        return ReadRecord(record, decode(kind, record.value))
    except EventDecodeError as exc:
        return ReadRecord(record, None, str(exc).splitlines()[0][:500])


def _rank(topic: str) -> int:
    if topic.startswith(topics.REQUESTS_PREFIX):
        return 0
    if topic.startswith(topics.DELIVER_PREFIX):
        return PIPELINE_ORDER.index("deliver")
    if topic.startswith(topics.WORK_SHARD_PREFIX):
        return PIPELINE_ORDER.index(topics.WORK)
    return PIPELINE_ORDER.index(topic) if topic in PIPELINE_ORDER else len(PIPELINE_ORDER)


def in_order(reads: Iterable[ReadRecord]) -> list[ReadRecord]:
    """Every record once, each partition in offset order, partitions merged by record
    timestamp (ties: pipeline order, then topic, partition, offset). A partition's own
    order is never changed, even where its timestamps go back (producers' clocks)."""
    unique = {(r.record.topic, r.record.partition, r.record.offset): r for r in reads}
    ordered = sorted(
        unique.values(), key=lambda r: (r.record.topic, r.record.partition, r.record.offset)
    )
    partitions = [
        list(group)
        for _, group in groupby(ordered, key=lambda r: (r.record.topic, r.record.partition))
    ]
    return list(heapq.merge(*partitions, key=_when))


def _when(read: ReadRecord) -> tuple[int, int, str, int, int]:
    r = read.record
    return r.timestamp_ms, _rank(r.topic), r.topic, r.partition, r.offset


def iso_time(ms: int) -> str:
    """UTC, ISO 8601 with milliseconds."""
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def raw_form(data: bytes | None) -> dict[str, str | None]:
    """Bytes that are no event, shown as text when they are UTF-8, else as base64."""
    if data is None:
        return {"raw": None, "raw_encoding": None}
    try:
        return {"raw": data.decode(), "raw_encoding": "text"}
    except UnicodeDecodeError:
        return {"raw": base64.b64encode(data).decode(), "raw_encoding": "base64"}


def key_text(key: bytes | None) -> str | None:
    if key is None:
        return None
    try:
        return key.decode()
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(key).decode()


def record_line(read: ReadRecord, since_ms: int | None = None, **extra: object) -> dict[str, Any]:
    """One JSON object: where the record lies, when, its key and its event (or its raw
    bytes and why they are no event); `t_ms` with `since_ms`: milliseconds after it."""
    r = read.record
    line: dict[str, Any] = {
        "topic": r.topic,
        "partition": r.partition,
        "offset": r.offset,
        "timestamp": iso_time(r.timestamp_ms),
        "timestamp_ms": r.timestamp_ms,
    }
    if since_ms is not None:
        line["t_ms"] = r.timestamp_ms - since_ms
    line |= extra
    line["key"] = key_text(r.key)
    if read.event is not None:
        line["event"] = read.event.model_dump(mode="json")
    else:
        line |= {"event": None, **raw_form(r.value), "decode_error": read.error}
    return line


def window(
    reads: Iterable[ReadRecord],
    since_ms: int | None = None,
    until_ms: int | None = None,
    key: str | None = None,
    limit: int | None = None,
) -> list[ReadRecord]:
    """The records of `reads` in order (`in_order`) with a timestamp in
    [since_ms, until_ms] and key `key`, the first `limit` of them."""
    wanted = key.encode() if key is not None else None
    chosen = [
        r
        for r in in_order(reads)
        if (since_ms is None or r.record.timestamp_ms >= since_ms)
        and (until_ms is None or r.record.timestamp_ms <= until_ms)
        and (wanted is None or r.record.key == wanted)
    ]
    return chosen if limit is None else chosen[:limit]
