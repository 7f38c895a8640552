"""The native SSE stream a client was sent, rebuilt from the bus (pure).

The gateway that started a stream read its request's delivery events from its own
`chat.deliver.<gateway_id>` topic (the request's `reply_to`), took them through the
stream relay's rule (`gateway.streaming.stream_relay.StreamRelay`: the one answer rule, queue
updates only before any output) and wrote each with `schemas.sse.native_event`,
after the `request` event and before `[DONE]`. The same is done here with the same
functions; where the delivery topic is gone, a stored answer's events on
`chat.answers` (the same events, also written by the safety stage) stand in.

What the bus cannot tell: the gateway joins consecutive deltas that arrive in one
batch into one event (`gateway.streaming.generation.merged_deltas`, the id of the last), so a
client may have seen fewer, longer delta events with the same text and final ids; and
what the gateway itself said without the bus (a stall, an interrupted stream, pings)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gateway.streaming.stream_relay import StreamRelay
from ops.bus_records import ReadRecord
from schemas import sse, topics
from schemas.events import DeliveryEvent, GenerationRequest


@dataclass(frozen=True)
class ClientStream:
    frames: list[bytes]
    source: str | None
    """The topic the events were read from; None when none were found."""
    ended: bool
    """The stream reached its end (done or error), so `[DONE]` followed."""

    @property
    def body(self) -> bytes:
        return b"".join(self.frames)


def client_stream(reads: Iterable[ReadRecord], request_id: str) -> ClientStream:
    """The stream of `request_id` from its records (any order: each partition is read
    in offset order here). LookupError without the request's `GenerationRequest`."""
    reads = sorted(reads, key=lambda r: (r.record.topic, r.record.partition, r.record.offset))
    request = next(
        (
            r.event
            for r in reads
            if isinstance(r.event, GenerationRequest) and r.event.request_id == request_id
        ),
        None,
    )
    if request is None:
        raise LookupError(f"no request {request_id} on the request topics")
    payload = sse.RequestPayload(
        request_id=request_id,
        message_id=request.message_id,
        user_message_id=request.parent_id or "",
    )
    frames = [sse.request_event(payload)]
    source = next(
        (
            topic
            for topic in (request.reply_to, topics.ANSWERS)
            if any(_delivery(r, topic, request_id) for r in reads)
        ),
        None,
    )
    relay = StreamRelay()
    for read in reads:
        if source is not None and _delivery(read, source, request_id):
            shown = relay.add(read.event)  # type: ignore[arg-type]
            if shown is not None:
                frames.append(sse.native_event(shown))
    if relay.ended:
        frames.append(sse.done_marker())
    return ClientStream(frames, source, relay.ended)


def _delivery(read: ReadRecord, topic: str, request_id: str) -> bool:
    return (
        read.record.topic == topic
        and isinstance(read.event, DeliveryEvent)
        and read.event.request_id == request_id
    )
