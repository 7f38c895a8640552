"""What OpenAI clients read besides the answer, through the official `openai` SDK on the
sim stack: the models (listed with their kind, retrieved one by one, an unknown one a
404 naming `model`) and the request id every completion's response carries
(`x-request-id`, the SDK's `_request_id`), the one inside its completion's id."""

from __future__ import annotations

import openai
import pytest

from tests.support.tool_calls import sdk

HI = [{"role": "user", "content": "hi"}]


async def test_models_are_listed_with_their_kind_and_retrieved_by_id(sim_stack):
    client, chat_model = sdk(sim_stack), sim_stack.settings.inference.model_name
    listed = (await client.models.list()).data
    kinds = {m.id: m.kind for m in listed}
    assert kinds[chat_model] == "chat" and "embedding" in kinds.values()
    assert len({m.created for m in listed}) == 1 and listed[0].created > 0
    retrieved = await client.models.retrieve(chat_model)
    assert retrieved == next(m for m in listed if m.id == chat_model)
    with pytest.raises(openai.NotFoundError) as unknown:
        await client.models.retrieve("gpt-nope")
    assert (unknown.value.code, unknown.value.param) == ("model_not_found", "model")


async def test_every_completion_carries_its_request_id(sim_stack):
    client, model = sdk(sim_stack), sim_stack.settings.inference.model_name
    chat = await client.chat.completions.create(model=model, messages=HI, max_tokens=4)
    assert chat._request_id and chat.id == f"chatcmpl-{chat._request_id}"
    text = await client.completions.create(model=model, prompt="hi", max_tokens=4)
    assert text._request_id and text.id == f"cmpl-{text._request_id}"
    async with client.chat.completions.with_streaming_response.create(
        model=model, messages=HI, max_tokens=4, stream=True
    ) as streamed:
        chunks = [chunk async for chunk in await streamed.parse()]
    assert chunks[0].id == f"chatcmpl-{streamed.headers['x-request-id']}"
