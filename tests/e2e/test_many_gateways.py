"""Two gateway processes on one pipeline share what a user's requests are held to:
the per-user rate limit and a key's concurrent generations (in Redis), the token budget
(billing's ledger), and the rule that a conversation's next turn waits for its
streaming answer (the store), whichever gateway each request goes through. A stream
started on one gateway is cancelled through the other, and stored.

Resuming on another gateway, and a dead gateway's streams, are proven in
`tests/faults/test_streams_finish.py`.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import orjson
import pytest
import pytest_asyncio

from bench.process_pipeline import KEY_SECRET, Pipeline, running_pipeline
from conversations.sqlite_store import SQLiteStore
from conversations.store import ApiKey
from ledger.charges import Account
from ledger.store import SQLiteLedger
from schemas.sse import read_messages
from schemas.topics import Tier
from tests.support.limits import clear_of_minute_edge, error_of, native_turn, until_used
from tests.support.redis import REDIS_SERVER

pytestmark = pytest.mark.timeout(180)

REQUESTS_PER_MINUTE = 3
TOKEN_BUDGET = 100
GATEWAYS = ("g1", "g2")
ORG = "many"


@pytest_asyncio.fixture(scope="module")
async def pipeline(tmp_path_factory, request) -> AsyncIterator[Pipeline]:
    storage = request.getfixturevalue("redis_url") if REDIS_SERVER else "memory://"
    async with running_pipeline(
        tmp_path_factory.mktemp("gateways"),
        rate_limit_storage=storage,
        user_requests_per_minute=REQUESTS_PER_MINUTE,
        user_token_budget=TOKEN_BUDGET,
        sim_tokens_per_s=100.0,
    ) as pipe:
        for stage in ("scheduler", "safety", "recorder", "billing"):
            await pipe.start(stage)
        await pipe.start("w1", "worker")
        for gateway in GATEWAYS:
            await pipe.start(gateway, "gateway")
        await pipe.wait_for_workers("w1")
        for gateway in GATEWAYS:
            await pipe.wait_for_gateway(gateway)
        yield pipe


@dataclass
class User:
    """A new user, with a client of each gateway."""

    user_id: str
    first: httpx.AsyncClient
    second: httpx.AsyncClient


@pytest_asyncio.fixture
async def user(pipeline: Pipeline) -> AsyncIterator[User]:
    async with new_user(pipeline) as user:
        yield user


@contextlib.asynccontextmanager
async def new_user(
    pipeline: Pipeline, max_concurrent_requests: int | None = None
) -> AsyncIterator[User]:
    """A user whose key (with its own concurrency limit, if given) opens on both
    gateways."""
    secret, user_id = f"key-{uuid.uuid4().hex}", f"user-{uuid.uuid4().hex[:8]}"
    store = SQLiteStore(pipeline.tmp_path / "chatpipe.db", key_secret=KEY_SECRET.encode())
    await store.open()
    try:
        owner = ApiKey(user_id=user_id, org_id=ORG, tier=Tier.PRO,
                       max_concurrent_requests=max_concurrent_requests)  # fmt: skip
        await store.add_api_key(secret, owner)
    finally:
        await store.close()
    async with pipeline.http("g1", secret) as first, pipeline.http("g2", secret) as second:
        yield User(user_id, first, second)


def turn(max_tokens: int) -> dict[str, object]:
    return {"content": "hello", "max_tokens": max_tokens, "ignore_eos": True}


@pytest.mark.skipif(REDIS_SERVER is None, reason="no redis-server binary")
async def test_a_users_rate_limit_counts_the_requests_of_both_gateways(user):
    await clear_of_minute_edge()  # the windows turn over on the minute
    for client in (user.first, user.second, user.first):
        admitted, events = await native_turn(client, turn(2))
        assert admitted.status_code == 200 and events[-1].data == "[DONE]", admitted.text
    refused, _ = await native_turn(user.second, turn(2))
    assert error_of(refused)["code"] == "rate_limited"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"


@pytest.mark.skipif(REDIS_SERVER is None, reason="no redis-server binary")
async def test_a_keys_concurrent_generations_count_on_both_gateways(pipeline):
    async with new_user(pipeline, max_concurrent_requests=1) as user:
        created = await user.first.post("/v1/conversations", json={})
        url = f"/v1/conversations/{created.json()['conversation_id']}/messages"
        async with user.first.stream("POST", url, json=turn(2000)) as streaming:
            assert streaming.status_code == 200
            lines = streaming.aiter_lines()
            [started] = await read_messages(lines, stop=lambda m: m.event == "request")
            refused, _ = await native_turn(user.second, turn(2))
            assert error_of(refused)["code"] == "too_many_concurrent_requests"
            assert refused.headers["retry-after"] == "1"
            stopped = await user.second.post(
                f"/v1/requests/{orjson.loads(started.data)['request_id']}/cancel"
            )
            assert stopped.status_code == 202, stopped.text
            await read_messages(lines)  # to its end: its lease is released before it
        admitted, events = await native_turn(user.second, turn(2))
        assert admitted.status_code == 200 and events[-1].data == "[DONE]", admitted.text


async def test_a_users_token_budget_counts_what_both_gateways_asked(pipeline, user):
    answered, events = await native_turn(user.first, turn(TOKEN_BUDGET))
    assert answered.status_code == 200 and events[-1].data == "[DONE]", answered.text
    ledger = SQLiteLedger(pipeline.tmp_path / "chatpipe.db")
    await ledger.open()
    try:
        await until_used(ledger, Account.user(ORG, user.user_id), TOKEN_BUDGET)
    finally:
        await ledger.close()
    refused, _ = await native_turn(user.second, turn(2))
    assert error_of(refused)["code"] == "quota_exceeded"


async def test_a_turn_waits_for_the_answer_streaming_on_the_other_gateway_and_stops_it(user):
    created = await user.first.post("/v1/conversations", json={})
    url = f"/v1/conversations/{created.json()['conversation_id']}/messages"
    async with user.first.stream("POST", url, json=turn(2000)) as streaming:
        assert streaming.status_code == 200
        lines = streaming.aiter_lines()
        [started] = await read_messages(lines, stop=lambda m: m.event == "request")
        request_id = orjson.loads(started.data)["request_id"]
        busy = await user.second.post(url, json=turn(2))
        assert busy.status_code == 409, busy.text
        stopped = await user.second.post(f"/v1/requests/{request_id}/cancel")
        assert stopped.status_code == 202, stopped.text
        end = (await read_messages(lines))[-2]  # before [DONE]
    assert end.event == "done" and orjson.loads(end.data)["status"] == "finished_aborted"
