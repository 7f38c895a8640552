"""A Responses API request read as what it runs as: a native turn's options when stored
(`turn_options`), a chat completion when not (`chat_completion`, then turned into its
`GenerationRequest` as any chat completion is). A field chatpipe does not honour is a
400 naming it (`check_fields`, after `schemas.responses.refused_fields`).
"""

from __future__ import annotations

from conversations.store import StoredMessage
from gateway.config import RequestLimits
from gateway.refusals import Invalid, Unacceptable
from schemas.api import ChatCompletionRequest, InputMessage, TurnOptions
from schemas.responses import ResponseRequest, refused_fields


def check_fields(body: ResponseRequest, limits: RequestLimits) -> None:
    """400 naming the first field set that chatpipe does not honour, or a combination it
    cannot; 422 for `max_output_tokens` over the limit, naming it (the turn or the chat
    completion it runs as calls it `max_tokens`)."""
    refused = refused_fields(body)
    if refused:
        name, code = refused[0]
        raise Unacceptable(code, f"{name!r} is not supported here", param=name)
    if body.background and not body.store:
        raise Unacceptable("invalid_request", "background needs store", param="background")
    most = limits.max_tokens_limit
    if body.max_output_tokens is not None and body.max_output_tokens > most:
        raise Invalid(
            "max_tokens_too_large",
            f"max_output_tokens is at most {most}",
            param="max_output_tokens",
        )


def turn_options(body: ResponseRequest) -> TurnOptions:
    """The native turn's options of a stored response."""
    return TurnOptions(
        model=body.model,
        max_tokens=body.max_output_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
    )


def chat_completion(
    body: ResponseRequest, history: list[StoredMessage], model: str
) -> ChatCompletionRequest:
    """An unstored response as a chat completion: the instructions, the previous
    response's thread (`history`), `input`."""
    instructions = body.all_instructions
    messages = [
        *([InputMessage(role="system", content=instructions)] if instructions else []),
        *(InputMessage(role=m.role.value, content=m.content) for m in history),
        *(InputMessage(role=item.role, content=item.text) for item in body.conversation_items),
    ]  # fmt: skip
    return ChatCompletionRequest(
        model=model,
        messages=messages,
        max_tokens=body.max_output_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
    )
