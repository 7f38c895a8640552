"""The LLM judge's way to ask: a short, low-priority generation through the pipeline,
sent with the bus's request/reply client (`bus.request_reply`); the wiring builds it."""

from __future__ import annotations

import uuid

from bus.request_reply import RequestReplyClient
from moderation.policy import Ask
from schemas.answer import AnswerText
from schemas.events import (
    ChatMessage,
    DeliveryError,
    GenerationRequest,
    Role,
    SamplingOptions,
    now,
)
from schemas.topics import Tier

JUDGE_MAX_TOKENS = 16
JUDGE_TIMEOUT_S = 60.0


def judge_ask(client: RequestReplyClient, model: str) -> Ask:
    """`ask(prompt) -> answer text`, as the free tier (it must never delay paying users).
    A retracted answer's text is dropped (the replacement stands in for it)."""

    async def ask(prompt: str) -> str:
        request_id = uuid.uuid4().hex
        request = GenerationRequest(
            request_id=request_id, conversation_id=f"judge-{request_id}",
            message_id=f"judge-{request_id}", user_id="safety-judge", org_id="chatpipe",
            tier=Tier.FREE, model=model, store=False, reply_to=client.reply_to,
            messages=(ChatMessage(role=Role.USER, content=prompt),),
            sampling=SamplingOptions(max_tokens=JUDGE_MAX_TOKENS, temperature=0.0),
            deadline=now() + JUDGE_TIMEOUT_S,
        )
        stream = await client.submit(request)
        try:
            answer = await AnswerText().read(stream)
        finally:
            await stream.aclose()
        match answer.end:
            case DeliveryError(code=code):
                raise RuntimeError(f"judge failed: {code}")
        return str(answer)

    return ask
