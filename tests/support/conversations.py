"""Conversations driven over HTTP: users, turns, what was recorded."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx

from bench.topic_log import find_events
from chatpipe.wiring import Stack
from conversations.store import ApiKey
from schemas import topics
from schemas.events import GenerationRequest
from schemas.topics import Tier
from tests.support.chat import SseResult, read_sse
from tests.support.stack import client_for

Client = httpx.AsyncClient


async def new_user(stack: Stack, tier: Tier = Tier.PRO) -> Client:
    """A client with a key of its own: a fresh user, so nothing else is in its lists."""
    user = f"user-{uuid.uuid4().hex[:8]}"
    await stack.store.add_api_key(
        f"key-{user}", ApiKey(user_id=user, org_id=f"org-{user}", tier=tier)
    )
    return client_for(stack, f"key-{user}")


async def new_conversation(client: Client, title: str = "") -> str:
    response = await client.post("/v1/conversations", json={"title": title})
    assert response.status_code == 201, response.text
    return response.json()["conversation_id"]


async def sse_post(client: Client, path: str, body: dict[str, Any]) -> SseResult:
    async with client.stream("POST", path, json=body) as response:
        if response.status_code != 200:
            await response.aread()
            return SseResult(response.status_code)
        return SseResult(200, await read_sse(response))


async def say(client: Client, cid: str, content: str, **options: Any) -> SseResult:
    """One turn, answered and recorded (the next turn may follow at once)."""
    result = await sse_post(
        client,
        f"/v1/conversations/{cid}/messages",
        {"content": content, "max_tokens": 16, **options},
    )
    assert result.ended_with_done, result
    await recorded(client, cid, result.request["message_id"])
    return result


async def recorded(client: Client, cid: str, message_id: str, timeout_s: float = 20) -> dict:
    """The conversation once `message_id` is stored."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        tree = (await client.get(f"/v1/conversations/{cid}")).json()
        if any(m["message_id"] == message_id for m in tree["messages"]):
            return tree
        assert asyncio.get_running_loop().time() < deadline, f"{message_id} was never stored"
        await asyncio.sleep(0.1)


async def queued_request(stack: Stack, request_id: str, tier: Tier = Tier.PRO) -> GenerationRequest:
    [request] = await find_events(
        stack.kafka,
        topics.requests_topic(tier),
        GenerationRequest,
        lambda r: r.request_id == request_id,
    )
    return request


def by_id(tree: dict) -> dict[str, dict]:
    return {m["message_id"]: m for m in tree["messages"]}


def error_code(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    return response.json()["error"]["code"]
