"""Tool calling through the official `openai` SDK, end to end on real vLLM (tiny model):
a named or required tool choice gets calls whose arguments hold to the function's
schema (vLLM structured outputs, even from random weights), the calls and the tools'
results go back, and the model answers; streamed and not. Bad tool input is a 400
naming the field."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.support.tool_calls import CLOCK, QUESTION, SCHEMAS, TOOLS, sdk, streamed

pytestmark = pytest.mark.vllm


def valid_calls(calls) -> list[dict]:
    """The calls as the SDK parsed them, each checked against its function's schema."""
    assert calls, "no tool calls"
    parsed = []
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        arguments = json.loads(call.function.arguments)
        jsonschema.validate(arguments, SCHEMAS[call.function.name])
        parsed.append(
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": call.function.arguments},
            }
        )
    return parsed


def round_trip(calls: list[dict]) -> list[dict]:
    """The conversation after the calls: the assistant's calls, then each tool's result."""
    results = [
        {"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"temperature": 21})}
        for call in calls
    ]
    return [*QUESTION, {"role": "assistant", "content": None, "tool_calls": calls}, *results]


async def test_named_tool_choice_round_trip_not_streamed(vllm_stack):
    client, model = sdk(vllm_stack), vllm_stack.settings.inference.model_name
    completion = await client.chat.completions.create(
        model=model,
        messages=QUESTION,
        tools=TOOLS,
        max_tokens=64,
        temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    choice = completion.choices[0]
    calls = valid_calls(choice.message.tool_calls)
    assert [c["function"]["name"] for c in calls] == ["get_weather"]
    assert choice.message.content is None
    assert choice.finish_reason == "stop"  # as OpenAI ends a named tool choice

    answer = await client.chat.completions.create(
        model=model, messages=round_trip(calls), tools=TOOLS, max_tokens=8
    )
    assert answer.choices[0].message.content is not None
    assert answer.choices[0].message.tool_calls is None  # the tiny model writes text
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.usage.prompt_tokens > completion.usage.prompt_tokens


async def test_required_tool_choice_round_trip_streamed(vllm_stack):
    client, model = sdk(vllm_stack), vllm_stack.settings.inference.model_name
    content, parts, finish = await streamed(
        client,
        model=model,
        messages=QUESTION,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=64,
        temperature=0,
    )
    assert content == "" and finish == "tool_calls"
    assert len(parts) == 1 and parts[0]["id"].startswith("call_")
    jsonschema.validate(json.loads(parts[0]["arguments"]), SCHEMAS[parts[0]["name"]])
    calls = [
        {
            "id": p["id"],
            "type": "function",
            "function": {"name": p["name"], "arguments": p["arguments"]},
        }
        for p in parts
    ]

    content, parts, finish = await streamed(
        client,
        model=model,
        messages=round_trip(calls),
        tools=TOOLS,
        tool_choice="none",
        max_tokens=8,
    )
    assert content and not parts and finish in ("stop", "length")


async def test_named_tool_choice_streams_its_arguments(vllm_stack):
    client, model = sdk(vllm_stack), vllm_stack.settings.inference.model_name
    content, parts, finish = await streamed(
        client,
        model=model,
        messages=QUESTION,
        tools=TOOLS,
        max_tokens=64,
        temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )
    assert content == "" and finish == "stop"
    assert [p["name"] for p in parts] == ["get_time"]
    jsonschema.validate(json.loads(parts[0]["arguments"]), CLOCK)
    # The same request not streamed names the call the same and says the same.
    completion = await client.chat.completions.create(
        model=model,
        messages=QUESTION,
        tools=TOOLS,
        max_tokens=64,
        temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )
    assert completion.choices[0].message.tool_calls[0].function.arguments == parts[0]["arguments"]


async def test_required_tool_choice_not_streamed(vllm_stack):
    completion = await sdk(vllm_stack).chat.completions.create(
        model=vllm_stack.settings.inference.model_name,
        messages=QUESTION,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=64,
        temperature=0,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert len(valid_calls(choice.message.tool_calls)) == 1
    assert choice.message.content is None


async def test_a_constrained_answer_cut_at_max_tokens_is_text(vllm_stack):
    """Parallel calls are allowed here, and the tiny model goes on adding calls: at its
    length limit the JSON is not whole, so the answer is its text, ended `length`."""
    completion = await sdk(vllm_stack).chat.completions.create(
        model=vllm_stack.settings.inference.model_name,
        messages=QUESTION,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=24,
        temperature=0,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "length" and choice.message.tool_calls is None
    assert choice.message.content.startswith('[{"name":"')


@pytest.mark.parametrize(
    ("change", "param"),
    [
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "bad", "parameters": {"type": "objekt"}},
                    }
                ]
            },
            "tools.0.function.parameters",
        ),
        ({"tools": None, "tool_choice": "required"}, "tool_choice"),
        ({"messages": [*QUESTION, {"role": "tool", "content": "21"}]}, "messages.1.tool_call_id"),
        (
            {
                "messages": [
                    {
                        **QUESTION[0],
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "get_time", "arguments": "{}"},
                            }
                        ],
                    }
                ]
            },
            "messages.0.tool_calls",
        ),
    ],
)
async def test_bad_tool_input_is_a_400_naming_the_field(vllm_stack, change, param):
    with pytest.raises(openai.BadRequestError) as refused:
        await create(vllm_stack, change)
    error = refused.value.response.json()["error"]
    assert refused.value.status_code == 400 and error["param"] == param, error


async def test_a_tool_choice_naming_a_function_not_offered_is_a_404(vllm_stack):
    with pytest.raises(openai.NotFoundError) as refused:
        await create(
            vllm_stack, {"tool_choice": {"type": "function", "function": {"name": "nowhere"}}}
        )
    error = refused.value.response.json()["error"]
    assert (error["code"], error["param"]) == ("tool_not_found", "tool_choice.function.name")


async def create(stack, change: dict):
    request = {
        "model": stack.settings.inference.model_name,
        "messages": QUESTION,
        "tools": TOOLS,
        "tool_choice": "auto",
        "max_tokens": 4,
        **change,
    }
    return await sdk(stack).chat.completions.create(
        **{k: v for k, v in request.items() if v is not None}
    )
