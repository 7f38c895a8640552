"""`POST /v1/completions`: OpenAI's legacy text completions, prompt in, text out.

The prompt is the engine's prompt as it is: no chat template, no system prompt
(`GenerationRequest.prompt`; the worker tokenizes it with `common.prompt`). Otherwise a
completion is a chat completion's twin: the same checks, charges and input safety
check (`openai_compat.admit_generation`), not stored, cancelled when its client goes;
its usage is on chat.usage and billed as any answer's.

Every field of OpenAI's request is honoured or refused with a 400 naming it
(`unsupported_parameter`): the sampling parameters pass to the engine as a chat
completion's do (penalties, `logit_bias` checked against the vocabulary, vLLM's
`min_p`/`top_k`/`repetition_penalty`); one choice (`n`, `best_of`), no `logprobs`, no
`suffix`; a prompt is one string (token arrays and several prompts are refused:
`unsupported_prompt`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass

from fastapi import APIRouter, Request

from conversations.store import ApiKey
from gateway.admission.limits import choose_model, sampling_options
from gateway.config import GatewayConfig
from gateway.deps import Deps
from gateway.edge.auth import Owner
from gateway.openai.chat_completions.api_router import STREAMED_COMPLETION
from gateway.openai.chat_completions.protocol import check_known_fields
from gateway.openai.chat_completions.serving import (
    admit_generation,
    interrupted_chunk,
    stream_error_chunk,
)
from gateway.openai.chat_completions.tool_answers import finish_reason
from gateway.pipeline import owner_request
from gateway.refusals import TooLarge, Unacceptable
from gateway.rollout import ModelAliases
from gateway.streaming.event_stream import EventStreamResponse
from gateway.streaming.generation import (
    Generation,
    StreamTimers,
    collected,
    event_stream,
    merged_deltas,
    start_generation,
)
from schemas import sse
from schemas.api import CompletionChoice, CompletionRequest, CompletionUsage, TextCompletion
from schemas.events import DeliveryDone, DeliveryError, Delta, GenerationRequest, Retract, now
from schemas.generation import new_id

router = APIRouter(tags=["openai"])


@router.post("/completions", response_model=TextCompletion, responses=STREAMED_COMPLETION)
async def completions(
    body: CompletionRequest, owner: Owner, deps: Deps, request: Request
) -> TextCompletion | EventStreamResponse:
    generation_request = to_generation_request(
        body, owner, deps.config, deps.pipeline.reply_to, deps.aliases
    )
    await admit_generation(generation_request, owner, deps)
    generation = await start_generation(
        deps.pipeline,
        generation_request,
        deps.live,
        timers=StreamTimers(deps.config.stream_stall_s),
    )
    answer = _TextAnswer(f"cmpl-{generation_request.request_id}", generation_request.model,
                         int(now()), body.include_usage,
                         (generation_request.prompt or "") if body.echo else "")  # fmt: skip
    if body.stream:
        return event_stream(completion_chunks(answer, generation), generation)
    text = await collected(generation, request)
    end = text.end
    assert isinstance(end, DeliveryDone)
    reason = finish_reason(None, end, text.retracted)
    return answer.completion(answer.echo + str(text), reason, CompletionUsage.of(end.usage))


_UNSUPPORTED: tuple[tuple[str, Callable[[CompletionRequest], bool], str], ...] = (
    ("n", lambda body: body.n != 1, "one choice per request: send several requests"),
    ("best_of", lambda body: body.best_of not in (None, 1), "one choice per request"),
    ("logprobs", lambda body: body.logprobs is not None, "log probabilities are not returned"),
    ("suffix", lambda body: bool(body.suffix), "no insertion (fill in the middle)"),
)
"""Fields chatpipe cannot honour: (field, set to what it can't honour, why)."""


def to_generation_request(
    body: CompletionRequest,
    owner: ApiKey,
    config: GatewayConfig,
    reply_to: str,
    aliases: ModelAliases | None = None,
) -> GenerationRequest:
    """The request to queue (pure, charging nothing): refused with a 400 naming the first
    field it cannot honour, as a chat completion is for its fields and limits."""
    check_known_fields(body)
    for field, refused, why in _UNSUPPORTED:
        if refused(body):
            raise Unacceptable(
                "unsupported_parameter", f"{field} is not supported: {why}", param=field
            )
    limits = config.limits
    prompt = completion_prompt(body.prompt, limits.max_message_chars)
    conversation_id = new_id()
    choice = choose_model(limits, aliases, body.model, owner.tier, conversation_id)
    sampling = sampling_options(limits, max_tokens=body.max_tokens, temperature=body.temperature,
                                top_p=body.top_p, seed=body.seed, stop=body.stop_sequences,
                                ignore_eos=body.ignore_eos,
                                engine=body.engine_sampling())  # fmt: skip
    request = owner_request(owner, model=choice.model, messages=(), sampling=sampling,
                            reply_to=reply_to, timeout_s=config.request_timeout_s,
                            sent_at=now(), conversation_id=conversation_id,
                            alias=choice.alias)  # fmt: skip
    return request.model_copy(update={"prompt": prompt})


def completion_prompt(prompt: str | list[str] | list[int] | list[list[int]], max_chars: int) -> str:
    """The one text prompt: a string, or a list of one string. Several prompts (a batch of
    choices) and token arrays (token ids are one model's) are refused, as is an empty
    prompt or one longer than `max_chars` (413)."""
    if isinstance(prompt, list):
        if len(prompt) != 1 or not isinstance(prompt[0], str):
            kind = (
                "token arrays" if prompt and not isinstance(prompt[0], str) else "several prompts"
            )
            raise Unacceptable(
                "unsupported_prompt",
                f"{kind} are not taken: send one prompt as a string",
                param="prompt",
            )
        prompt = prompt[0]
    assert isinstance(prompt, str)
    if not prompt:
        raise Unacceptable("empty_prompt", "the prompt is empty", param="prompt")
    if len(prompt) > max_chars:
        raise TooLarge(
            "prompt_too_long", f"a prompt holds at most {max_chars} characters", param="prompt"
        )
    return prompt


@dataclass(frozen=True, slots=True)
class _TextAnswer:
    """What every chunk of one text completion repeats."""

    id: str
    model: str
    created: int
    include_usage: bool
    echo: str
    """The prompt, when the client asked for it back before the completion."""

    def completion(
        self, text: str, reason: str | None, usage: CompletionUsage | None = None
    ) -> TextCompletion:
        choices = [CompletionChoice(text=text, finish_reason=reason)]
        return TextCompletion(id=self.id, created=self.created, model=self.model,
                              choices=choices, usage=usage)  # fmt: skip

    def chunk(self, text: str, reason: str | None = None) -> bytes:
        return sse.openai_chunk(self.completion(text, reason))

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
    async with aclosing(generation.batches()) as batches:
        async for batch in batches:
            frames: list[bytes] = []
            for event in merged_deltas(batch):
                match event:
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
