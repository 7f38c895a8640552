"""Serving `POST /v1/chat/completions`: a request admitted, its choices generated, its
answer streamed as chunks or returned whole.

Requests run through the same pipeline as native turns but are not stored
(`store=False`, a fresh conversation id each). Queue updates have no OpenAI
form and are skipped; a retraction replaces the collected text of a
non-streamed answer and ends a streamed one with `content_filter`.

The request is turned into its `GenerationRequest` by `protocol` (every field
honoured or refused naming it: sampling, `logprobs`, `response_format`; tools and tool
messages read by `tool_requests`); `n` choices are `n` generations joined here, each
chunk with its choice's `index` (`choices`). The calls come back on the done event and
are sent as `tool_answers` says.

A completion is checked in full (fields, tier, size on the bus) before it is
charged to the rate limits; then its prompt is fitted to the model's window, and
every message the client sent, whatever its role, is classified by the input safety
check before it is queued.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

import orjson
from fastapi import Request

from common.prompt import template_tools
from conversations.store import ApiKey
from gateway.admission.gates import Ask
from gateway.admission.limits import check_bus_size
from gateway.admission.rate_limits import text_tokens
from gateway.context.builder import ContextBuilder
from gateway.deps import GatewayDeps
from gateway.errors import error_type
from gateway.openai.chat_completions.choices import (
    choice_batches,
    choice_requests,
    start_choices,
    total_usage,
)
from gateway.openai.chat_completions.protocol import to_generation_request
from gateway.openai.chat_completions.tool_answers import StreamedAnswer, finish_reason, message
from gateway.openai.chat_completions.tool_requests import tool_texts
from gateway.refusals import TooLarge, Unacceptable
from gateway.streaming.event_stream import EventStreamResponse
from gateway.streaming.generation import (
    INTERRUPTED,
    Generation,
    LoggedAnswerText,
    StreamTimers,
    collected_all,
    event_stream,
    merged_deltas,
)
from schemas import sse
from schemas.api import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChoiceLogprobs,
    ChunkChoice,
    ChunkDelta,
    CompletionUsage,
    ErrorDetail,
    chat_completion_id,
)
from schemas.events import (
    DeliverEvent,
    DeliveryDone,
    DeliveryError,
    Delta,
    GenerationRequest,
    Logprobs,
    Retract,
    now,
)
from schemas.tools import ToolUse


async def serve_chat_completion(
    completion: ChatCompletionRequest, owner: ApiKey, deps: GatewayDeps, request: Request
) -> ChatCompletion | EventStreamResponse:
    """The completion admitted (`admitted_request`), its `n` choices started, and its
    answer: chunks as SSE when streamed, else the whole completion once every choice ended."""
    generation_request, ask = await admitted_request(completion, owner, deps)
    requests = choice_requests(generation_request, completion.n)
    generations = await start_choices(
        deps.pipeline, requests, deps.live, StreamTimers(deps.config.stream_stall_s), ask.leases
    )
    answer = _Answer.of(generation_request, completion.include_usage)
    if completion.stream:
        choices = [
            _StreamedChoice(answer, index, StreamedAnswer(r.tool_use, r.request_id))
            for index, r in enumerate(requests)
        ]
        return event_stream(chunk_events(answer, generations, choices), *generations)
    return await collect(answer, generations, request)


async def admitted_request(
    completion: ChatCompletionRequest, owner: ApiKey, deps: GatewayDeps
) -> tuple[GenerationRequest, Ask]:
    """The request to queue and its admitted ask, once every check has passed: its
    fields and size (cheap, charging nothing), the caller's budgets, concurrent
    requests and rate limits (charged), then its prompt in the model's window and every
    message through the input classifiers."""
    request = to_generation_request(
        completion, owner, deps.config, deps.pipeline.reply_to, deps.aliases
    )
    ask = await admit_generation(request, owner, deps, choices=completion.n)
    return request, ask


async def admit_generation(
    request: GenerationRequest, owner: ApiKey, deps: GatewayDeps, choices: int = 1
) -> Ask:
    """Every check of an OpenAI-API request after its fields (chat or text completion):
    its size on the bus, the budgets, concurrent requests and rate limits (charged, for
    its `choices`), its prompt in the model's window, its logit bias in the model's
    vocabulary, and what the client wrote through the input classifiers. The ask holds
    a lease per choice."""
    check_bus_size(deps.config.limits, request)
    written = [*(m.content for m in request.messages), *filter(None, [request.prompt])]
    prompt = [*written, *tool_texts(request)]
    tokens = text_tokens(prompt, request.sampling.max_tokens * choices)
    ask = await deps.admission.admit(owner, tokens, request.model, generations=choices)
    await check_window(deps.context, request)
    await check_logit_bias(deps.context, request)
    await deps.admission.check_input(owner, request.model, written)
    return ask


TEMPLATE_TOKENS = 256
"""More than a chat template adds to a prompt's text (role markers, a default system turn)."""
TOKENS_PER_MESSAGE = 16


