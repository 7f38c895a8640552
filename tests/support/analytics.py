"""Events ingested into an analytics warehouse."""

from __future__ import annotations

import itertools
from collections import defaultdict

from analytics.rows import Record, Row, Table, rows_of
from analytics.warehouse import Warehouse
from schemas import topics
from schemas.codec import encode
from schemas.events import (
    ChatMessage,
    Event,
    GenerationRequest,
    Role,
    TokenChunk,
    UsageEvent,
    stream_fields,
)
from schemas.lifecycle import RequestStatus

T0 = 1_800_000_000.0
_offsets = itertools.count()


def request(request_id: str, tier: str, org: str, at: float) -> GenerationRequest:
    return GenerationRequest(
        request_id=request_id,
        conversation_id=f"c-{request_id}",
        message_id=f"m-{request_id}",
        user_id=f"u-{org}",
        org_id=org,
        tier=topics.Tier(tier),
        model="tiny-random",
        reply_to="chat.deliver.gw",
        messages=(ChatMessage(role=Role.USER, content="hi"),),
        created_at=at,
    )


def usage(
    req: GenerationRequest,
    prompt: int,
    completion: int,
    at: float,
    attempt: int = 0,
    status: RequestStatus = RequestStatus.FINISHED_STOPPED,
) -> UsageEvent:
    return UsageEvent(
        request_id=req.request_id,
        attempt=attempt,
        conversation_id=req.conversation_id,
        user_id=req.user_id,
        org_id=req.org_id,
        tier=req.tier,
        model=req.model,
        worker_id="w1",
        status=status,
        prompt_tokens=prompt,
        completion_tokens=completion,
        cached_tokens=1,
        gpu_ms=10.0,
        created_at=at,
    )


def chunk(req: GenerationRequest, seq: int, attempt: int = 0) -> TokenChunk:
    fields = stream_fields(req.model_copy(update={"attempt": attempt}), seq)
    return TokenChunk(**fields, text="x", token_count=1, completion_tokens=seq + 1)


def at(topic: str, event: Event, when: float, offset: int | None = None) -> Record:
    return Record(
        topic,
        0,
        next(_offsets) if offset is None else offset,
        round(when * 1000),
        event.type,
        encode(event),
    )


def ingest(warehouse: Warehouse, records: list[Record]) -> None:
    rows: dict[Table, list[Row]] = defaultdict(list)
    for record in records:
        for table, row in rows_of(record):
            rows[table].append(row)
    warehouse.write(rows)
