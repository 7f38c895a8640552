"""The Responses API on real vLLM (tiny model) through the official `openai` SDK: a
streamed response with instructions, every event parsed by the SDK's types and its text
the model's, then a response continuing it whose prompt holds the first turn (the
rest runs on the sim stack in tests/e2e/test_responses.py)."""

from __future__ import annotations

import pytest

from tests.support.responses import deltas
from tests.support.tool_calls import sdk

pytestmark = pytest.mark.vllm


async def test_a_streamed_round_trip_and_its_continuation(vllm_stack):
    client, model = sdk(vllm_stack), vllm_stack.settings.inference.model_name
    stream = await client.responses.create(
        model=model,
        instructions="Answer briefly.",
        input="What is the capital of France?",
        max_output_tokens=12,
        temperature=0,
        stream=True,
    )
    events = [event async for event in stream]
    assert [e.type for e in events[:4]] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert events[-1].type in ("response.completed", "response.incomplete")
    numbers = [e.sequence_number for e in events]
    assert numbers == sorted(set(numbers))
    first = events[-1].response
    assert first.output_text == deltas(events) and first.output_text
    assert 0 < first.usage.output_tokens <= 12
    [done] = [e for e in events if e.type == "response.output_text.done"]
    assert done.text == first.output_text

    second = await client.responses.create(
        model=model,
        input="And of Italy?",
        previous_response_id=first.id,
        max_output_tokens=4,
        temperature=0,
    )
    assert second.status in ("completed", "incomplete") and second.usage.output_tokens > 0
    # Its prompt holds the first question and answer (less the first's instructions).
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens - 6
    retrieved = await client.responses.retrieve(first.id)
    assert (retrieved.output_text, retrieved.conversation.id) == (
        first.output_text,
        second.conversation.id,
    )
