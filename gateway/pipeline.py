"""What the HTTP routes need from the rest of the pipeline.

`gateway.streaming.relay.KafkaPipeline` implements it over Kafka: `submit` produces the
request on `chat.requests.<tier>` and returns the stream of delivery events read
from this gateway's own `chat.deliver.<gateway_id>` topic (`bus.request_reply`; the
scheduler deletes it once the gateway is gone, `scheduler.delivery_topics`);
`follow` reads a stored answer's events from `chat.answers`, for a stream resumed on
any gateway.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from conversations.store import ApiKey
from schemas.events import (
    ChatMessage,
    Event,
    FeedbackEvent,
    GenerationRequest,
    ModerationEvent,
    SamplingOptions,
    UsageEvent,
)
from schemas.generation import generation_request
from schemas.topics import Tier


class RequestStream(Protocol):
    """Events of one request as they arrive (the reader applies the one answer rule)."""

    def __aiter__(self) -> AsyncIterator[Event]: ...

    async def take(self) -> Sequence[Event]:
        """Every event that has arrived and not been taken, waiting for the first."""

    async def aclose(self) -> None:
        """Stop listening (does not cancel the generation)."""


class Pipeline(Protocol):
    @property
    def reply_to(self) -> str:
        """The delivery topic requests from this gateway name as `reply_to`."""

    async def start_answer(self, request: GenerationRequest) -> tuple[int, int]:
        """Mark where a stored answer starts on `chat.answers`: (partition, offset)."""

    async def submit(self, request: GenerationRequest) -> RequestStream:
        """Queue the request; the stream is registered before the request is sent."""

    async def follow(
        self, request_id: str, conversation_id: str, partition: int, offset: int
    ) -> RequestStream:
        """A stored answer's events from its marker at (partition, offset) on."""

    async def cancel(self, request_id: str, reason: str = "client_disconnected") -> None:
        """Publish a cancel on `chat.control`."""

    def hold(self, request_id: str, stream: RequestStream, grace_s: float) -> None:
        """The client dropped `stream`: cancel the generation unless it ends or is
        resumed within `grace_s`; close `stream` once the hold ends, whichever way."""

    async def announce_resume(self, request_id: str, held_by: str) -> None:
        """This gateway relays the stream now: the one holding it (`held_by`, its
        delivery topic) stops waiting."""

    async def moderate(self, event: ModerationEvent) -> None:
        """Record a safety decision on `chat.moderation`."""

    async def feedback(self, event: FeedbackEvent) -> None:
        """Record a user's rating of an answer on `chat.feedback` (once the broker has it)."""

    async def usage(self, event: UsageEvent) -> None:
        """Report on `chat.usage` what no worker reports: work the gateway did itself
        (embeddings), billed and counted against the budgets like a generation's."""

    def overloaded(self, tier: Tier, model: str) -> float | None:
        """Retry-After seconds while the scheduler deciding for `model` sheds `tier`'s
        new requests, else None."""


def owner_request(
    owner: ApiKey, *, model: str, messages: tuple[ChatMessage, ...], sampling: SamplingOptions,
    reply_to: str, timeout_s: float, sent_at: float, conversation_id: str | None = None,
    parent_id: str | None = None, store: bool = False, alias: str | None = None,
) -> GenerationRequest:  # fmt: skip
    """A request asked by `owner` (billed, prioritised and prefix-cached as them);
    `alias`: the alias asked for, whose version `model` is."""
    return generation_request(
        user_id=owner.user_id, org_id=owner.org_id, tier=owner.tier, cache_salt=owner.org_id,
        model=model, messages=messages, sampling=sampling, reply_to=reply_to,
        timeout_s=timeout_s, sent_at=sent_at, conversation_id=conversation_id,
        parent_id=parent_id, store=store, alias=alias,
    )  # fmt: skip
