"""LangChain's `ChatOpenAI` (langchain-openai) through every stage, on the sim stack: on
the Responses API a model with a bound tool calls it with parsed arguments and answers
once the tool's result comes back, whole and streamed, and `with_structured_output`
gives the Pydantic model; on chat completions the bound tool is called too."""

from __future__ import annotations

from typing import Literal

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

from chatpipe.dev_stack import API_KEY

QUESTION = '[[sim:call=get_weather {"city": "Paris"}]] [[sim:reply=Sunny in Paris]]'


@tool
def get_weather(city: str) -> str:
    """The weather of a city."""
    return f"sunny in {city}"


def chat_model(stack, *, responses: bool) -> ChatOpenAI:
    return ChatOpenAI(
        base_url=f"{stack.base_url}/v1",
        api_key=API_KEY,
        model=stack.settings.inference.model_name,
        use_responses_api=responses,
        max_retries=0,
    )


@pytest.fixture
def responses_model(sim_stack) -> ChatOpenAI:
    return chat_model(sim_stack, responses=True)


def the_call(message: AIMessage) -> dict:
    """The message's only tool call, which must be `get_weather` for Paris."""
    [call] = message.tool_calls
    assert (call["name"], call["args"]) == ("get_weather", {"city": "Paris"}), call
    assert call["id"].startswith("call_"), call
    return call


def with_result(question: str, called: AIMessage) -> list[BaseMessage]:
    """The conversation after the call: the question, the call, the tool's result."""
    call = the_call(called)
    result = ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])
    return [HumanMessage(question), called, result]


async def test_a_bound_tool_is_called_then_the_answer_uses_its_result(responses_model):
    model = responses_model.bind_tools([get_weather])
    called = await model.ainvoke([HumanMessage(QUESTION)])
    assert isinstance(called, AIMessage) and called.text == ""
    answer = await model.ainvoke(with_result(QUESTION, called))
    assert (answer.text, answer.tool_calls) == ("Sunny in Paris", [])


async def test_a_streamed_run_calls_the_tool_then_streams_the_answer(responses_model):
    model = responses_model.bind_tools([get_weather])
    chunks = [chunk async for chunk in model.astream([HumanMessage(QUESTION)])]
    called = chunks[0]
    for chunk in chunks[1:]:
        called += chunk
    assert isinstance(called, AIMessage)
    the_call(called)

    texts = [chunk.text async for chunk in model.astream(with_result(QUESTION, called))]
    assert "".join(texts) == "Sunny in Paris"


class Forecast(BaseModel):
    city: Literal["Oslo", "Rome"]
    degrees: int


async def test_structured_output_is_the_pydantic_model(responses_model):
    structured = responses_model.with_structured_output(Forecast)
    # The sim answers with the least JSON the schema takes: the enum's first value, 0.
    assert await structured.ainvoke("The forecast for Oslo?") == Forecast(city="Oslo", degrees=0)


async def test_chat_completions_call_a_bound_tool(sim_stack):
    model = chat_model(sim_stack, responses=False).bind_tools([get_weather])
    called = await model.ainvoke([HumanMessage(QUESTION)])
    assert isinstance(called, AIMessage)
    the_call(called)
    answer = await model.ainvoke(with_result(QUESTION, called))
    assert (answer.text, answer.tool_calls) == ("Sunny in Paris", [])
