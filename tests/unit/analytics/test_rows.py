"""Records as analytics rows: what counts, what is skipped, what is a bad record."""

from __future__ import annotations

import pytest

from analytics.rows import ENDS, FIRST_CHUNKS, MODERATION, REQUESTS, USAGE, Record, rows_of
from schemas import topics
from schemas.codec import EventDecodeError, encode
from schemas.events import (
    AttemptStarted,
    ChatMessage,
    Event,
    GenerationDone,
    GenerationError,
    GenerationRequest,
    ModerationEvent,
    Role,
    TokenChunk,
    Usage,
    UsageEvent,
    stream_fields,
)
from schemas.lifecycle import RequestStatus

REQUEST = GenerationRequest(
    request_id="r1",
    conversation_id="c1",
    message_id="m1",
    user_id="u1",
    org_id="acme",
    tier=topics.Tier.PRO,
    model="tiny-random",
    reply_to="chat.deliver.gw",
    messages=(ChatMessage(role=Role.USER, content="a private prompt"),),
    created_at=100.0,
)


def record(
    topic: str, event: Event, offset: int = 7, timestamp_ms: int = 100_250, header: bool = True
) -> Record:
    return Record(topic, 2, offset, timestamp_ms, event.type if header else None, encode(event))


def chunk(seq: int, attempt: int = 0) -> TokenChunk:
    request = REQUEST.model_copy(update={"attempt": attempt})
    return TokenChunk(
        **stream_fields(request, seq), text="x", token_count=1, completion_tokens=seq + 1
    )


def test_a_request_row_keeps_when_and_whose_not_what() -> None:
    [(table, row)] = rows_of(record(topics.requests_topic("pro"), REQUEST))
    assert table is REQUESTS
    assert dict(zip(table.column_names, row, strict=True)) == {
        "request_id": "r1",
        "attempt": 0,
        "conversation_id": "c1",
        "user_id": "u1",
        "org_id": "acme",
        "tier": "pro",
        "model": "tiny-random",
        "max_tokens": 256,
        "created_at": 100.0,
        "alias": None,
        "parent_id": None,
        "topic": "chat.requests.pro",
        "partition": 2,
        "offset": 7,
    }
    assert "a private prompt" not in map(str, row)


def test_a_usage_row_has_every_count() -> None:
    usage = UsageEvent(
        request_id="r1",
        attempt=1,
        conversation_id="c1",
        user_id="u1",
        org_id="acme",
        tier=topics.Tier.FREE,
        model="tiny-random",
        worker_id="w1",
        status=RequestStatus.FINISHED_STOPPED,
        prompt_tokens=11,
        completion_tokens=5,
        prior_completion_tokens=3,
        cached_tokens=4,
        gpu_ms=12.5,
        created_at=130.0,
    )
    [(table, row)] = rows_of(record(topics.USAGE, usage))
    values = dict(zip(USAGE.column_names, row, strict=True))
    assert table is USAGE
    assert (values["tier"], values["org_id"], values["status"], values["attempt"]) == (
        "free",
        "acme",
        "finished_stopped",
        1,
    )
    assert (
        values["prompt_tokens"],
        values["completion_tokens"],
        values["prior_completion_tokens"],
        values["cached_tokens"],
        values["gpu_ms"],
        values["created_at"],
    ) == (11, 5, 3, 4, 12.5, 130.0)


@pytest.mark.parametrize("header", [True, False], ids=["type header", "type in payload"])
def test_only_a_streams_first_chunk_counts_with_its_send_time(header: bool) -> None:
    [(table, row)] = rows_of(record(topics.TOKENS, chunk(0), header=header))
    assert table is FIRST_CHUNKS
    assert dict(zip(table.column_names, row, strict=True))["sent_at"] == 100.25
    assert rows_of(record(topics.TOKENS, chunk(1), header=header)) == []
    assert rows_of(record(topics.TOKENS, chunk(4, attempt=1), header=header)) == []
    [(_, retried)] = rows_of(record(topics.TOKENS, chunk(0, attempt=1)))
    assert retried[:2] == ("r1", 1)  # attempt 0 sent nothing: attempt 1's seq 0 is the first


def test_ends_record_status_or_error_code() -> None:
    fields = stream_fields(REQUEST, 3)
    done = GenerationDone(**fields, status=RequestStatus.FINISHED_ABORTED, usage=Usage())
    error = GenerationError(**fields, code="expired", message="too late")
    [(table, row)] = rows_of(record(topics.TOKENS, done))
    assert table is ENDS
    assert dict(zip(ENDS.column_names, row, strict=True))["status"] == "finished_aborted"
    [(_, row)] = rows_of(record(topics.TOKENS, error))
    values = dict(zip(ENDS.column_names, row, strict=True))
    assert (values["status"], values["code"], values["seq"]) == ("error", "expired", 3)


def test_moderation_rows_and_skipped_events() -> None:
    retract = ModerationEvent(
        request_id="r1",
        conversation_id="c1",
        action="retract",
        category="pii",
        reason="a phone number",
        created_at=140.0,
    )
    [(table, row)] = rows_of(record(topics.MODERATION, retract))
    assert (
        table is MODERATION
        and dict(zip(MODERATION.column_names, row, strict=True))["action"] == "retract"
    )
    marker = AttemptStarted(request_id="r1", attempt=1, conversation_id="c1", worker_id="w")
    assert rows_of(record(topics.TOKENS, marker)) == []
    unknown = Record(topics.TOKENS, 0, 1, 0, "a-later-kind", b'{"type": "a-later-kind"}')
    assert rows_of(unknown) == []  # event types it does not know: ignored, not dead letters


@pytest.mark.parametrize(
    "bad",
    [
        Record(topics.USAGE, 0, 1, 0, "usage", b'{"type": "usage", "request_id": "r1"}'),
        Record(topics.TOKENS, 0, 1, 0, "chunk", b"not json"),
        Record(topics.TOKENS, 0, 1, 0, None, b"[1, 2]"),
        Record(topics.MODERATION, 0, 1, 0, "moderation", None),
    ],
    ids=["usage missing fields", "chunk not json", "not an object", "empty"],
)
def test_a_bad_record_it_counts_is_a_decode_error(bad: Record) -> None:
    with pytest.raises(EventDecodeError):
        rows_of(bad)
