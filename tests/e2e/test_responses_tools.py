"""Function tools and structured output on the Responses API through the official SDK
and every stage, on the sim stack: the model calls a function, the client sends the call
and its output back with the whole input, the model answers (streamed and not), and
`responses.parse` reads an answer held to a Pydantic model's schema."""

from __future__ import annotations

import json

import openai
import pytest
from pydantic import BaseModel

from tests.support.responses import deltas
from tests.support.tool_calls import WEATHER, sdk

TOOLS = [{"type": "function", "name": "get_weather", "description": "the weather of a city",
          "parameters": WEATHER, "strict": True}]  # fmt: skip
QUESTION = '[[sim:call=get_weather {"city": "Paris", "unit": "celsius"}]] [[sim:reply=Sunny]]'


def answered_call(call) -> list[dict]:
    return [
        {"role": "user", "content": QUESTION},
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "22 and sunny"},
    ]


async def test_a_function_call_round_trip(sim_stack):
    client, model = sdk(sim_stack), sim_stack.settings.inference.model_name
    first = await client.responses.create(model=model, input=QUESTION, tools=TOOLS)
    [call] = first.output
    assert (first.status, call.type, call.name, call.status) == (
        "completed", "function_call", "get_weather", "completed")  # fmt: skip
    assert json.loads(call.arguments) == {"city": "Paris", "unit": "celsius"}
    assert call.call_id.startswith("call_") and first.store is False
    assert (first.tools[0].name, first.tool_choice) == ("get_weather", "auto")
    second = await client.responses.create(model=model, input=answered_call(call), tools=TOOLS)
    assert (second.status, second.output_text) == ("completed", "Sunny")
    # A response with tools runs as a chat completion: it is not stored.
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(first.id)


async def test_a_streamed_function_call_round_trip(sim_stack):
    client, model = sdk(sim_stack), sim_stack.settings.inference.model_name
    stream = await client.responses.create(
        model=model, input=QUESTION, tools=TOOLS, tool_choice="auto", stream=True
    )
    events = [event async for event in stream]
    assert [e.type for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed",
    ]  # fmt: skip
    numbers = [e.sequence_number for e in events]
    assert numbers == sorted(set(numbers))
    [call] = events[-1].response.output
    assert events[4].arguments == call.arguments == events[3].delta
    assert events[5].item == call
    stream = await client.responses.create(
        model=model, input=answered_call(call), tools=TOOLS, stream=True
    )
    answer = [event async for event in stream]
    assert deltas(answer) == answer[-1].response.output_text == "Sunny"


async def test_a_named_tool_choice_calls_that_function(sim_stack):
    client, model = sdk(sim_stack), sim_stack.settings.inference.model_name
    response = await client.responses.create(
        model=model, input="Weather?", tools=TOOLS,
        tool_choice={"type": "function", "name": "get_weather"})  # fmt: skip
    [call] = response.output
    assert call.name == "get_weather" and set(json.loads(call.arguments)) == {"city", "unit"}


class Forecast(BaseModel):
    city: str
    degrees: int
    sunny: bool


async def test_parse_reads_an_answer_held_to_the_models_schema(sim_stack):
    client, model = sdk(sim_stack), sim_stack.settings.inference.model_name
    parsed = await client.responses.parse(model=model, input="Forecast?", text_format=Forecast)
    assert isinstance(parsed.output_parsed, Forecast)
    assert parsed.text.format.type == "json_schema"


async def test_a_hosted_tool_is_refused_naming_it(sim_stack):
    client, model = sdk(sim_stack), sim_stack.settings.inference.model_name
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(
            model=model, input="Hi", tools=[*TOOLS, {"type": "web_search"}]
        )
    assert refused.value.body["param"] == "tools.1.type"
