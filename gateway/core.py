"""The gateway's decisions, as plain values: no HTTP, no Kafka, no settings, no clock
but the times it is given.
"""

from __future__ import annotations

from conversations.store import ApiKey
from schemas.events import ChatMessage, GenerationRequest, SamplingOptions
from schemas.generation import generation_request


def owner_request(
    owner: ApiKey, *, model: str, messages: tuple[ChatMessage, ...], sampling: SamplingOptions,
    reply_to: str, timeout_s: float, sent_at: float, conversation_id: str | None = None,
    parent_id: str | None = None, store: bool = False,
) -> GenerationRequest:  # fmt: skip
    """A request asked by `owner` (billed, prioritised and prefix-cached as them)."""
    return generation_request(
        user_id=owner.user_id, org_id=owner.org_id, tier=owner.tier, cache_salt=owner.org_id,
        model=model, messages=messages, sampling=sampling, reply_to=reply_to,
        timeout_s=timeout_s, sent_at=sent_at, conversation_id=conversation_id,
        parent_id=parent_id, store=store,
    )
