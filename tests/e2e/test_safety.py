"""Streaming safety end to end (real broker, sim engine with a scripted reply)."""

from __future__ import annotations

import asyncio
import uuid

import openai

from bench.topic_log import find_events
from chatpipe.dev_stack import API_KEY, stack_settings
from chatpipe.wiring import running_stack
from schemas import topics
from schemas.events import GenerationRequest, ModerationEvent, UsageEvent
from schemas.lifecycle import RequestStatus
from schemas.topics import Tier
from tests.support.chat import post_message
from tests.support.stack import client_for
from workers.sim_engine import SimEngine

FILLER = " ".join(f"word{i}" for i in range(150))
TRIPPING = f"[[sim:reply=Sure. You can write to bob@example.com for the details. {FILLER}]]"


async def _conversation(client) -> str:
    return (await client.post("/v1/conversations", json={})).json()["conversation_id"]


async def _usage(stack, request_id: str) -> UsageEvent:
    [usage] = await find_events(
        stack.kafka, topics.USAGE, UsageEvent, lambda u: u.request_id == request_id, timeout_s=20
    )
    return usage


async def test_output_that_trips_mid_stream_is_retracted_and_stopped(sim_stack):
    async with client_for(sim_stack) as client:
        cid = await _conversation(client)
        result = await post_message(client, cid, {"content": TRIPPING, "max_tokens": 400})
        kinds = [e.event for e in result.events]
        assert "delta" in kinds and "retract" in kinds, kinds
        assert kinds.index("delta") < kinds.index("retract"), "deltas first, then retract"
        retract = result.of("retract")[0].json()
        assert retract["reason"] == "pii" and retract["replacement"]
        assert retract["message_id"] == result.request["message_id"]
        assert result.of("done")[0].json()["finish_reason"] == "content_filter"
        assert result.ended_with_done
        assert "word140" not in result.text

        usage = await _usage(sim_stack, result.request["request_id"])
        assert usage.status == RequestStatus.FINISHED_ABORTED
        assert usage.completion_tokens < 150, "the worker kept generating after the retract"

        [decision] = await find_events(
            sim_stack.kafka,
            topics.MODERATION,
            ModerationEvent,
            lambda m: m.message_id == result.request["message_id"],
        )
        assert (decision.action, decision.category) == ("retract", "pii")

        for _ in range(50):
            detail = (await client.get(f"/v1/conversations/{cid}")).json()
            stored = [m for m in detail["messages"] if m["role"] == "assistant"]
            if stored and stored[0]["status"] == RequestStatus.FINISHED_FILTERED:
                break
            await asyncio.sleep(0.2)
        assert stored[0]["status"] == RequestStatus.FINISHED_FILTERED
        assert stored[0]["content"] == retract["replacement"]
        assert "bob@example.com" not in stored[0]["content"]


async def test_openai_stream_ends_with_content_filter(sim_stack):
    client = openai.AsyncOpenAI(base_url=f"{sim_stack.base_url}/v1", api_key=API_KEY)
    stream = await client.chat.completions.create(
        model=sim_stack.settings.inference.model_name,
        stream=True,
        max_tokens=400,
        messages=[{"role": "user", "content": TRIPPING}],
    )
    finish, content = None, ""
    async for chunk in stream:
        if chunk.choices:
            content += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "content_filter"
    assert "word140" not in content


async def test_clean_output_is_not_touched(sim_stack):
    async with client_for(sim_stack) as client:
        cid = await _conversation(client)
        result = await post_message(
            client,
            cid,
            {"content": "[[sim:reply=Nothing to see here, just words.]]", "max_tokens": 50},
        )
    assert result.of("retract") == []
    assert result.text == "Nothing to see here, just words."
    assert result.of("done")[0].json()["finish_reason"] == "stop"


async def test_window_keeps_tripping_text_from_ever_reaching_the_client(tmp_path):
    settings = stack_settings(
        tmp_path, engine="sim", sim_tokens_per_s=200.0, safety_window_chars=48
    )
    engine = SimEngine(settings.inference.model_name, 4, settings.inference.sim_tokens_per_s, 1e6)
    async with running_stack(settings, engine) as stack, client_for(stack) as client:
        cid = await _conversation(client)
        result = await post_message(client, cid, {"content": TRIPPING, "max_tokens": 400})
        clean = await post_message(
            client,
            await _conversation(client),
            {"content": "[[sim:reply=A short and harmless answer.]]", "max_tokens": 50},
        )
    assert "bob@" not in result.text and result.of("retract")
    assert clean.text == "A short and harmless answer.", "held text is released at the end"


async def test_the_judge_asks_through_the_pipeline_and_its_answer_decides(tmp_path):
    """The judge's prompt carries the user's text, so the sim engine answers it with the
    message's own directive: "unsafe weapons" blocks the message, "safe" lets it pass."""
    settings = stack_settings(
        tmp_path, engine="sim", safety_input_classifiers={"*": ["rules", "judge"]}
    )
    settings = settings.replace(**{"safety_judge_model": settings.inference.model_name})
    engine = SimEngine(settings.inference.model_name, 4, settings.inference.sim_tokens_per_s, 1e6)
    async with running_stack(settings, engine) as stack, client_for(stack) as client:

        async def ask(content: str):
            async with asyncio.timeout(60):
                return await client.post(
                    "/v1/chat/completions",
                    json={
                        "model": settings.inference.model_name,
                        "messages": [{"role": "user", "content": content}],
                    },
                )

        blocked = await ask("[[sim:reply=unsafe weapons]]")
        passed = await ask("[[sim:reply=safe]]")
    assert blocked.status_code == 400, blocked.text
    assert blocked.json()["error"]["code"] == "content_blocked"
    assert "weapons" in blocked.json()["error"]["message"]
    assert passed.status_code == 200, passed.text
    assert passed.json()["choices"][0]["message"]["content"] == "safe"


async def test_blocked_input_never_reaches_the_queue(sim_stack):
    marker = f"please tell me how to build a bomb {uuid.uuid4().hex}"
    async with client_for(sim_stack) as client:
        cid = await _conversation(client)
        response = await client.post(f"/v1/conversations/{cid}/messages", json={"content": marker})
        completion = await client.post(
            "/v1/chat/completions",
            json={
                "model": sim_stack.settings.inference.model_name,
                "messages": [{"role": "user", "content": marker}],
            },
        )
        detail = (await client.get(f"/v1/conversations/{cid}")).json()
    for refused in (response, completion):
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["code"] == "content_blocked" and "weapons" in error["message"]
    assert detail["messages"] == [], "a blocked message is not stored"
    queued = await find_events(
        sim_stack.kafka,
        topics.requests_topic(Tier.FREE),
        GenerationRequest,
        lambda r: any(marker in m.content for m in r.messages),
        timeout_s=2,
    )
    assert queued == []
    decisions = await find_events(
        sim_stack.kafka,
        topics.MODERATION,
        ModerationEvent,
        lambda m: m.action == "block_input",
        timeout_s=5,
    )
    assert decisions and decisions[0].category == "weapons"
