"""Bus records as replay reads them."""

from __future__ import annotations

from ops.bus_records import BusRecord
from schemas.codec import encode
from schemas.events import (
    ChatMessage,
    Event,
    GenerationRequest,
    Role,
)

DELIVER = "chat.deliver.gw1"


def request(rid: str = "r1", cid: str = "c1") -> GenerationRequest:
    return GenerationRequest(
        request_id=rid,
        conversation_id=cid,
        message_id=f"m-{rid}",
        parent_id=f"u-{rid}",
        user_id="u",
        org_id="o",
        tier="free",
        model="tiny-random",
        reply_to=DELIVER,
        messages=(ChatMessage(role=Role.USER, content="hi"),),
    )


def rec(
    topic: str,
    offset: int,
    ts: int,
    event: Event | bytes,
    partition: int = 0,
    key: bytes | None = b"c1",
) -> BusRecord:
    value = event if isinstance(event, bytes) else encode(event)
    return BusRecord(topic, partition, offset, ts, key, value)
