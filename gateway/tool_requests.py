"""Tool calling on `/v1/chat/completions`, read from the request (issue 16, point 1):
the tools it offers and how the model may use them (`tool_use`), and its messages with
the calls an assistant made and the tools' results (`chat_messages`).

Pure: a request OpenAI would refuse is refused here, `Unacceptable` (400) naming the
field at fault, before anything is charged or queued.
"""

from __future__ import annotations

import json

from jsonschema import SchemaError, validators

from gateway.config import RequestLimits
from gateway.core import Unacceptable
from schemas.api import ChatCompletionRequest, InputMessage
from schemas.events import ChatMessage, GenerationRequest, Role
from schemas.tools import ToolCall, ToolSpec, ToolUse


def tool_use(completion: ChatCompletionRequest, limits: RequestLimits) -> ToolUse | None:
    """The tools the model is shown and how it may call them; None when it is shown none
    (no tools, or `tool_choice: none`)."""
    tools = completion.tools or []
    choice = completion.tool_choice
    if not tools:
        if choice not in (None, "none"):
            raise Unacceptable("invalid_tool_choice", "a tool choice needs `tools`",
                               param="tool_choice")
        return None
    _check_tools(tools, limits)
    if choice == "none":
        return None
    parallel = completion.parallel_tool_calls is not False
    if choice is None or isinstance(choice, str):
        return ToolUse(tools=tuple(tools), choice=choice or "auto", parallel=parallel)
    name = choice.function.name
    if all(tool.function.name != name for tool in tools):
        raise Unacceptable("invalid_tool_choice", f"tool_choice names {name!r}, which is "
                           "not one of `tools`", param="tool_choice.function.name")
    return ToolUse(tools=tuple(tools), choice="function", function=name, parallel=parallel)


def _check_tools(tools: list[ToolSpec], limits: RequestLimits) -> None:
    if len(tools) > limits.max_tools:
        raise Unacceptable("too_many_tools", f"a request offers at most {limits.max_tools} "
                           "tools", param="tools")
    seen: set[str] = set()
    definitions: dict[str, object] = {}
    for index, tool in enumerate(tools):
        function = tool.function
        if function.name in seen:
            raise Unacceptable("invalid_tools", f"two tools are named {function.name!r}",
                               param=f"tools.{index}.function.name")
        seen.add(function.name)
        parameters = function.parameters
        if parameters is None:
            continue
        param = f"tools.{index}.function.parameters"
        try:
            if not isinstance(parameters.get("$schema", ""), str):
                raise SchemaError("$schema must be a string")
            validators.validator_for(parameters).check_schema(parameters)
        except SchemaError as error:
            raise Unacceptable("invalid_tools", f"the parameters of {function.name!r} are not "
                               f"a valid JSON Schema: {error.message}", param=param) from None
        if parameters.get("type", "object") != "object":
            raise Unacceptable("invalid_tools", f"the parameters of {function.name!r} must "
                               "describe an object", param=param)
        for name, definition in parameters.get("$defs", {}).items():
            # A required tool choice joins every tool's `$defs` in one schema (as vLLM does).
            if definitions.setdefault(name, definition) != definition:
                raise Unacceptable("invalid_tools", f"two tools define {name!r} in `$defs` "
                                   "differently", param=f"{param}.$defs.{name}")


def chat_messages(messages: list[InputMessage]) -> tuple[ChatMessage, ...]:
    """The messages as the model gets them. Only an assistant's message carries tool
    calls, each with a JSON object for arguments; a `tool` message answers a call an
    assistant made before it (`tool_call_id`)."""
    calls_made: set[str] = set()
    converted = []
    for index, message in enumerate(messages):
        where = f"messages.{index}"
        calls = tuple(message.tool_calls or ())
        if calls and message.role != "assistant":
            raise Unacceptable("invalid_message", "only an assistant's message carries "
                               "tool calls", param=f"{where}.tool_calls")
        for number, call in enumerate(calls):
            _check_arguments(call, f"{where}.tool_calls.{number}.function.arguments")
        calls_made.update(call.id for call in calls)
        if message.role == "tool":
            if not message.tool_call_id:
                raise Unacceptable("invalid_message", "a tool message needs the "
                                   "`tool_call_id` of the call it answers",
                                   param=f"{where}.tool_call_id")
            if message.tool_call_id not in calls_made:
                raise Unacceptable("invalid_message", f"tool_call_id {message.tool_call_id!r}"
                                   " answers no tool call of an earlier assistant message",
                                   param=f"{where}.tool_call_id")
        converted.append(ChatMessage(
            role=message.chat_role, content=message.text, tool_calls=calls,
            tool_call_id=message.tool_call_id if message.chat_role is Role.TOOL else None))
    return tuple(converted)


def tool_texts(request: GenerationRequest) -> list[str]:
    """The prompt's text besides the messages' content: the tools it shows the model, as
    JSON, and the arguments of the calls in its history (for the token limits)."""
    texts = [call.function.arguments for m in request.messages for call in m.tool_calls]
    if request.tool_use is not None:
        texts += [tool.model_dump_json(exclude_none=True) for tool in request.tool_use.tools]
    return texts


def _check_arguments(call: ToolCall, param: str) -> None:
    try:
        arguments = json.loads(call.function.arguments)
    except (ValueError, RecursionError):
        arguments = None
    if not isinstance(arguments, dict):
        raise Unacceptable("invalid_message", "a tool call's arguments must be a JSON object",
                           param=param)
