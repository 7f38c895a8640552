"""A Responses API request read as what it runs as: a native turn's options when stored
(`turn_options`), a chat completion when not (`chat_completion`, then turned into its
`GenerationRequest` as any chat completion is). A field chatpipe does not honour is a
400 naming it (`check_fields`, after `schemas.responses.refused_fields`).

Function tools, function call items and a JSON `text.format` become the chat
completion's `tools`, `tool_choice`, `parallel_tool_calls`, assistant `tool_calls`,
`tool` messages and `response_format`, so the chat route's checks, constrained decoding
and tool parser serve them; a refusal of theirs names the Responses field
(`responses_param`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

from conversations.store import StoredMessage
from gateway.config import RequestLimits
from gateway.refusals import Invalid, Refused, Unacceptable
from schemas.api import (
    ChatCompletionRequest,
    FunctionName,
    InputMessage,
    JsonObjectFormat,
    JsonSchemaFormat,
    JsonSchemaResponseFormat,
    NamedToolChoice,
    ResponseFormat,
    TurnOptions,
)
from schemas.responses import (
    INSTEAD,
    FunctionCallItem,
    FunctionCallOutput,
    FunctionTool,
    HostedTool,
    InputItem,
    ResponseRequest,
    TextFormatJsonSchema,
    ToolChoiceNamed,
    refused_fields,
    unread_parts,
)
from schemas.tools import FunctionCall, FunctionSpec, ToolCall, ToolSpec


def check_fields(body: ResponseRequest, limits: RequestLimits) -> None:
    """400 naming the first field set that chatpipe does not honour, or a combination it
    cannot; 422 for `max_output_tokens` over the limit, naming it (the turn or the chat
    completion it runs as calls it `max_tokens`)."""
    refused = refused_fields(body)
    if refused:
        name, code = refused[0]
        instead = INSTEAD.get(name)
        message = f"{name!r} is not supported here" + (f": {instead}" if instead else "")
        raise Unacceptable(code, message, param=name)
    for param, kind, part in unread_parts(body.input):
        if part:
            raise Unacceptable(
                "unsupported_content",
                f"content parts of type {kind!r} are not supported here: chatpipe's models "
                "read text; send it as an input_text part (a document can be uploaded to "
                "POST /v1/files and asked about on the native API with file_ids)",
                param=param,
            )
        raise Unacceptable(
            "unsupported_input_item",
            f"input items of type {kind!r} are not supported here: chatpipe takes message, "
            "function_call and function_call_output items (previous_response_id carries "
            "an earlier stored response)",
            param=param,
        )
    for index, tool in enumerate(body.tools or ()):
        if isinstance(tool, HostedTool):
            raise Unacceptable(
                "unsupported_tool",
                f"tools of type {tool.type!r} are not supported here: chatpipe offers the "
                "model function tools only",
                param=f"tools.{index}.type",
            )
    choice = body.tool_choice
    if isinstance(choice, ToolChoiceNamed) and (choice.type != "function" or not choice.name):
        raise Unacceptable(
            "unsupported_tool_choice",
            "tool_choice is none, auto, required or {type: function, name}",
            param="tool_choice",
        )
    if body.background and not body.store:
        raise Unacceptable("invalid_request", "background needs store", param="background")
    if body.background and body.runs_as_completion:
        raise Unacceptable(
            "invalid_request",
            "background needs a stored response; one with tools, function calls or a JSON "
            "text format is not stored",
            param="background",
        )
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
    response's thread (`history`), `input`; its tools and text format."""
    instructions = body.all_instructions
    messages = [
        *([InputMessage(role="system", content=instructions)] if instructions else []),
        *(InputMessage(role=m.role.value, content=m.content) for m in history),
        *input_messages(body.conversation_items),
    ]  # fmt: skip
    tools = [_tool_spec(tool) for tool in body.tools or () if isinstance(tool, FunctionTool)]
    return ChatCompletionRequest(
        model=model,
        messages=messages,
        max_tokens=body.max_output_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        tools=tools or None,
        tool_choice=_tool_choice(body.tool_choice),
        parallel_tool_calls=body.parallel_tool_calls,
        response_format=_response_format(body),
    )


def input_messages(
    items: list[InputItem | FunctionCallItem | FunctionCallOutput],
) -> list[InputMessage]:
    """The chat messages of `input`: function calls join the assistant message before
    them (one message per answer), a call's output is a `tool` message."""
    messages: list[InputMessage] = []
    for item in items:
        match item:
            case InputItem():
                messages.append(InputMessage(role=item.role, content=item.text))
            case FunctionCallOutput():
                messages.append(
                    InputMessage(role="tool", content=item.text, tool_call_id=item.call_id)
                )
            case FunctionCallItem():
                call = ToolCall(
                    id=item.call_id,
                    function=FunctionCall(name=item.name, arguments=item.arguments),
                )
                last = messages[-1] if messages else None
                if last is not None and last.role == "assistant":
                    last.tool_calls = [*(last.tool_calls or ()), call]
                else:
                    messages.append(InputMessage(role="assistant", tool_calls=[call]))
    return messages


def _tool_spec(tool: FunctionTool) -> ToolSpec:
    return ToolSpec(function=FunctionSpec.model_validate(tool.model_dump(exclude={"type"})))


def _tool_choice(
    choice: str | ToolChoiceNamed | None,
) -> NamedToolChoice | str | None:
    if isinstance(choice, ToolChoiceNamed):
        assert choice.name is not None, "check_fields refuses a choice naming no function"
        return NamedToolChoice(function=FunctionName(name=choice.name))
    return choice


def _response_format(body: ResponseRequest) -> ResponseFormat | None:
    text_format = body.text.format if body.text is not None else None
    match text_format:
        case TextFormatJsonSchema():
            return JsonSchemaResponseFormat(
                type="json_schema",
                json_schema=JsonSchemaFormat(
                    name=text_format.name,
                    description=text_format.description,
                    json_schema=text_format.json_schema,
                    strict=text_format.strict,
                ),
            )
        case None:
            return None
    return JsonObjectFormat(type="json_object") if text_format.type == "json_object" else None


_PARAMS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"^tools\.(\d+)\.function\.(.*)$"), r"tools.\1.\2"),
    (re.compile(r"^tool_choice\.function\.name$"), "tool_choice.name"),
    (re.compile(r"^response_format\.json_schema\.(.*)$"), r"text.format.\1"),
    (re.compile(r"^response_format$"), "text.format"),
    (re.compile(r"^messages(\..*)?$"), "input"),
]


def responses_param(param: str | None) -> str | None:
    """The Responses API's name of a chat completion's field (`param` of a refusal)."""
    for pattern, name in _PARAMS:
        if param is not None and pattern.match(param):
            return pattern.sub(name, param)
    return param


@contextmanager
def named_as_responses() -> Iterator[None]:
    """A refusal raised inside, its `param` renamed to the Responses API's field."""
    try:
        yield
    except Refused as refused:
        refused.param = responses_param(refused.param)
        raise
