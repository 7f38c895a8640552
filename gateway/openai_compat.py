"""OpenAI-compatible routes: `GET /v1/models` and `POST /v1/chat/completions`.

Requests run through the same pipeline as native turns but are not stored
(`store=False`, a fresh conversation id each). Queue updates have no OpenAI
form and are skipped; a retraction replaces the collected text of a
non-streamed answer and ends a streamed one with `content_filter`.

Tools (`tools`, `tool_choice`, `parallel_tool_calls`, `tool` messages) are read by
`gateway.tool_requests`; the calls come back on the done event and are sent as
`gateway.tool_answers` says.

A completion is checked in full (fields, tier, size on the bus) before it is
charged to the rate limits; then its prompt is fitted to the model's window, and
every message the client sent, whatever its role, is classified by the input safety
check before it is queued.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

import anyio
import orjson
from fastapi import APIRouter, Request

from common.prompt import template_tools
from conversations.store import ApiKey
from gateway.admission import admit, check_input
from gateway.auth import Owner
from gateway.config import GatewayConfig
from gateway.context_builder import ContextBuilder
from gateway.core import TooLarge, owner_request
from gateway.deps import Deps, GatewayDeps
from gateway.embeddings import served_embedding_model
from gateway.errors import ApiError, error_responses, error_type, from_delivery_error
from gateway.event_stream import EventStreamResponse
from gateway.generation import (
    Generation,
    StreamTimers,
    event_stream,
    merged_deltas,
    start_generation,
    until_disconnected,
)
from gateway.limits import (
    check_bus_size,
    check_message,
    check_message_count,
    choose_model,
    sampling_options,
)
from gateway.rate_limits import text_tokens
from gateway.rollout import ModelAliases
from gateway.tool_answers import StreamedAnswer, finish_reason, message
from gateway.tool_requests import chat_messages, tool_texts, tool_use
from schemas import sse
from schemas.answer import AnswerText
from schemas.api import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChunkChoice,
    ChunkDelta,
    CompletionUsage,
    ErrorDetail,
    ModelCard,
    ModelList,
)
from schemas.events import (
    DeliveryDone,
    DeliveryError,
    Delta,
    GenerationRequest,
    Retract,
    now,
)
from schemas.generation import new_id
from schemas.tools import ToolUse

router = APIRouter(tags=["openai"])


@router.get("/models")
async def list_models(deps: Deps, owner: Owner) -> ModelList:
    """The models served here that the caller's tier may use, then the aliases, then the
    embedding model (`/v1/embeddings`, every tier)."""
    allowed = deps.config.limits.tier_models.get(owner.tier)
    names = [*deps.config.limits.models, *(deps.aliases.names if deps.aliases else ())]
    cards = [ModelCard(id=name) for name in names if allowed is None or name in allowed]
    embedding_model = served_embedding_model(deps)
    if embedding_model is not None:
        cards.append(ModelCard(id=embedding_model))
    return ModelList(data=cards)


STREAMED_COMPLETION = {
    200: {"content": {"text/event-stream": {}},
          "description": "the completion; with `stream`, its chunks as SSE"},
    **error_responses(400, 403, 404, 413, 429, 500, 502, 503)}  # fmt: skip
"""The answers of a completion route (chat or text): JSON, or SSE when streamed."""


@router.post("/chat/completions", response_model=ChatCompletion, responses=STREAMED_COMPLETION)
async def chat_completions(
    completion: ChatCompletionRequest, owner: Owner, deps: Deps, request: Request
) -> ChatCompletion | EventStreamResponse:
    generation_request = await admitted_request(completion, owner, deps)
    generation = await start_generation(deps.pipeline, generation_request, deps.live,
                                        timers=StreamTimers(deps.config.stream_stall_s))
    answer = _Answer.of(generation_request, completion.include_usage)
    if completion.stream:
        streamed = StreamedAnswer(generation_request.tool_use, generation_request.request_id)
        return event_stream(chunk_events(answer, generation, streamed), generation)
    return await collect(answer, generation, request)


async def admitted_request(
    completion: ChatCompletionRequest, owner: ApiKey, deps: GatewayDeps
) -> GenerationRequest:
    """The request to queue, once every check has passed: its fields and size (cheap,
    charging nothing), the caller's budgets and rate limits (charged), then its prompt
    in the model's window and every message through the input classifiers."""
    request = to_generation_request(completion, owner, deps.config, deps.pipeline.reply_to,
                                    deps.aliases)
    await admit_generation(request, owner, deps)
    return request


async def admit_generation(request: GenerationRequest, owner: ApiKey, deps: GatewayDeps) -> None:
    """Every check of an OpenAI-API request after its fields (chat or text completion):
    its size on the bus, the budgets and rate limits (charged), its prompt in the model's
    window, and what the client wrote through the input classifiers."""
    check_bus_size(deps.config.limits, request)
    written = [*(m.content for m in request.messages), *filter(None, [request.prompt])]
    prompt = [*written, *tool_texts(request)]
    await admit(deps.gates, owner, text_tokens(prompt, request.sampling.max_tokens))
    await check_window(deps.context, request)
    await check_input(deps.gates, owner, request.model, written)


