"""Tool calling on the sim stack (no model): a constrained tool choice is answered with a
call whose arguments hold to the schema, through every stage, so load tests and e2e
tests of the pipeline can call tools too."""

from __future__ import annotations

import json

import jsonschema

from tests.support.tool_calls import CLOCK, QUESTION, TOOLS, WEATHER, sdk, streamed


async def test_the_sim_answers_a_named_and_a_required_tool_choice(sim_stack):
    client, model = sdk(sim_stack), sim_stack.settings.inference.model_name
    completion = await client.chat.completions.create(
        model=model,
        messages=QUESTION,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    [call] = completion.choices[0].message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)

    content, parts, finish = await streamed(
        client, model=model, messages=QUESTION, tools=TOOLS[::-1], tool_choice="required"
    )
    assert (content, finish, [p["name"] for p in parts]) == ("", "tool_calls", ["get_time"])
    jsonschema.validate(json.loads(parts[0]["arguments"]), CLOCK)
