"""The LLM judge's way to ask: a short, low-priority generation through the pipeline,
sent with the bus's request/reply client (`bus.request_reply`); the wiring builds it.

It fails closed: an answer that did not end normally (an error, an abort, an expiry,
a stream that stopped or took too long) or that the output check retracted is no
verdict, and `ask` raises; the check that asked then blocks or fails, never passes.

The judge checks input only: its generation streams through `chat.tokens`, which the
safety stage relays, so a judge asked from that stage's output check would wait on
the very consumer that waits on it (`moderation.policy.build_policy` refuses it).
"""

from __future__ import annotations

import asyncio

from bus.request_reply import RequestReplyClient
from moderation.policy import Ask
from schemas.answer import AnswerText
from schemas.events import ChatMessage, DeliveryDone, DeliveryError, Role, SamplingOptions
from schemas.generation import generation_request
from schemas.topics import Tier

JUDGE_MAX_TOKENS = 16
JUDGE_TIMEOUT_S = 60.0
"""The pipeline's own limit on a judge generation (the request's `timeout_s`)."""
JUDGE_WAIT_S = JUDGE_TIMEOUT_S + 5.0
"""How long `ask` waits for the answer: past the pipeline's limit, so its own end
(expired) normally comes first; this bounds a stream that never ends."""
JUDGE_USER, JUDGE_ORG = "safety-judge", "chatpipe"  # whom its generations are counted to


class JudgeFailed(RuntimeError):
    """The judge gave no verdict: its answer did not end normally, or was retracted."""


def judge_ask(client: RequestReplyClient, model: str, wait_s: float = JUDGE_WAIT_S) -> Ask:
    """`ask(prompt) -> answer text`, as the free tier (it must never delay paying users).
    Raises `JudgeFailed` (or TimeoutError after `wait_s`) unless the answer ended normally
    and whole."""

    async def ask(prompt: str) -> str:
        request = generation_request(
            user_id=JUDGE_USER,
            org_id=JUDGE_ORG,
            tier=Tier.FREE,
            model=model,
            messages=(ChatMessage(role=Role.USER, content=prompt),),
            sampling=SamplingOptions(max_tokens=JUDGE_MAX_TOKENS, temperature=0.0),
            reply_to=client.reply_to,
            timeout_s=JUDGE_TIMEOUT_S,
        )
        async with asyncio.timeout(wait_s):
            stream = await client.submit(request)
            try:
                answer = await AnswerText().read(stream)
            finally:
                await stream.aclose()
        if not answer.answered:
            raise JudgeFailed(f"judge gave no verdict: {_why(answer)}")
        return str(answer)

    return ask


def _why(answer: AnswerText) -> str:
    match answer.end:
        case _ if answer.retracted:
            return "its answer was retracted"
        case DeliveryError(code=code):
            return code
        case DeliveryDone(status=status):
            return str(status)
        case _:
            return "its answer did not end"