async def check_window(context: ContextBuilder, request: GenerationRequest) -> None:
    """Refused `context_too_long` unless the prompt leaves the model's window room for an
    answer (the engine ends the answer at the window, `length`). The prompt is tokenized
    only when it might not fit: no token is shorter than a byte."""
    window = context.policy(request.model, 0).max_prompt_tokens
    if request.prompt is not None:
        if len(request.prompt.encode()) + TEMPLATE_TOKENS < window:
            return
        tokens = await context.completion_prompt_tokens(request.model, request.prompt)
        if tokens >= window:
            raise TooLarge(
                "context_too_long",
                f"the prompt needs {tokens} tokens; {request.model} takes {window} in all",
                param="prompt",
            )
        return
    tools = template_tools(request.tool_use)
    most = (
        TEMPLATE_TOKENS
        + len(orjson.dumps(tools))
        + sum(
            len(m.content.encode())
            + TOKENS_PER_MESSAGE
            + sum(len(c.function.arguments.encode()) + TOKENS_PER_MESSAGE for c in m.tool_calls)
            for m in request.messages
        )
    )
    if most < window:
        return
    tokens = await context.prompt_tokens(request.model, request.messages, tools)
    if tokens >= window:
        raise TooLarge(
            "context_too_long",
            f"the prompt needs {tokens} tokens; {request.model} takes {window} in all",
            param="messages",
        )


async def check_logit_bias(context: ContextBuilder, request: GenerationRequest) -> None:
    """`logit_bias` names only tokens the model has (the engine would fail the request)."""
    bias = request.sampling.logit_bias
    if not bias:
        return
    size = await context.vocab_size(request.model)
    unknown = sorted(token for token in bias if token >= size)
    if unknown:
        raise Unacceptable(
            "invalid_logit_bias",
            f"logit_bias names token {unknown[0]}; {request.model} has tokens 0 to {size - 1}",
            param="logit_bias",
        )


_CONTENT_MARK = "\x00content\x00"


@dataclass(frozen=True, slots=True)
class _Answer:
    """What every chunk of one completion repeats."""

    id: str
    model: str
    created: int
    include_usage: bool
    tool_use: ToolUse | None = None
    content_frame: tuple[bytes, bytes] = (b"", b"")
    """A content chunk's frame around its JSON-encoded text (the stream's hot path)."""
    logprobs: bool = False
    """The client asked for the tokens' log probabilities."""

    @classmethod
    def of(cls, request: GenerationRequest, include_usage: bool) -> _Answer:
        answer = cls(
            chat_completion_id(request.request_id),
            request.model,
            int(now()),
            include_usage,
            request.tool_use,
        )
        marked = answer.chunk(ChunkDelta(content=_CONTENT_MARK))
        head, found, tail = marked.partition(orjson.dumps(_CONTENT_MARK))
        assert found, "a chunk's JSON must hold its content as orjson writes it"
        return cls(
            answer.id,
            answer.model,
            answer.created,
            include_usage,
            request.tool_use,
            (head, tail),
            request.sampling.logprobs is not None,
        )

    def chunk(
        self,
        delta: ChunkDelta | None,
        finish_reason: str | None = None,
        index: int = 0,
        logprobs: Logprobs = (),
    ) -> bytes:
        choices = (
            []
            if delta is None
            else [
                ChunkChoice(
                    index=index,
                    delta=delta,
                    finish_reason=finish_reason,
                    logprobs=ChoiceLogprobs.of(logprobs) if logprobs else None,
                )
            ]
        )
        return sse.openai_chunk(
            ChatCompletionChunk(id=self.id, created=self.created, model=self.model, choices=choices)
        )

    def content_chunk(self, text: str) -> bytes:
        """`chunk(ChunkDelta(content=text))`, without building the models."""
        head, tail = self.content_frame
        return head + orjson.dumps(text) + tail

    def usage_chunk(self, usage: CompletionUsage) -> bytes:
        return sse.openai_chunk(
            ChatCompletionChunk(
                id=self.id, created=self.created, model=self.model, choices=[], usage=usage
            )
        )


