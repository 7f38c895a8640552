"""What the HTTP routes need from the rest of the pipeline.

`gateway.streaming.relay.KafkaPipeline` implements it over Kafka: `submit` produces the
request on `chat.requests.<tier>` and returns the stream of delivery events read
from this gateway's own `chat.deliver.<gateway_id>` topic (`bus.request_reply`; the
scheduler deletes it once the gateway is gone, `scheduler.delivery_topics`);
`follow` reads a stored answer's events from `chat.answers`, for a stream resumed on
any gateway.

When the bus loses what it held (an embedded broker restarted empty), every stream the
gateway relays ends at once with error `answer_lost` (`StreamLosses`), and new requests
are refused `pipeline_unavailable` until it is back (`unreachable`). `readiness` is what
`GET /readyz` reports: whether a request can be carried now.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
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


class Losable(Protocol):
    def lose(self) -> None:
        """End the stream now: the bus lost its answer."""


class StreamLosses:
    """The streams a gateway relays, each ended at once with error `answer_lost` when
    the bus loses every record (`lose_all`): their answers are gone, and no event of
    theirs will come."""

    def __init__(self) -> None:
        self._open: set[Losable] = set()

    def add(self, stream: Losable) -> None:
        self._open.add(stream)

    def discard(self, stream: Losable) -> None:
        self._open.discard(stream)

    def lose_all(self) -> int:
        """End every open stream; how many there were."""
        open_now = list(self._open)
        for stream in open_now:
            stream.lose()
        return len(open_now)


@dataclass(frozen=True)
class Readiness:
    """Whether the pipeline can carry a request now, as this gateway sees it: the bus
    takes its records, a scheduler has spoken lately for each model, and how many
    workers that scheduler last counted per model."""

    bus: bool
    schedulers: Mapping[str, bool]
    """Model -> a scheduler deciding for it sent its status lately."""
    workers: Mapping[str, int]
    """Model -> live workers serving it, as its scheduler last said (0: none, or no
    recent status)."""
    model: str
    """The default model: ready needs a scheduler and a worker for it."""

    @property
    def ready(self) -> bool:
        return (
            self.bus
            and self.schedulers.get(self.model, False)
            and (self.workers.get(self.model, 0) > 0)
        )

    def body(self) -> dict[str, object]:
        return {
            "ready": self.ready,
            "bus": self.bus,
            "models": {
                model: {"scheduler": self.schedulers.get(model, False), "workers": count}
                for model, count in self.workers.items()
            },
        }


class Pipeline(Protocol):
    @property
    def reply_to(self) -> str:
        """The delivery topic requests from this gateway name as `reply_to`."""

    @property
    def losses(self) -> StreamLosses:
        """The streams to end if the bus loses their answers (every `Generation`
        registers while it reads)."""

    def unreachable(self) -> bool:
        """The bus takes no records now (its broker is restarting, or none of this
        gateway's heartbeats was acknowledged lately): refuse new requests."""

    def readiness(self, models: Sequence[str], default: str) -> Readiness:
        """What `GET /readyz` reports for the served `models`."""

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
