"""Checks of one request against what this deployment serves and allows.

All of them are pure and cheap (no store, no tokenizer): the routes run them before
a request is charged to the rate limits or anything is stored. They refuse with
`gateway.refusals`'s kinds of refusal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import ValidationError

from gateway.config import RequestLimits
from gateway.refusals import Invalid, NotAllowed, NotFound, TooLarge, Unacceptable
from gateway.rollout import ModelAliases, ModelChoice
from schemas.codec import encode
from schemas.events import GenerationRequest, SamplingOptions, StreamPosition, WorkAssignment
from schemas.topics import Tier

BUS_MESSAGE_BYTES = 1 << 20
"""The largest record every hop of the bus takes: Kafka's default `message.max.bytes`
(1,048,588) rounded down; Tansu takes more."""

BUS_HEADROOM_BYTES = 64 << 10
"""Kept free below `BUS_MESSAGE_BYTES`: record and batch overhead, headers, and lz4's
growth on text it cannot compress (about 0.4 %)."""

_LARGEST = 1 << 63
"""A stand-in for the numbers later hops write (offsets, epochs): their longest form."""


def served_model(limits: RequestLimits, requested: str | None, tier: Tier) -> str:
    """The model to run: the one asked for, or the default; `model_not_found` if it is not
    served here, `model_not_allowed` if the caller's tier may not use it
    (`CHATPIPE_TIER_MODELS`)."""
    allowed = limits.tier_models.get(tier)
    if requested is None:
        default = limits.default_model
        if allowed is None or default in allowed:
            return default
        # The tier's first allowed model stands in for a default it may not use.
        requested = next((m for m in allowed if m in limits.models), default)
    if requested not in limits.models:
        raise NotFound("model_not_found", f"model {requested!r} is not served here", param="model")
    if allowed is not None and requested not in allowed:
        raise NotAllowed(
            "model_not_allowed", f"the {tier} tier may not use model {requested!r}", param="model"
        )
    return requested


def choose_model(
    limits: RequestLimits,
    aliases: ModelAliases | None,
    requested: str | None,
    tier: Tier,
    conversation_id: str,
) -> ModelChoice:
    """`served_model`, or for an alias the version `conversation_id` runs on. A tier
    limited to some models may use an alias it is allowed, or the version picked."""
    choice = aliases.choose(requested, conversation_id) if aliases is not None else None
    if choice is None:
        return ModelChoice(served_model(limits, requested, tier))
    allowed = limits.tier_models.get(tier)
    if allowed is not None and choice.alias not in allowed and choice.model not in allowed:
        raise NotAllowed(
            "model_not_allowed",
            f"the {tier} tier may not use model {choice.alias!r}",
            param="model",
        )
    return choice


def check_message(limits: RequestLimits, content: str, *, allow_empty: bool = False) -> None:
    if not allow_empty and not content.strip():
        raise Unacceptable("empty_message", "the message is empty", param="content")
    if len(content) > limits.max_message_chars:
        raise TooLarge(
            "message_too_long",
            f"a message holds at most {limits.max_message_chars} characters",
            param="content",
        )


def check_message_count(limits: RequestLimits, count: int) -> None:
    if count > limits.max_messages:
        raise Invalid(
            "too_many_messages",
            f"a request carries at most {limits.max_messages} messages",
            param="messages",
        )


def check_stop(limits: RequestLimits, stop: Sequence[str]) -> None:
    """Stop sequences are matched against every chunk of the answer: few and short."""
    if len(stop) > limits.max_stop_sequences:
        raise Invalid(
            "too_many_stop_sequences",
            f"at most {limits.max_stop_sequences} stop sequences",
            param="stop",
        )
    if any(len(sequence) > limits.max_stop_chars for sequence in stop):
        raise Invalid(
            "stop_too_long",
            f"a stop sequence holds at most {limits.max_stop_chars} characters",
            param="stop",
        )


def sampling_options(
    limits: RequestLimits,
    *,
    max_tokens: int | None,
    temperature: float | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop: tuple[str, ...] = (),
    ignore_eos: bool = False,
    engine: Mapping[str, object] | None = None,
) -> SamplingOptions:
    """SamplingOptions from request fields; unset fields take the defaults. `engine`:
    further `SamplingOptions` fields, set as given (OpenAI's penalties, `logit_bias`,
    vLLM's extras, `logprobs`, a JSON format: `gateway.openai.chat_completions.protocol`)."""
    if max_tokens is not None and max_tokens > limits.max_tokens_limit:
        raise Invalid(
            "max_tokens_too_large",
            f"max_tokens is at most {limits.max_tokens_limit}",
            param="max_tokens",
        )
    check_stop(limits, stop)
    given = {"temperature": temperature, "top_p": top_p, "seed": seed}
    try:
        return SamplingOptions(
            max_tokens=limits.default_max_tokens if max_tokens is None else max_tokens,
            stop=stop,
            ignore_eos=ignore_eos,
            **{name: value for name, value in given.items() if value is not None},
            **(engine or {}),
        )
    except ValidationError as exc:
        error = exc.errors()[0]
        param = ".".join(str(part) for part in error["loc"])
        raise Invalid("invalid_request", f"{param}: {error['msg']}", param=param) from exc


def bus_bytes(request: GenerationRequest, served: Sequence[str]) -> int:
    """The request's size at its largest hop: wrapped in the scheduler's `WorkAssignment`
    with every field a later hop sets at its longest (a routed model, stream offsets,
    worker ids)."""
    dispatched = request.model_copy(update={
        "attempt": _LARGEST, "model": max([*served, request.model], key=len),
        "requested_model": request.model,
        "stream": StreamPosition(partition=_LARGEST, start_offset=_LARGEST,
                                 attempt_offset=_LARGEST)})  # fmt: skip
    assignment = WorkAssignment(worker_id="w" * 128, incarnation="i" * 64, request=dispatched,
                                epoch=_LARGEST)  # fmt: skip
    return len(encode(assignment))


def check_bus_size(limits: RequestLimits, request: GenerationRequest) -> None:
    """`request_too_large` unless the request fits every hop of the bus: one that did
    not would fail at a later hop, after it was admitted and charged."""
    room = BUS_MESSAGE_BYTES - BUS_HEADROOM_BYTES
    size = bus_bytes(request, limits.models)
    if size > room:
        raise TooLarge(
            "request_too_large",
            f"the request takes {size} bytes on the bus, which carries at most "
            f"{room}; send fewer or shorter messages",
        )
