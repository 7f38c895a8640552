"""The LLM judge's way to ask: a short, low-priority generation through the pipeline."""

from __future__ import annotations

import uuid

from gateway.relay import KafkaPipeline
from moderation.policy import Ask
from schemas.events import (
    ChatMessage,
    DeliveryError,
    Delta,
    GenerationRequest,
    Role,
    SamplingOptions,
    now,
)
from schemas.topics import Tier

JUDGE_MAX_TOKENS = 16
JUDGE_TIMEOUT_S = 60.0


def judge_ask(pipeline: KafkaPipeline, model: str) -> Ask:
    """`ask(prompt) -> answer text`, as the free tier (it must never delay paying users)."""

    async def ask(prompt: str) -> str:
        request_id = uuid.uuid4().hex
        request = GenerationRequest(
            request_id=request_id, conversation_id=f"judge-{request_id}",
            message_id=f"judge-{request_id}", user_id="safety-judge", org_id="chatpipe",
            tier=Tier.FREE, model=model, store=False, reply_to=pipeline.reply_to,
            messages=(ChatMessage(role=Role.USER, content=prompt),),
            sampling=SamplingOptions(max_tokens=JUDGE_MAX_TOKENS, temperature=0.0),
            deadline=now() + JUDGE_TIMEOUT_S,
        )
        stream = await pipeline.submit(request)
        answer = []
        try:
            async for event in stream:
                if isinstance(event, Delta):
                    answer.append(event.text)
                elif isinstance(event, DeliveryError):
                    raise RuntimeError(f"judge failed: {event.code}")
        finally:
            await stream.aclose()
        return "".join(answer)

    return ask
