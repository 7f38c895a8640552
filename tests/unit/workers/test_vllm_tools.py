"""Tool calling on vLLM without an engine: the constraint a required or named tool choice
sets is the schema vLLM's own server builds, and `auto` answers are read by vLLM's tool
parser (hermes here), their calls named as chatpipe names them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from schemas.events import ChatMessage, GenerationRequest, Role
from schemas.tools import ToolSpec, ToolUse, call_id

pytest.importorskip("vllm", reason="vLLM is not installed")

from vllm import SamplingParams

from workers.vllm_tools import ToolReader, constraint

WEATHER = {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}
TOOLS = (
    ToolSpec.model_validate(
        {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}
    ),
    ToolSpec.model_validate({"type": "function", "function": {"name": "get_time"}}),
)


def request(use: ToolUse | None) -> GenerationRequest:
    return GenerationRequest(
        request_id="r",
        conversation_id="c",
        message_id="m",
        user_id="u",
        org_id="o",
        tier="pro",
        model="tiny-random",
        messages=(ChatMessage(role=Role.USER, content="hi"),),
        reply_to="chat.deliver.gw",
        tool_use=use,
    )


@pytest.fixture(scope="module")
def reader(tiny_model_dir: Path) -> ToolReader:
    from transformers import AutoTokenizer

    return ToolReader(AutoTokenizer.from_pretrained(tiny_model_dir), "hermes", "tiny-random")


def test_a_named_choice_is_held_to_the_functions_parameters():
    use = ToolUse(tools=TOOLS, choice="function", function="get_weather")
    assert constraint(use).json == WEATHER
    no_parameters = ToolUse(tools=TOOLS, choice="function", function="get_time")
    assert constraint(no_parameters).json == {"type": "object", "properties": {}}


@pytest.mark.parametrize(("parallel", "max_items"), [(True, None), (False, 1)])
def test_a_required_choice_is_held_to_a_list_of_calls_of_the_tools(parallel, max_items):
    schema = constraint(ToolUse(tools=TOOLS, choice="required", parallel=parallel)).json
    assert schema["type"] == "array" and schema["minItems"] == 1
    assert schema.get("maxItems") == max_items
    names = [item["properties"]["name"]["enum"] for item in schema["items"]["anyOf"]]
    assert names == [["get_weather"], ["get_time"]]
    assert schema["items"]["anyOf"][0]["properties"]["parameters"] == WEATHER


def test_the_reader_sets_the_constraint_and_reads_the_calls(reader):
    use = ToolUse(tools=TOOLS, choice="required")
    params = SamplingParams(max_tokens=8)
    reading = reader.reading(request(use), params)
    assert params.structured_outputs.json == constraint(use).json
    reading.add('[{"name":"get_time",')
    reading.add('"parameters":{}}]')
    [call] = reading.calls().calls
    assert (call.id, call.function.name, call.function.arguments) == (
        call_id("r", 0),
        "get_time",
        "{}",
    )


def test_without_tools_nothing_is_set_or_read(reader):
    params = SamplingParams(max_tokens=8)
    reading = reader.reading(request(None), params)
    reading.add("Hello")
    assert params.structured_outputs is None and reading.calls() is None


@pytest.mark.parametrize(("parallel", "count"), [(True, 2), (False, 1)])
def test_auto_answers_are_read_by_the_models_tool_parser(reader, parallel, count):
    params = SamplingParams(max_tokens=8)
    reading = reader.reading(request(ToolUse(tools=TOOLS, parallel=parallel)), params)
    assert params.structured_outputs is None
    assert params.skip_special_tokens is False  # the parser's tags may be special tokens
    reading.add("Let me check. <tool_call>")
    reading.add(json.dumps({"name": "get_weather", "arguments": {"city": "Oslo"}}))
    reading.add('</tool_call><tool_call>{"name": "get_time", "arguments": {}}</tool_call>')
    calls = reading.calls()
    assert calls.content == "Let me check. "
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in calls.calls] == [
        (call_id("r", 0), "get_weather", {"city": "Oslo"}),
        (call_id("r", 1), "get_time", {}),
    ][:count]


def test_an_auto_answer_of_plain_text_calls_nothing(reader):
    reading = reader.reading(request(ToolUse(tools=TOOLS)), SamplingParams(max_tokens=8))
    reading.add("It is sunny.")
    assert reading.calls() is None
