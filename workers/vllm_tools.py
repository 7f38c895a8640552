"""Tool calling on vLLM, as vLLM's own OpenAI server does it.

A required or named tool choice holds the output to the JSON schema vLLM's server
builds (`get_json_schema_from_tools`), through vLLM's structured outputs; the text is
read back by `workers.tool_calls.constrained_calls`. With `auto` the model writes calls
in its own format and the tool parser vLLM has for it (`ToolParserManager`, named by
`CHATPIPE_TOOL_PARSER`, e.g. `hermes`) finds them in the whole answer's text.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from schemas.events import GenerationRequest
from schemas.tools import FunctionCall, ToolCall, ToolCalls, ToolUse, call_id
from workers.tool_calls import constrained_calls

if TYPE_CHECKING:
    from vllm import SamplingParams


class AnswerReading:
    """One answer's text as it comes, and the tools it called once it has ended."""

    def __init__(self, parse: Callable[[str], ToolCalls | None] | None = None) -> None:
        self._parse = parse
        self._parts: list[str] = []

    def add(self, text: str) -> None:
        if self._parse is not None:
            self._parts.append(text)

    def calls(self) -> ToolCalls | None:
        return None if self._parse is None else self._parse("".join(self._parts))


class ToolReader:
    """Sets up each request's tool use on its `SamplingParams`, and reads its calls."""

    def __init__(self, tokenizer: Any, parser_name: str, model: str) -> None:
        from vllm.tool_parsers import ToolParserManager

        self._tokenizer = tokenizer
        self._parser = ToolParserManager.get_tool_parser(parser_name)
        self._model = model

    def reading(self, request: GenerationRequest, params: SamplingParams) -> AnswerReading:
        """What reads `request`'s answer; a constrained tool choice sets its constraint
        on `params`, an auto one what the parser needs of the text."""
        tool_use = request.tool_use
        if tool_use is None:
            return AnswerReading()
        if tool_use.constrained:
            params.structured_outputs = constraint(tool_use)
            return AnswerReading(lambda text: constrained_calls(text, tool_use, request.request_id))
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        tools = vllm_tools(tool_use)
        parser = self._parser(self._tokenizer, tools)
        asked = parser.adjust_request(
            ChatCompletionRequest(model=self._model, messages=[], tools=tools, tool_choice="auto")
        )
        assert isinstance(asked, ChatCompletionRequest)  # the kind of request it was given
        params.skip_special_tokens = asked.skip_special_tokens  # calls may be special tokens

        def parse(text: str) -> ToolCalls | None:
            found = parser.extract_tool_calls(text, asked)
            if not found.tools_called or not found.tool_calls:
                return None
            kept = found.tool_calls if tool_use.parallel else found.tool_calls[:1]
            return ToolCalls(
                content=found.content or None,
                calls=tuple(
                    ToolCall(
                        id=call_id(request.request_id, index),
                        function=FunctionCall(
                            name=call.function.name, arguments=call.function.arguments
                        ),
                    )
                    for index, call in enumerate(kept)
                ),
            )

        return AnswerReading(parse)


def vllm_tools(tool_use: ToolUse) -> list[Any]:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionToolsParam

    return [
        ChatCompletionToolsParam.model_validate(tool.model_dump(exclude_none=True))
        for tool in tool_use.tools
    ]


def constraint(tool_use: ToolUse) -> Any:
    """vLLM's structured outputs for a required or named tool choice: the schema vLLM's
    OpenAI server holds the output to."""
    from vllm.entrypoints.openai.chat_completion.protocol import (
        ChatCompletionNamedToolChoiceParam,
    )
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.tool_parsers.utils import get_json_schema_from_tools

    choice: Any = "required"
    if tool_use.choice == "function":
        choice = ChatCompletionNamedToolChoiceParam.model_validate(
            {"type": "function", "function": {"name": tool_use.function}}
        )
    schema = get_json_schema_from_tools(choice, vllm_tools(tool_use), tool_use.parallel)
    return StructuredOutputsParams(json=schema)
