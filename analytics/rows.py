"""Records of the bus as rows of the analytics tables (pure: no Kafka, no files).

Each table names the columns that identify an event (`key`): a record read twice (a
redelivery, a replay from the start) or an event sent twice gives the same key, and
the warehouse's views keep one row per key.

What is read, and why: `chat.usage` for tokens and GPU time per tier, model
and org; `chat.requests.<tier>` for when each request was made (its `created_at`, for
time to first token; the prompt is not kept); `chat.tokens` for each request's first
chunk (the record's timestamp: when the worker sent it) and each attempt's end (its
status: cancellations); `chat.moderation` for retractions and blocked inputs;
`chat.feedback` for users' ratings of answers. A request's `alias` and `parent_id` (the
message it answers: a second request for one is a regeneration) compare the versions of
a model alias (`analytics.rollout_report`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from schemas import topics
from schemas.codec import EventDecodeError, decode
from schemas.events import (
    FeedbackEvent,
    GenerationDone,
    GenerationError,
    GenerationRequest,
    ModerationEvent,
    TokenChunk,
    UsageEvent,
)

TOPICS: tuple[str, ...] = (
    *topics.request_topics(),
    topics.TOKENS,
    topics.USAGE,
    topics.MODERATION,
    topics.FEEDBACK,
)
"""Every topic the analytics consumer reads."""


@dataclass(frozen=True)
class Table:
    """A Parquet table: its columns (name, DuckDB type) and the columns of its key."""

    name: str
    columns: tuple[tuple[str, str], ...]
    key: tuple[str, ...]

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.columns)


_SOURCE = (("topic", "VARCHAR"), ("partition", "INTEGER"), ("offset", "BIGINT"))
"""Where each row was read: every table ends with these."""

USAGE = Table(
    "usage",
    (
        ("request_id", "VARCHAR"),
        ("attempt", "INTEGER"),
        ("conversation_id", "VARCHAR"),
        ("user_id", "VARCHAR"),
        ("org_id", "VARCHAR"),
        ("tier", "VARCHAR"),
        ("model", "VARCHAR"),
        ("requested_model", "VARCHAR"),
        ("worker_id", "VARCHAR"),
        ("status", "VARCHAR"),
        ("prompt_tokens", "BIGINT"),
        ("completion_tokens", "BIGINT"),
        ("prior_completion_tokens", "BIGINT"),
        ("cached_tokens", "BIGINT"),
        ("gpu_ms", "DOUBLE"),
        ("created_at", "DOUBLE"),
        *_SOURCE,
    ),
    key=("request_id", "attempt"),
)
REQUESTS = Table(
    "requests",
    (
        ("request_id", "VARCHAR"),
        ("attempt", "INTEGER"),
        ("conversation_id", "VARCHAR"),
        ("user_id", "VARCHAR"),
        ("org_id", "VARCHAR"),
        ("tier", "VARCHAR"),
        ("model", "VARCHAR"),
        ("max_tokens", "INTEGER"),
        ("created_at", "DOUBLE"),
        ("alias", "VARCHAR"),
        ("parent_id", "VARCHAR"),
        *_SOURCE,
    ),
    key=("request_id", "attempt"),
)
FIRST_CHUNKS = Table(
    "first_chunks",
    (
        ("request_id", "VARCHAR"),
        ("attempt", "INTEGER"),
        ("tier", "VARCHAR"),
        ("model", "VARCHAR"),
        ("sent_at", "DOUBLE"),
        *_SOURCE,
    ),
    key=("request_id", "attempt"),
)
ENDS = Table(
    "ends",
    (
        ("request_id", "VARCHAR"),
        ("attempt", "INTEGER"),
        ("seq", "INTEGER"),
        ("tier", "VARCHAR"),
        ("model", "VARCHAR"),
        ("status", "VARCHAR"),
        ("code", "VARCHAR"),
        ("sent_at", "DOUBLE"),
        *_SOURCE,
    ),
    key=("request_id", "attempt"),
)
MODERATION = Table(
    "moderation",
    (
        ("request_id", "VARCHAR"),
        ("conversation_id", "VARCHAR"),
        ("user_id", "VARCHAR"),
        ("message_id", "VARCHAR"),
        ("action", "VARCHAR"),
        ("category", "VARCHAR"),
        ("created_at", "DOUBLE"),
        *_SOURCE,
    ),
    key=("request_id", "conversation_id", "message_id", "action"),
)
FEEDBACK = Table(
    "feedback",
    (
        ("message_id", "VARCHAR"),
        ("conversation_id", "VARCHAR"),
        ("request_id", "VARCHAR"),
        ("user_id", "VARCHAR"),
        ("org_id", "VARCHAR"),
        ("model", "VARCHAR"),
        ("alias", "VARCHAR"),
        ("rating", "VARCHAR"),
        ("text", "VARCHAR"),
        ("created_at", "DOUBLE"),
        *_SOURCE,
    ),
    key=("topic", "partition", "offset"),
)
"""Every rating counts (a user may change their mind): one row per record."""
TABLES = (USAGE, REQUESTS, FIRST_CHUNKS, ENDS, MODERATION, FEEDBACK)

Row = tuple[Any, ...]


@dataclass(frozen=True)
class Record:
    """What the analytics core needs of a Kafka record."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    event_type: str | None
    """The `event-type` header (None: absent; the payload's `type` decides)."""
    value: bytes | None


