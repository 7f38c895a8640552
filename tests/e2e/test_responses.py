"""The Responses API through the official `openai` SDK and every stage, on the sim stack:
responses streamed and not, with instructions; a response that
continues another sees the first turn in its prompt, and the native API shows the same
conversation; a background response runs on without its client and its stream resumes
`starting_after` a sequence number; an unstored one is never retrievable; a field
chatpipe does not honour is a 400 naming it. (tests/e2e/test_responses_vllm.py does a
streamed round trip on real vLLM.)"""

from __future__ import annotations

import asyncio

import openai
import pytest

from tests.support.responses import deltas
from tests.support.stack import client_for
from tests.support.tool_calls import sdk


async def test_a_response_and_its_continuation_share_one_conversation(sim_stack):
    client, model = sdk(sim_stack), sim_stack.settings.inference.model_name
    first = await client.responses.create(
        model=model, instructions="Answer in one line.", input="[[sim:reply=Paris is the capital]]"
    )
    assert (first.status, first.output_text) == ("completed", "Paris is the capital")
    second = await client.responses.create(
        model=model, input="[[sim:reply=Yes]] Sure?", previous_response_id=first.id
    )
    assert (second.output_text, second.conversation.id) == ("Yes", first.conversation.id)
    # The sim counts a prompt's words: the second prompt holds the first turn and its
    # answer, its own two words, and not the first's instructions (four words).
    assert second.usage.input_tokens == (
        first.usage.input_tokens - 4 + first.usage.output_tokens + 2
    )
    retrieved = await client.responses.retrieve(second.id)
    assert (retrieved.output_text, retrieved.previous_response_id) == ("Yes", first.id)
    async with client_for(sim_stack) as native:
        conversation = (await native.get(f"/v1/conversations/{first.conversation.id}")).json()
    assert [(m["role"], m["content"]) for m in conversation["messages"]] == [
        ("user", "[[sim:reply=Paris is the capital]]"),
        ("assistant", "Paris is the capital"),
        ("user", "[[sim:reply=Yes]] Sure?"),
        ("assistant", "Yes"),
    ]


async def test_a_streamed_response_as_the_sdk_reads_it(sim_stack):
    client, model = sdk(sim_stack), sim_stack.settings.inference.model_name
    stream = await client.responses.create(
        model=model, input="[[sim:length=12]]", max_output_tokens=8, stream=True
    )
    events = [event async for event in stream]
    assert events[0].type == "response.created" and events[-1].type == "response.incomplete"
    numbers = [e.sequence_number for e in events]
    assert numbers == sorted(set(numbers))
    final = events[-1].response
    assert final.incomplete_details.reason == "max_output_tokens"
    assert final.output_text == deltas(events) and final.usage.output_tokens == 8
    assert (await client.responses.retrieve(final.id)).output_text == final.output_text


async def test_a_background_response_runs_on_and_resumes_starting_after(sim_stack):
    client, model = sdk(sim_stack), sim_stack.settings.inference.model_name
    queued = await client.responses.create(model=model, input="[[sim:length=150]]", background=True)
    assert queued.status == "queued"
    seen = []
    async for event in await client.responses.retrieve(queued.id, stream=True):
        seen.append(event)
        if event.type == "response.output_text.delta" and len(deltas(seen)) > 20:
            break  # the reader goes; the generation does not
    resumed = [
        e
        async for e in await client.responses.retrieve(
            queued.id, stream=True, starting_after=seen[-1].sequence_number
        )
    ]
    assert resumed[0].sequence_number > seen[-1].sequence_number
    final = resumed[-1].response
    assert resumed[-1].type == "response.completed"
    assert deltas(seen) + deltas(resumed) == final.output_text
    assert len(final.output_text.split()) == 150
    retrieved = await client.responses.retrieve(queued.id)
    assert (retrieved.status, retrieved.output_text) == ("completed", final.output_text)


async def test_a_background_response_is_cancelled(sim_stack):
    client, model = sdk(sim_stack), sim_stack.settings.inference.model_name
    queued = await client.responses.create(
        model=model, input="[[sim:length=2000]]", max_output_tokens=2000, background=True
    )
    await client.responses.cancel(queued.id)
    for _ in range(200):
        retrieved = await client.responses.retrieve(queued.id)
        if retrieved.status != "in_progress":
            break
        await asyncio.sleep(0.05)
    assert retrieved.status == "cancelled"
    assert len(retrieved.output_text.split()) < 2000


async def test_an_unstored_response_is_not_retrievable(sim_stack):
    client, model = sdk(sim_stack), sim_stack.settings.inference.model_name
    response = await client.responses.create(model=model, input="[[sim:reply=gone]]", store=False)
    assert response.output_text == "gone"
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(response.id)


@pytest.mark.parametrize(("extra", "param"), [
    ({"frobnicate": 1}, "frobnicate"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
])  # fmt: skip
async def test_a_field_not_honoured_is_a_400_naming_it(sim_stack, extra, param):
    client, model = sdk(sim_stack), sim_stack.settings.inference.model_name
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(model=model, input="hi", extra_body=extra)
    assert refused.value.body["param"] == param


async def test_a_background_response_streamed_from_its_start(sim_stack):
    client, model = sdk(sim_stack), sim_stack.settings.inference.model_name
    stream = await client.responses.create(
        model=model, input="[[sim:length=30]]", background=True, stream=True
    )
    events = [event async for event in stream]
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert deltas(events) == events[-1].response.output_text
    assert len(deltas(events).split()) == 30
