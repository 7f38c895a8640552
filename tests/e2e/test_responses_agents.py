"""The OpenAI Agents SDK on the Responses API (its default model, `OpenAIResponsesModel`)
through every stage, on the sim stack: an agent calls its function tool and answers
with the tool's result in its input, run whole and streamed; an agent with an output
type answers with that type."""

from __future__ import annotations

import pytest
from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from pydantic import BaseModel

from tests.support.tool_calls import sdk

set_tracing_disabled(True)

QUESTION = '[[sim:call=get_weather {"city": "Paris"}]] [[sim:reply=Sunny in Paris]]'


@pytest.fixture
def calls() -> list[str]:
    return []


@pytest.fixture
def weather_agent(sim_stack, calls) -> Agent:
    @function_tool
    def get_weather(city: str) -> str:
        """The weather of a city."""
        calls.append(city)
        return f"sunny in {city}"

    model = OpenAIResponsesModel(sim_stack.settings.inference.model_name, sdk(sim_stack))
    return Agent(name="weather", instructions="Be brief.", tools=[get_weather], model=model)


async def test_an_agent_calls_its_tool_then_answers(weather_agent, calls):
    result = await Runner.run(weather_agent, QUESTION)
    assert (calls, result.final_output) == (["Paris"], "Sunny in Paris")
    kinds = [item.type for item in result.new_items]
    assert kinds == ["tool_call_item", "tool_call_output_item", "message_output_item"]


async def test_a_streamed_agent_run_calls_its_tool_then_answers(weather_agent, calls):
    result = Runner.run_streamed(weather_agent, QUESTION)
    text = ""
    async for event in result.stream_events():
        if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
            text += event.data.delta
    assert (calls, result.final_output, text) == (["Paris"], "Sunny in Paris", "Sunny in Paris")


class Forecast(BaseModel):
    city: str
    degrees: int


async def test_an_agent_with_an_output_type_answers_with_it(sim_stack):
    model = OpenAIResponsesModel(sim_stack.settings.inference.model_name, sdk(sim_stack))
    agent = Agent(name="forecaster", output_type=Forecast, model=model)
    result = await Runner.run(agent, "The forecast for Oslo?")
    assert isinstance(result.final_output, Forecast)