def rows_of(record: Record) -> list[tuple[Table, Row]]:
    """The rows `record` adds; none for events analytics does not count (chunks after
    a stream's first, attempt markers, event types it does not know). EventDecodeError
    when an event it counts does not parse."""
    source = (record.topic, record.partition, record.offset)
    kind = record.event_type or _payload_type(record.value)
    sent_at = record.timestamp_ms / 1000
    if record.topic.startswith(topics.REQUESTS_PREFIX) and kind == "request":
        request = decode(GenerationRequest, record.value)
        return [
            (
                REQUESTS,
                (
                    request.request_id,
                    request.attempt,
                    request.conversation_id,
                    request.user_id,
                    request.org_id,
                    request.tier.value,
                    request.model,
                    request.sampling.max_tokens,
                    request.created_at,
                    request.alias,
                    request.parent_id,
                    *source,
                ),
            )
        ]
    if record.topic == topics.USAGE and kind == "usage":
        usage = decode(UsageEvent, record.value)
        return [
            (
                USAGE,
                (
                    usage.request_id,
                    usage.attempt,
                    usage.conversation_id,
                    usage.user_id,
                    usage.org_id,
                    usage.tier.value,
                    usage.model,
                    usage.requested_model,
                    usage.worker_id,
                    usage.status.value,
                    usage.prompt_tokens,
                    usage.completion_tokens,
                    usage.prior_completion_tokens,
                    usage.cached_tokens,
                    usage.gpu_ms,
                    usage.created_at,
                    *source,
                ),
            )
        ]
    if record.topic == topics.MODERATION and kind == "moderation":
        event = decode(ModerationEvent, record.value)
        return [
            (
                MODERATION,
                (
                    event.request_id,
                    event.conversation_id,
                    event.user_id,
                    event.message_id,
                    event.action,
                    event.category,
                    event.created_at,
                    *source,
                ),
            )
        ]
    if record.topic == topics.FEEDBACK and kind == "feedback":
        feedback = decode(FeedbackEvent, record.value)
        return [
            (
                FEEDBACK,
                (
                    feedback.message_id,
                    feedback.conversation_id,
                    feedback.request_id,
                    feedback.user_id,
                    feedback.org_id,
                    feedback.model,
                    feedback.alias,
                    feedback.rating,
                    feedback.text,
                    feedback.created_at,
                    *source,
                ),
            )
        ]
    if record.topic != topics.TOKENS:
        return []
    if kind == "chunk":
        if _payload(record.value).get("seq") != 0:
            return []  # the stream's first chunk (seq 0, whichever attempt sent it) only
        chunk = decode(TokenChunk, record.value)
        return [
            (
                FIRST_CHUNKS,
                (chunk.request_id, chunk.attempt, _tier(chunk.tier), chunk.model, sent_at, *source),
            )
        ]
    if kind == "done":
        done = decode(GenerationDone, record.value)
        return [
            (
                ENDS,
                (
                    done.request_id,
                    done.attempt,
                    done.seq,
                    _tier(done.tier),
                    done.model,
                    done.status.value,
                    None,
                    sent_at,
                    *source,
                ),
            )
        ]
    if kind == "error":
        error = decode(GenerationError, record.value)
        return [
            (
                ENDS,
                (
                    error.request_id,
                    error.attempt,
                    error.seq,
                    _tier(error.tier),
                    error.model,
                    "error",
                    error.code,
                    sent_at,
                    *source,
                ),
            )
        ]
    return []


def _tier(tier: topics.Tier | None) -> str | None:
    return tier.value if tier is not None else None


def _payload(value: bytes | None) -> dict[str, Any]:
    if value is None:
        raise EventDecodeError("empty message")
    try:
        payload = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise EventDecodeError(str(exc)) from exc
    if not isinstance(payload, dict):
        raise EventDecodeError("not a JSON object")
    return payload


def _payload_type(value: bytes | None) -> str | None:
    kind = _payload(value).get("type")
    return kind if isinstance(kind, str) else None
