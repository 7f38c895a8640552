"""The LLM judge's way to ask: a short, low-priority generation through the pipeline,
sent with the bus's request/reply client (`bus.request_reply`); the wiring builds it."""

from __future__ import annotations

from bus.request_reply import RequestReplyClient
from moderation.policy import Ask
from schemas.answer import AnswerText
from schemas.events import ChatMessage, DeliveryError, Role, SamplingOptions
from schemas.generation import generation_request
from schemas.topics import Tier

JUDGE_MAX_TOKENS = 16
JUDGE_TIMEOUT_S = 60.0
JUDGE_USER, JUDGE_ORG = "safety-judge", "chatpipe"  # whom its generations are counted to


def judge_ask(client: RequestReplyClient, model: str) -> Ask:
    """`ask(prompt) -> answer text`, as the free tier (it must never delay paying users).
    A retracted answer's text is dropped (the replacement stands in for it)."""

    async def ask(prompt: str) -> str:
        request = generation_request(
            user_id=JUDGE_USER, org_id=JUDGE_ORG, tier=Tier.FREE, model=model,
            messages=(ChatMessage(role=Role.USER, content=prompt),),
            sampling=SamplingOptions(max_tokens=JUDGE_MAX_TOKENS, temperature=0.0),
            reply_to=client.reply_to, timeout_s=JUDGE_TIMEOUT_S)
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