@dataclass(slots=True)
class _StreamedChoice:
    """One choice of a streamed completion: its chunks from its delivery events."""

    answer: _Answer
    index: int
    streamed: StreamedAnswer
    retracted: bool = False
    end: DeliveryDone | None = None
    failed: bool = False

    def frames(self, batch: list[DeliverEvent]) -> list[bytes]:
        """The chunks for one batch of events; what arrived together is written together."""
        answer, index, frames = self.answer, self.index, []
        for event in merged_deltas(batch):
            match event:
                case Delta() if not self.retracted:
                    frames += self._delta(event)
                case Retract():
                    self.retracted = True  # text already sent cannot be taken back here
                case DeliveryDone():
                    frames += (
                        answer.chunk(chunk, index=index)
                        for chunk in self.streamed.end(event, self.retracted)
                    )
                    reason = finish_reason(self.streamed.tool_use, event, self.retracted)
                    frames.append(answer.chunk(ChunkDelta(), reason, index=index))
                    self.end = event
                case DeliveryError():
                    frames.append(sse.openai_error(_error_detail(event.code, event.message)))
                    self.failed = True
        return frames

    def _delta(self, event: Delta) -> list[bytes]:
        chunks = self.streamed.delta(event.text)
        if chunks is None and self.index == 0 and not event.logprobs:
            return [self.answer.content_chunk(event.text)]
        if chunks is None:
            return [
                self.answer.chunk(
                    ChunkDelta(content=event.text), index=self.index, logprobs=event.logprobs
                )
            ]
        return [self.answer.chunk(chunk, index=self.index) for chunk in chunks]


async def chunk_events(
    answer: _Answer, generations: list[Generation], choices: list[_StreamedChoice]
) -> AsyncIterator[bytes]:
    """The completion's chunks, each choice's with its index; the usage (asked for)
    once every choice has ended; an error of one choice ends them all."""
    yield b"".join(
        answer.chunk(ChunkDelta(role="assistant", content=""), index=choice.index)
        for choice in choices
    )
    async with aclosing(choice_batches(generations)) as batches:
        async for index, batch in batches:
            choice = choices[index]
            frames = choice.frames(batch)
            ended = [c.end for c in choices if c.end is not None]
            if answer.include_usage and choice.end is not None and len(ended) == len(choices):
                frames.append(
                    answer.usage_chunk(
                        CompletionUsage.of(total_usage([end.usage for end in ended]))
                    )
                )
            if frames:
                yield b"".join(frames)
            if choice.failed:
                break
    failed = any(choice.failed for choice in choices)
    if not failed and not all(generation.finished for generation in generations):
        yield interrupted_chunk()
    yield sse.done_marker()


async def collect(
    answer: _Answer, generations: list[Generation], request: Request
) -> ChatCompletion:
    """The whole answer of every choice; a client that disconnects first cancels the
    generations, and an error of one choice ends them all."""
    texts = await collected_all(generations, request, [_ChoiceText() for _ in generations])
    ends: list[DeliveryDone] = []
    for text in texts:
        assert isinstance(text.end, DeliveryDone)
        ends.append(text.end)
    return ChatCompletion(
        id=answer.id,
        created=answer.created,
        model=answer.model,
        choices=[
            text.choice(index, answer, end)
            for index, (text, end) in enumerate(zip(texts, ends, strict=True))
        ],
        usage=CompletionUsage.of(total_usage([end.usage for end in ends])),
    )


class _ChoiceText(LoggedAnswerText):
    """One choice of a whole completion: its text, and its tokens' log probabilities."""

    __slots__ = ()

    def choice(self, index: int, answer: _Answer, end: DeliveryDone) -> Choice:
        retracted = self.retracted
        return Choice(
            index=index,
            message=message(str(self), end, retracted),
            finish_reason=finish_reason(answer.tool_use, end, retracted),
            logprobs=ChoiceLogprobs.of(tuple(self.logprobs))
            if answer.logprobs and not retracted
            else None,
        )


def stream_error_chunk(code: str, message: str) -> bytes:
    """An error in an OpenAI stream, as an error body in a data line."""
    return sse.openai_error(_error_detail(code, message))


def interrupted_chunk() -> bytes:
    """The error ending a stream that stopped before its answer's end."""
    return stream_error_chunk("stream_interrupted", INTERRUPTED)


def _error_detail(code: str, message: str) -> ErrorDetail:
    return ErrorDetail(code=code, message=message, type=error_type(500))