def to_generation_request(
    completion: ChatCompletionRequest, owner: ApiKey, config: GatewayConfig, reply_to: str,
    aliases: ModelAliases | None = None,
) -> GenerationRequest:
    """A completion has no conversation: each is one of its own, so an alias picks a
    version per completion."""
    limits = config.limits
    conversation_id = new_id()
    choice = choose_model(limits, aliases, completion.model, owner.tier, conversation_id)
    check_message_count(limits, len(completion.messages))
    for message in completion.messages:
        for text in message.texts:
            check_message(limits, text, allow_empty=True)
    sampling = sampling_options(
        limits,
        max_tokens=completion.output_limit,
        temperature=completion.temperature,
        top_p=completion.top_p,
        seed=completion.seed,
        stop=completion.stop_sequences,
        ignore_eos=completion.ignore_eos,
    )
    tools = tool_use(completion, limits)
    request = owner_request(owner, model=choice.model,
                            messages=chat_messages(completion.messages), sampling=sampling,
                            reply_to=reply_to, timeout_s=config.request_timeout_s,
                            sent_at=now(), conversation_id=conversation_id,
                            alias=choice.alias)  # fmt: skip
    return request if tools is None else request.model_copy(update={"tool_use": tools})


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
            raise TooLarge("context_too_long", f"the prompt needs {tokens} tokens; "
                           f"{request.model} takes {window} in all", param="prompt")
        return
    tools = template_tools(request.tool_use)
    most = TEMPLATE_TOKENS + len(orjson.dumps(tools)) + sum(
        len(m.content.encode()) + TOKENS_PER_MESSAGE
        + sum(len(c.function.arguments.encode()) + TOKENS_PER_MESSAGE for c in m.tool_calls)
        for m in request.messages)
    if most < window:
        return
    tokens = await context.prompt_tokens(request.model, request.messages, tools)
    if tokens >= window:
        raise TooLarge("context_too_long", f"the prompt needs {tokens} tokens; "
                       f"{request.model} takes {window} in all", param="messages")


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

    @classmethod
    def of(cls, request: GenerationRequest, include_usage: bool) -> _Answer:
        answer = cls(f"chatcmpl-{request.request_id}", request.model, int(now()), include_usage,
                     request.tool_use)
        marked = answer.chunk(ChunkDelta(content=_CONTENT_MARK))
        head, found, tail = marked.partition(orjson.dumps(_CONTENT_MARK))
        assert found, "a chunk's JSON must hold its content as orjson writes it"
        return cls(answer.id, answer.model, answer.created, include_usage, request.tool_use,
                   (head, tail))

    def chunk(self, delta: ChunkDelta | None, finish_reason: str | None = None) -> bytes:
        choices = [] if delta is None else [ChunkChoice(delta=delta, finish_reason=finish_reason)]
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


async def chunk_events(answer: _Answer, generation: Generation,
                       streamed: StreamedAnswer) -> AsyncIterator[bytes]:
    """The completion's chunks; what arrived together is written together."""
    yield answer.chunk(ChunkDelta(role="assistant", content=""))
    retracted = False
    async with aclosing(generation.batches()) as batches:
        async for batch in batches:
            frames: list[bytes] = []
            for event in merged_deltas(batch):
                match event:
                    case Delta() if not retracted:
                        chunks = streamed.delta(event.text)
                        if chunks is None:
                            frames.append(answer.content_chunk(event.text))
                        else:
                            frames += (answer.chunk(chunk) for chunk in chunks)
                    case Retract():
                        retracted = True  # text already sent cannot be taken back here
                    case DeliveryDone():
                        frames += (answer.chunk(chunk) for chunk in streamed.end(event, retracted))
                        reason = finish_reason(streamed.tool_use, event, retracted)
                        frames.append(answer.chunk(ChunkDelta(), reason))
                        if answer.include_usage:
                            frames.append(answer.usage_chunk(CompletionUsage.of(event.usage)))
                    case DeliveryError():
                        frames.append(sse.openai_error(_error_detail(event.code, event.message)))
            if frames:
                yield b"".join(frames)
    if not generation.finished:
        yield sse.openai_error(_error_detail("stream_interrupted", _INTERRUPTED))
    yield sse.done_marker()


async def collect(answer: _Answer, generation: Generation, request: Request) -> ChatCompletion:
    """The whole answer; a client that disconnects first cancels the generation."""
    text, end = await whole_answer(generation, request)
    return ChatCompletion(
        id=answer.id,
        created=answer.created,
        model=answer.model,
        choices=[Choice(message=message(str(text), end, text.retracted),
                        finish_reason=finish_reason(answer.tool_use, end, text.retracted))],
        usage=CompletionUsage.of(end.usage),
    )


async def whole_answer(
    generation: Generation, request: Request
) -> tuple[AnswerText, DeliveryDone]:
    """The answer and its end, once it has ended; a client that disconnects first cancels
    the generation (499), an answer that failed or stopped early is its error."""
    text = AnswerText()
    disconnected = False
    async with anyio.create_task_group() as listeners:

        async def cancel_on_disconnect() -> None:
            nonlocal disconnected
            await until_disconnected(request)
            disconnected = True
            listeners.cancel_scope.cancel()

        listeners.start_soon(cancel_on_disconnect)
        async with aclosing(generation.events()) as events:
            await text.read(events)
        listeners.cancel_scope.cancel()
    match end := text.end:
        case None if disconnected:
            raise ApiError(499, "client_disconnected", "the client went away")
        case None:
            raise ApiError(502, "stream_interrupted", _INTERRUPTED)
        case DeliveryError():
            raise from_delivery_error(end)
    return text, end


_INTERRUPTED = "the answer stopped before its end"


def stream_error_chunk(code: str, message: str) -> bytes:
    """An error in an OpenAI stream, as an error body in a data line."""
    return sse.openai_error(_error_detail(code, message))


def interrupted_chunk() -> bytes:
    """The error ending a stream that stopped before its answer's end."""
    return stream_error_chunk("stream_interrupted", _INTERRUPTED)


def _error_detail(code: str, message: str) -> ErrorDetail:
    return ErrorDetail(code=code, message=message, type=error_type(500))
