"""A request's life across the topics, and a conversation's: which records belong to
it, in what order, and how long after its first event each came (pure).

A record belongs to a request when its event names the request (`request_id`, or the
request inside a `WorkAssignment`); a dead letter when the record it keeps does; a
record that is no event when its bytes carry the request id."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Any

from ops.bus_records import ReadRecord, in_order, record_line
from schemas import topics
from schemas.events import DeadLetter, Event, GenerationRequest, WorkAssignment

LIFE_TOPICS_FIXED = (
    *topics.request_topics(),
    topics.WORK,
    topics.TOKENS,
    topics.ANSWERS,
    topics.CONTROL,
    topics.USAGE,
    topics.MODERATION,
    topics.DLQ,
)
"""Where a request leaves records, besides the gateways' `chat.deliver.*` topics."""


def life_topics(existing: Iterable[str]) -> list[str]:
    """The topics to read for a request's life, of those the broker has."""
    present = set(existing)
    delivery = sorted(t for t in present if t.startswith(topics.DELIVER_PREFIX))
    shards = sorted(t for t in present if t.startswith(topics.WORK_SHARD_PREFIX))
    return [t for t in LIFE_TOPICS_FIXED if t in present] + shards + delivery


def request_id_of(event: Event) -> str | None:
    if isinstance(event, WorkAssignment):
        return event.request.request_id
    return getattr(event, "request_id", None)


def owner(read: ReadRecord, request_ids: Collection[str]) -> str | None:
    """The request of `request_ids` that `read` belongs to, if any."""
    event = read.event
    if isinstance(event, DeadLetter):
        return next((rid for rid in request_ids if rid in event.value or rid == event.key), None)
    if event is not None:
        rid = request_id_of(event)
        return rid if rid in request_ids else None
    return next((rid for rid in request_ids if read.record.carries(rid)), None)


def conversation_requests(reads: Iterable[ReadRecord], conversation_id: str) -> list[str]:
    """The ids of the conversation's requests, in the order they were queued."""
    return _queued(reads, lambda request: request.conversation_id == conversation_id)


def answer_requests(reads: Iterable[ReadRecord], message_id: str) -> list[str]:
    """The ids of the requests queued to write answer `message_id`, in the order queued."""
    return _queued(reads, lambda request: request.message_id == message_id)


def _queued(reads: Iterable[ReadRecord], wanted: Callable[[GenerationRequest], bool]
            ) -> list[str]:  # fmt: skip
    queued = [
        r.event.request_id
        for r in in_order(reads)
        if isinstance(r.event, GenerationRequest) and wanted(r.event)
    ]
    return list(dict.fromkeys(queued))


def life_lines(reads: Iterable[ReadRecord], request_ids: Collection[str]) -> list[dict[str, Any]]:
    """One JSON object per record of the requests, in order (`bus_records.in_order`),
    each with its `request_id` and `t_ms`: milliseconds after its request's first event."""
    first_ms: dict[str, int] = {}
    lines: list[dict[str, Any]] = []
    for read in in_order(reads):
        rid = owner(read, request_ids)
        if rid is None:
            continue
        since = first_ms.setdefault(rid, read.record.timestamp_ms)
        lines.append(record_line(read, since, request_id=rid))
    return lines
