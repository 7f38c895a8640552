"""A chat completion request turned into the `GenerationRequest` it asks for, in one
place (`to_generation_request`): every field of OpenAI's request honoured or refused,
the model chosen, the messages and tools read, this API's limits checked.

Pure, like `gateway.admission.limits`: it runs before anything is charged or queued. A field
chatpipe honours passes to the engine with OpenAI's meaning (`chat_sampling`): the
sampling parameters, vLLM's extras, `logprobs`, and `response_format`, held by the
engine's structured outputs. A field chatpipe cannot honour is refused 400
`unsupported_parameter` naming it (`param`) once it is set to anything but null,
or to a value other than what chatpipe does anyway (`store: false`, `service_tier:
auto`); a field OpenAI does not define is refused 400 `unknown_parameter`, as OpenAI
refuses it. Tools and tool messages are read by `tool_requests`.
"""

from __future__ import annotations

from pydantic import BaseModel

from conversations.store import ApiKey
from gateway.admission.limits import (
    check_message,
    check_message_count,
    choose_model,
    sampling_options,
)
from gateway.config import GatewayConfig, RequestLimits
from gateway.openai.chat_completions.tool_requests import chat_messages, schema_error, tool_use
from gateway.pipeline import owner_request
from gateway.refusals import Invalid, Unacceptable
from gateway.rollout import ModelAliases
from schemas.api import ChatCompletionRequest
from schemas.bounds import SEED_LIMIT
from schemas.events import GenerationRequest, SamplingOptions, now
from schemas.generation import new_id

REFUSED: dict[str, str] = {
    "audio": "chatpipe's models write text, not audio",
    "functions": "the deprecated function calling; send `tools`",
    "function_call": "the deprecated function calling; send `tool_choice`",
    "prediction": "the engine has no predicted outputs",
    "web_search_options": "no model served here searches the web",
    "reasoning_effort": "no model served here is a reasoning model",
    "verbosity": "no model served here takes a verbosity",
    "moderation": "chatpipe's own safety checks run on every request",
    "prompt_cache_options": "the prefix cache has no breakpoints or lifetimes to set",
}
"""Fields refused unless null, and why."""

ACCEPTED: dict[str, tuple[list[object], str]] = {
    "service_tier": (["auto", "default"], "the API key's tier decides the request's priority"),
    "store": ([False], "a completion is never stored (the conversations API stores answers)"),
    "prompt_cache_retention": (["in_memory"], "the prefix cache lives in the engine's memory"),
    "modalities": ([["text"]], "chatpipe's models write text"),
}
"""Fields refused unless null or one of these values (JSON), and why."""


def to_generation_request(
    completion: ChatCompletionRequest,
    owner: ApiKey,
    config: GatewayConfig,
    reply_to: str,
    aliases: ModelAliases | None = None,
) -> GenerationRequest:
    """A completion has no conversation: each is one of its own, so an alias picks a
    version per completion."""
    limits = config.limits
    check_parameters(completion, limits)
    conversation_id = new_id()
    choice = choose_model(limits, aliases, completion.model, owner.tier, conversation_id)
    check_message_count(limits, len(completion.messages))
    for message in completion.messages:
        for text in message.texts:
            check_message(limits, text, allow_empty=True)
    sampling = chat_sampling(completion, limits)
    tools = tool_use(completion, limits)
    request = owner_request(owner, model=choice.model,
                            messages=chat_messages(completion.messages), sampling=sampling,
                            reply_to=reply_to, timeout_s=config.request_timeout_s,
                            sent_at=now(), conversation_id=conversation_id,
                            alias=choice.alias)  # fmt: skip
    return request if tools is None else request.model_copy(update={"tool_use": tools})


def check_parameters(completion: ChatCompletionRequest, limits: RequestLimits) -> None:
    """Refuse what chatpipe cannot honour, naming the field: an unknown one first."""
    check_known_fields(completion)
    for name, why in REFUSED.items():
        if getattr(completion, name) is not None:
            raise Unacceptable(
                "unsupported_parameter", f"{name} is not supported: {why}", param=name
            )
    for name, (values, why) in ACCEPTED.items():
        value = getattr(completion, name)
        if value is not None and value not in values:
            raise Unacceptable(
                "unsupported_value", f"{name} {value!r} is not supported: {why}", param=name
            )
    if completion.top_logprobs is not None and not completion.logprobs:
        raise Unacceptable(
            "invalid_value", "top_logprobs needs logprobs: true", param="top_logprobs"
        )
    for name in ("max_tokens", "max_completion_tokens"):
        value = getattr(completion, name)
        if value is not None and value > limits.max_tokens_limit:
            raise Invalid(
                "max_tokens_too_large", f"{name} is at most {limits.max_tokens_limit}", param=name
            )
    if completion.n > limits.max_choices:
        raise Invalid("too_many_choices", f"n is at most {limits.max_choices}", param="n")
    schema = completion.json_format.get("json_schema")
    if isinstance(schema, dict) and (error := schema_error(schema)) is not None:
        raise Unacceptable(
            "invalid_response_format",
            f"response_format's schema is not a JSON Schema chatpipe takes: {error}",
            param="response_format.json_schema.schema",
        )


def check_known_fields(body: BaseModel) -> None:
    """A field the OpenAI request (`body`, kept in its `model_extra`) does not define:
    400 `unknown_parameter` naming it, as OpenAI refuses it."""
    for name in body.model_extra or {}:
        raise Unacceptable(
            "unknown_parameter", f"Unrecognized request argument supplied: {name}", param=name
        )


def chat_sampling(completion: ChatCompletionRequest, limits: RequestLimits) -> SamplingOptions:
    """The engine's sampling for `completion`'s first choice (`choice_sampling` for the
    others)."""
    logprobs = (completion.top_logprobs or 0) if completion.logprobs else None
    return sampling_options(
        limits,
        max_tokens=completion.output_limit,
        temperature=completion.temperature,
        top_p=completion.top_p,
        seed=completion.seed,
        stop=completion.stop_sequences,
        ignore_eos=completion.ignore_eos,
        engine={
            **completion.engine_sampling(),
            **completion.json_format,
            **({} if logprobs is None else {"logprobs": logprobs}),
        },
    )


def choice_sampling(sampling: SamplingOptions, index: int) -> SamplingOptions:
    """Choice `index` of several: with a seed, seed + index (as vLLM seeds the choices of
    one request with `n`), so the choices differ and each is reproducible."""
    if sampling.seed is None or index == 0:
        return sampling
    return sampling.model_copy(update={"seed": (sampling.seed + index) % SEED_LIMIT})
