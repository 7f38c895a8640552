"""A `GenerationRequest` built in one place: fresh ids, a deadline from a timeout, the
delivery topic to answer on, unstored unless asked.

Used by every sender of a generation: the gateway's chat turns (`gateway/native/turns.py`,
stored), OpenAI completions (`gateway/openai/chat_completions/protocol.py`), its
background titles and summaries (`gateway/native/background.py`) and the safety stage's
LLM judge (`safety/judge.py`).
Each states only who asks, what for, and where the answer goes.
"""

from __future__ import annotations

import uuid

from schemas.events import ChatMessage, GenerationRequest, SamplingOptions, now
from schemas.topics import Tier


def new_id() -> str:
    """A fresh request, message or conversation id."""
    return uuid.uuid4().hex


def generation_request(
    *, user_id: str, org_id: str, tier: Tier, model: str, messages: tuple[ChatMessage, ...],
    sampling: SamplingOptions, reply_to: str, timeout_s: float,
    conversation_id: str | None = None, message_id: str | None = None,
    parent_id: str | None = None, cache_salt: str | None = None, store: bool = False,
    sent_at: float | None = None, alias: str | None = None,
) -> GenerationRequest:  # fmt: skip
    """A request with a fresh `request_id`, dropped if still waiting `timeout_s` after
    `sent_at` (default: now). A conversation or message id not given is a fresh one;
    `store` persists the answer in the conversation store (native turns only)."""
    return GenerationRequest(
        request_id=new_id(),
        conversation_id=conversation_id or new_id(),
        message_id=message_id or new_id(),
        parent_id=parent_id,
        user_id=user_id,
        org_id=org_id,
        tier=tier,
        model=model,
        messages=messages,
        sampling=sampling,
        reply_to=reply_to,
        deadline=(now() if sent_at is None else sent_at) + timeout_s,
        cache_salt=cache_salt,
        store=store,
        alias=alias,
    )
