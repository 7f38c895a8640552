"""Serving `POST /v1/completions`: a text completion admitted, generated, and answered.

The request becomes its `GenerationRequest` in `protocol`. Otherwise a completion is a
chat completion's twin: the same checks, charges and input safety check
(`gateway.openai.chat_completions.serving.admit_generation`), not stored, cancelled when
its client goes; its usage is on chat.usage and billed as any answer's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

from fastapi import Request

from conversations.store import ApiKey
from gateway.deps import GatewayDeps
from gateway.openai.chat_completions.serving import (
    admit_generation,
    interrupted_chunk,
    stream_error_chunk,
)
from gateway.openai.chat_completions.tool_answers import finish_reason
from gateway.openai.completions.protocol import to_generation_request
from gateway.streaming.event_stream import EventStreamResponse
from gateway.streaming.generation import (
    Generation,
    LoggedAnswerText,
    StreamTimers,
    collected_all,
    event_stream,
    merged_deltas,
    start_generation,
)
from schemas import sse
from schemas.api import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionUsage,
    TextCompletion,
    text_completion_id,
)
from schemas.events import DeliveryDone, DeliveryError, Delta, Retract, now


async def serve_completion(
    body: CompletionRequest, owner: ApiKey, deps: GatewayDeps, request: Request
) -> TextCompletion | EventStreamResponse:
    """The completion admitted as a chat completion is (`admit_generation`), generated, and
    its answer: chunks as SSE when streamed, else the whole completion."""
    generation_request = to_generation_request(
        body, owner, deps.config, deps.pipeline.reply_to, deps.aliases
    )
    ask = await admit_generation(generation_request, owner, deps)
    generation = await start_generation(
        deps.pipeline,
        generation_request,
        deps.live,
        timers=StreamTimers(deps.config.stream_stall_s),
        lease=ask.leases.claim(),
    )
    answer = _TextAnswer(text_completion_id(generation_request.request_id),
                         generation_request.model, int(now()), body.include_usage,
                         (generation_request.prompt or "") if body.echo else "",
                         body.logprobs is not None)  # fmt: skip
    if body.stream:
        return event_stream(completion_chunks(answer, generation), generation)
    [text] = await collected_all([generation], request, [LoggedAnswerText()])
    end = text.end
    assert isinstance(end, DeliveryDone)
    reason = finish_reason(None, end, text.retracted)
    logprobs = (
        CompletionLogprobs.of(tuple(text.logprobs))
        if answer.logprobs and not text.retracted
        else None
    )
    return answer.completion(
        answer.echo + str(text), reason, CompletionUsage.of(end.usage), logprobs
    )


@dataclass(frozen=True, slots=True)
class _TextAnswer:
    """What every chunk of one text completion repeats."""

    id: str
    model: str
    created: int
    include_usage: bool
    echo: str
    """The prompt, when the client asked for it back before the completion."""
    logprobs: bool = False
    """The client asked for the tokens' log probabilities."""

    def completion(
        self, text: str, reason: str | None, usage: CompletionUsage | None = None,
        logprobs: CompletionLogprobs | None = None,
    ) -> TextCompletion:  # fmt: skip
        choices = [CompletionChoice(text=text, finish_reason=reason, logprobs=logprobs)]
        return TextCompletion(id=self.id, created=self.created, model=self.model,
                              choices=choices, usage=usage)  # fmt: skip

    def chunk(
        self, text: str, reason: str | None = None, logprobs: CompletionLogprobs | None = None
    ) -> bytes:
        return sse.openai_chunk(self.completion(text, reason, logprobs=logprobs))

    def usage_chunk(self, usage: CompletionUsage) -> bytes:
        return sse.openai_chunk(
            TextCompletion(
                id=self.id, created=self.created, model=self.model, choices=[], usage=usage
            )
        )


async def completion_chunks(answer: _TextAnswer, generation: Generation) -> AsyncIterator[bytes]:
    """The completion's chunks (the prompt first, with `echo`); what arrived together is
    written together. A retraction cannot take back text already sent: the stream ends
    `content_filter`."""
    if answer.echo:
        yield answer.chunk(answer.echo)
    retracted = False
    offset = 0  # where the next token starts in the completion's text
    async with aclosing(generation.batches()) as batches:
        async for batch in batches:
            frames: list[bytes] = []
            for event in merged_deltas(batch):
                match event:
                    case Delta() if not retracted and answer.logprobs:
                        logprobs = CompletionLogprobs.of(event.logprobs, offset)
                        offset += sum(len(token) for token in logprobs.tokens)
                        frames.append(answer.chunk(event.text, logprobs=logprobs))
                    case Delta() if not retracted:
                        frames.append(answer.chunk(event.text))
                    case Retract():
                        retracted = True
                    case DeliveryDone():
                        frames.append(answer.chunk("", finish_reason(None, event, retracted)))
                        if answer.include_usage:
                            frames.append(answer.usage_chunk(CompletionUsage.of(event.usage)))
                    case DeliveryError():
                        frames.append(stream_error_chunk(event.code, event.message))
            if frames:
                yield b"".join(frames)
    if not generation.finished:
        yield interrupted_chunk()
    yield sse.done_marker()
