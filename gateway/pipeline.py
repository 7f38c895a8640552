"""What the HTTP routes need from the rest of the pipeline.

`gateway.relay.KafkaPipeline` implements it over Kafka: `submit` produces the
request on `chat.requests.<tier>` and returns the stream of delivery events
read from this gateway's own `chat.deliver.<gateway_id>` topic.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from schemas.events import DeliverEvent, GenerationRequest, ModerationEvent
from schemas.topics import Tier


class RequestStream(Protocol):
    """Delivery events of one request, duplicates removed, ending after done/error."""

    def __aiter__(self) -> AsyncIterator[DeliverEvent]: ...

    async def aclose(self) -> None:
        """Stop listening (does not cancel the generation)."""


class Pipeline(Protocol):
    @property
    def reply_to(self) -> str:
        """The delivery topic requests from this gateway name as `reply_to`."""

    async def submit(self, request: GenerationRequest) -> RequestStream:
        """Queue the request; the stream is registered before the request is sent."""

    async def cancel(self, request_id: str, reason: str = "client_disconnected") -> None:
        """Publish a cancel on `chat.control`."""

    async def moderate(self, event: ModerationEvent) -> None:
        """Record a safety decision on `chat.moderation`."""

    def overloaded(self, tier: Tier) -> float | None:
        """Retry-After seconds while the scheduler sheds `tier`'s new requests, else None."""
