"""End to end with the real broker and real vLLM (tiny model), over real HTTP."""

from __future__ import annotations

import asyncio

import openai
import pytest

from bench.topic_log import find_events
from chatpipe.dev_stack import API_KEY
from schemas import topics
from schemas.events import GenerationRequest, UsageEvent, WorkerHeartbeat
from schemas.lifecycle import RequestStatus
from tests.support.chat import post_message, read_sse
from tests.support.stack import client_for

pytestmark = pytest.mark.vllm


async def _new_conversation(client) -> str:
    response = await client.post("/v1/conversations", json={"title": "e2e"})
    assert response.status_code == 201, response.text
    return response.json()["conversation_id"]


async def _stored_reply(client, conversation_id: str, parent_id: str, timeout_s: float = 20):
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        detail = (await client.get(f"/v1/conversations/{conversation_id}")).json()
        replies = [
            m
            for m in detail["messages"]
            if m["role"] == "assistant" and m["parent_id"] == parent_id
        ]
        if replies:
            return replies[0]
        await asyncio.sleep(0.2)
    raise AssertionError("assistant message was not stored")


async def test_message_streams_is_stored_and_next_turn_sees_it(vllm_stack):
    async with client_for(vllm_stack) as client:
        conversation_id = await _new_conversation(client)
        first = await post_message(
            client,
            conversation_id,
            {
                "content": "hello there",
                "max_tokens": 96,
                "ignore_eos": True,
                "temperature": 0,
            },
        )
        assert first.status == 200
        deltas = first.of("delta")
        assert len(deltas) >= 2, "the answer came in one piece, not streamed"
        # Streamed means the first words arrive while the rest is still being made: within
        # the first half of the stream's life, whatever the machine's speed (an answer held
        # back to its end would arrive with `done`, at the very end).
        opened_at, done_at = first.of("request")[0].at, first.of("done")[0].at
        assert deltas[0].at - opened_at < (done_at - opened_at) / 2, (
            f"the first delta only arrived with the end: {deltas[0].at - opened_at:.3f} s of "
            f"{done_at - opened_at:.3f} s"
        )
        assert first.ended_with_done
        assert first.of("done")[0].json()["usage"]["completion_tokens"] == 96
        assert all(e.id is not None for e in deltas)

        reply = await _stored_reply(client, conversation_id, first.request["user_message_id"])
        assert reply["content"] == first.text
        assert reply["message_id"] == first.request["message_id"]

        second = await post_message(
            client,
            conversation_id,
            {
                "content": "and again",
                "max_tokens": 8,
                "ignore_eos": True,
            },
        )
        assert second.ended_with_done
        request_id = second.request["request_id"]
        [queued] = await find_events(
            vllm_stack.kafka,
            topics.requests_topic(vllm_stack.settings.gateway.default_tier),
            GenerationRequest,
            lambda r: r.request_id == request_id,
        )
        contents = [m.content for m in queued.messages]
        assert contents[-3:] == ["hello there", first.text, "and again"]


async def test_openai_sdk_streams_with_usage(vllm_stack):
    client = openai.AsyncOpenAI(base_url=f"{vllm_stack.base_url}/v1", api_key=API_KEY)
    stream = await client.chat.completions.create(
        model=vllm_stack.settings.inference.model_name,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    content, usage, finish = "", None, None
    async for chunk in stream:
        if chunk.choices:
            content += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage
    assert content
    assert finish in ("stop", "length")
    assert usage is not None and usage.prompt_tokens > 0
    assert 0 < usage.completion_tokens <= 12

    completion = await client.chat.completions.create(
        model=vllm_stack.settings.inference.model_name,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=5,
    )
    assert completion.choices[0].message.content is not None
    assert completion.usage.completion_tokens <= 5
    models = await client.models.list()
    ids = [m.id for m in models.data]
    chat_model = vllm_stack.settings.inference.model_name
    assert ids[0] == chat_model  # the chat model, then the embedding one
    assert len(ids) == 2 and "MiniLM" in ids[1], ids


async def test_openai_disconnect_aborts_generation(vllm_stack):
    """OpenAI clients do not resume: their disconnect cancels at once (a native stream is
    held for the resume grace instead: tests/faults/test_resume.py)."""
    max_tokens = 1500
    async with client_for(vllm_stack) as client:
        async with client.stream(
            "POST",
            "/v1/chat/completions",
            json={
                "model": vllm_stack.settings.inference.model_name,
                "stream": True,
                "ignore_eos": True,
                "messages": [{"role": "user", "content": "talk for a long time"}],
                "max_tokens": max_tokens,
            },
        ) as response:
            events = await read_sse(
                response, stop=lambda e: '"content":"' in e.data and '"content":""' not in e.data
            )
        request_id = events[0].json()["id"].removeprefix("chatcmpl-")

    [usage] = await find_events(
        vllm_stack.kafka,
        topics.USAGE,
        UsageEvent,
        lambda u: u.request_id == request_id,
        timeout_s=30,
    )
    assert usage.status == RequestStatus.FINISHED_ABORTED
    # The tiny model makes over a thousand tokens a second here, so a fifth of the answer
    # is a fraction of a second of a busy 2-core machine; the waste itself is measured in
    # `python -m bench` (cancellation waste), not timed in a test.
    assert usage.completion_tokens < max_tokens / 5, usage


async def test_sixteen_concurrent_streams_are_batched(vllm_stack):
    async with client_for(vllm_stack) as client:
        conversation_ids = [await _new_conversation(client) for _ in range(16)]
        results = await asyncio.gather(
            *(
                post_message(
                    client, cid, {"content": f"question {i}", "max_tokens": 40, "ignore_eos": True}
                )
                for i, cid in enumerate(conversation_ids)
            )
        )
    assert all(r.ended_with_done for r in results)
    assert all(r.of("done")[0].json()["usage"]["completion_tokens"] == 40 for r in results)
    heartbeats = await find_events(
        vllm_stack.kafka,
        topics.WORKERS,
        WorkerHeartbeat,
        lambda h: h.peak_running >= 8,
        timeout_s=10,
    )
    assert heartbeats, "the engine never ran 8 or more requests at once"
