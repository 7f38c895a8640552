"""A text completion request (`POST /v1/completions`, OpenAI's legacy text completions,
prompt in, text out) turned into the `GenerationRequest` it asks for, in one place
(`to_generation_request`).

The prompt is the engine's prompt as it is: no chat template, no system prompt
(`GenerationRequest.prompt`; the worker tokenizes it with `common.prompt`).

Every field of OpenAI's request is honoured or refused with a 400 naming it
(`unsupported_parameter`): the sampling parameters pass to the engine as a chat
completion's do (penalties, `logit_bias` checked against the vocabulary, vLLM's
`min_p`/`top_k`/`repetition_penalty`), `logprobs` too (not with `echo`: the prompt's
are not returned); one choice (`n`, `best_of`), no `suffix`; a prompt is one string
(token arrays and several prompts are refused: `unsupported_prompt`).
"""

from __future__ import annotations

from collections.abc import Callable

from conversations.store import ApiKey
from gateway.admission.limits import choose_model, sampling_options
from gateway.config import GatewayConfig
from gateway.openai.chat_completions.protocol import check_known_fields
from gateway.pipeline import owner_request
from gateway.refusals import TooLarge, Unacceptable
from gateway.rollout import ModelAliases
from schemas.api import CompletionRequest
from schemas.events import GenerationRequest, now
from schemas.generation import new_id

_UNSUPPORTED: tuple[tuple[str, Callable[[CompletionRequest], bool], str], ...] = (
    ("n", lambda body: body.n != 1, "one choice per request: send several requests"),
    ("best_of", lambda body: body.best_of not in (None, 1), "one choice per request"),
    (
        "logprobs",
        lambda body: body.logprobs is not None and body.echo,
        "with echo (the prompt's log probabilities are not returned)",
    ),
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
    logprobs = {} if body.logprobs is None else {"logprobs": body.logprobs}
    choice = choose_model(limits, aliases, body.model, owner.tier, conversation_id)
    sampling = sampling_options(limits, max_tokens=body.max_tokens, temperature=body.temperature,
                                top_p=body.top_p, seed=body.seed, stop=body.stop_sequences,
                                ignore_eos=body.ignore_eos,
                                engine={**body.engine_sampling(), **logprobs})  # fmt: skip
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
