"""Tool calling on `/v1/chat/completions`, read from the request:
the tools it offers and how the model may use them (`tool_use`), and its messages with
the calls an assistant made and the tools' results (`chat_messages`).

Pure: a request that cannot be served is refused here, naming the field at fault,
before anything is charged or queued: what a JSON schema can say is also in the API
document (`gateway.api_document`), so a request valid by the document is served, as
vLLM's server serves it where OpenAI would be stricter (two tools of one name, a
call's arguments that are no JSON object, a result of a call the history lacks). A
tool choice naming a function the request does not offer is 404 `tool_not_found`,
as a model not served is.
"""

from __future__ import annotations

from typing import Any

from jsonschema import SchemaError, validators

from gateway.config import RequestLimits
from gateway.refusals import NotFound, Unacceptable
from schemas.api import ChatCompletionRequest, InputMessage
from schemas.bounds import json_shape_error
from schemas.events import ChatMessage, GenerationRequest, Role
from schemas.tools import ToolSpec, ToolUse


def tool_use(completion: ChatCompletionRequest, limits: RequestLimits) -> ToolUse | None:
    """The tools the model is shown and how it may call them; None when it is shown none
    (no tools, or `tool_choice: none`). A tool choice other than none or auto needs
    tools."""
    tools = completion.tools or []
    choice = completion.tool_choice
    if not tools:
        if choice not in (None, "none", "auto"):
            raise Unacceptable(
                "invalid_tool_choice", "a tool choice needs `tools`", param="tool_choice"
            )
        return None
    _check_tools(tools, limits)
    if choice == "none":
        return None
    parallel = completion.parallel_tool_calls is not False
    if choice is None or isinstance(choice, str):
        return ToolUse(tools=tuple(tools), choice=choice or "auto", parallel=parallel)
    name = choice.function.name
    if all(tool.function.name != name for tool in tools):
        raise NotFound(
            "tool_not_found",
            f"tool_choice names {name!r}, which is not one of `tools`",
            param="tool_choice.function.name",
        )
    return ToolUse(tools=tuple(tools), choice="function", function=name, parallel=parallel)


def _check_tools(tools: list[ToolSpec], limits: RequestLimits) -> None:
    if len(tools) > limits.max_tools:
        raise Unacceptable(
            "too_many_tools", f"a request offers at most {limits.max_tools} tools", param="tools"
        )
    definitions: dict[str, object] = {}
    for index, tool in enumerate(tools):
        function = tool.function
        parameters = function.parameters
        if parameters is None:
            continue
        param = f"tools.{index}.function.parameters"
        error = schema_error(parameters)
        if error is not None:
            raise Unacceptable(
                "invalid_tools",
                f"the parameters of {function.name!r} are not a JSON Schema chatpipe takes: "
                f"{error}",
                param=param,
            )
        if parameters.get("type", "object") != "object":
            raise Unacceptable(
                "invalid_tools",
                f"the parameters of {function.name!r} must describe an object",
                param=param,
            )
        for name, definition in parameters.get("$defs", {}).items():
            # A required tool choice joins every tool's `$defs` in one schema (as vLLM does).
            if definitions.setdefault(name, definition) != definition:
                raise Unacceptable(
                    "invalid_tools",
                    f"two tools define {name!r} in `$defs` differently",
                    param=f"{param}.$defs.{name}",
                )


def schema_error(schema: dict[str, Any]) -> str | None:
    """Why `schema` is not a JSON Schema chatpipe takes: deeper or larger than
    `schemas.bounds` allows (checked first, without recursion, so the validator never
    meets a schema deep enough to exhaust the stack), or no valid JSON Schema (by the
    draft it names, else the newest); None when it is one."""
    if (shape := json_shape_error(schema)) is not None:
        return shape
    try:
        if not isinstance(schema.get("$schema", ""), str):
            raise SchemaError("$schema must be a string")
        validators.validator_for(schema).check_schema(schema)
    except SchemaError as error:
        return error.message
    except RecursionError:
        return "it nests too deeply to be checked"
    return None


def chat_messages(messages: list[InputMessage]) -> tuple[ChatMessage, ...]:
    """The messages as the model gets them. Only an assistant's message carries tool
    calls; a `tool` message names the call it answers (`tool_call_id`)."""
    converted = []
    for index, message in enumerate(messages):
        where = f"messages.{index}"
        calls = tuple(message.tool_calls or ())
        if calls and message.role != "assistant":
            raise Unacceptable(
                "invalid_message",
                "only an assistant's message carries tool calls",
                param=f"{where}.tool_calls",
            )
        if message.role == "tool" and not message.tool_call_id:
            raise Unacceptable(
                "invalid_message",
                "a tool message needs the `tool_call_id` of the call it answers",
                param=f"{where}.tool_call_id",
            )
        converted.append(
            ChatMessage(
                role=message.chat_role,
                content=message.text,
                tool_calls=calls,
                tool_call_id=message.tool_call_id if message.chat_role is Role.TOOL else None,
            )
        )
    return tuple(converted)


def tool_texts(request: GenerationRequest) -> list[str]:
    """The prompt's text besides the messages' content: the tools it shows the model, as
    JSON, and the arguments of the calls in its history (for the token limits)."""
    texts = [call.function.arguments for m in request.messages for call in m.tool_calls]
    if request.tool_use is not None:
        texts += [tool.model_dump_json(exclude_none=True) for tool in request.tool_use.tools]
    return texts
