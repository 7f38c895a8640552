"""The OpenAI Agents SDK's default Responses model on real vLLM (tiny model): an agent
whose model settings require a tool call runs its function tool, with arguments that
hold to the tool's schema (vLLM structured outputs, even from random weights), and the
run ends on that first tool's result (the rest runs on the sim stack in
tests/e2e/test_responses_agents.py)."""

from __future__ import annotations

import json
from typing import Literal

import jsonschema
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)

from tests.support.tool_calls import sdk

pytestmark = pytest.mark.vllm

set_tracing_disabled(True)


async def test_a_required_tool_call_runs_the_tool_and_ends_the_run(vllm_stack):
    calls: list[tuple[str, str]] = []

    @function_tool
    def get_weather(city: Literal["Paris", "Rome", "Oslo"], unit: Literal["C", "F"]) -> str:
        """The weather of a city."""
        calls.append((city, unit))
        return f"21 {unit} in {city}"

    model = OpenAIResponsesModel(vllm_stack.settings.inference.model_name, sdk(vllm_stack))
    agent = Agent(
        name="weather",
        instructions="Be brief.",
        tools=[get_weather],
        model=model,
        model_settings=ModelSettings(
            tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=64
        ),
        tool_use_behavior="stop_on_first_tool",
    )
    result = await Runner.run(agent, "What is the weather in Paris?", max_turns=1)

    [call_item, output_item] = result.new_items
    assert (call_item.type, output_item.type) == ("tool_call_item", "tool_call_output_item")
    call = call_item.raw_item
    assert call.type == "function_call" and call.name == "get_weather", call
    assert call.call_id.startswith("call_"), call
    arguments = json.loads(call.arguments)
    jsonschema.validate(arguments, get_weather.params_json_schema)
    # The tool ran once with those arguments, and its result is the run's output.
    assert calls == [(arguments["city"], arguments["unit"])]
    assert result.final_output == f"21 {arguments['unit']} in {arguments['city']}"
