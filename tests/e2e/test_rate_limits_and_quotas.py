"""Rate limits and quotas over HTTP through the whole pipeline: real broker, sim engine,
small limits. Token usage flows worker → chat.usage → billing → ledger → quota check."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from math import ceil

import httpx
import pytest_asyncio
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from bench.topic_log import find_events
from billing.stage import GROUP as BILLING_GROUP
from bus.clients import Publisher
from chatpipe.dev_stack import running_sim_stack, stack_settings
from chatpipe.wiring import Stack
from conversations.store import ApiKey
from ledger.charges import Account
from ledger.store import SQLiteLedger
from schemas import topics
from schemas.events import DeadLetter, UsageEvent
from schemas.lifecycle import RequestStatus
from schemas.topics import Tier
from tests.support.limits import clear_of_minute_edge, error_of, native_turn, until_used
from tests.support.stack import client_for

LIMITS = dict(
    user_requests_per_minute=3,
    org_requests_per_minute=5,
    user_tokens_per_minute=1000,
    org_tokens_per_minute=1_000_000,
    user_token_budget=300,
    org_token_budget=500,
)
RATE_HEADERS = [
    f"x-ratelimit-{kind}-{quantity}"
    for quantity in ("requests", "tokens")
    for kind in ("limit", "remaining", "reset")
]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def limited_stack(tmp_path_factory) -> AsyncIterator[Stack]:
    settings = stack_settings(
        tmp_path_factory.mktemp("limited-stack"),
        engine="sim",
        sim_tokens_per_s=400.0,
        max_slots=8,
        **LIMITS,
    )
    async with running_sim_stack(settings) as stack:
        yield stack


@pytest_asyncio.fixture(loop_scope="session")
async def ledger(limited_stack: Stack) -> AsyncIterator[SQLiteLedger]:
    """A reader of billing's ledger on its own connection, as a second gateway would be."""
    reader = SQLiteLedger(limited_stack.settings.storage.database_path)
    await reader.open()
    yield reader
    await reader.close()


async def client_as(stack: Stack, user: str, org: str) -> httpx.AsyncClient:
    key = f"key-{user}-{uuid.uuid4().hex[:6]}"
    await stack.store.add_api_key(key, ApiKey(user_id=user, org_id=org, tier=Tier.PRO))
    return client_for(stack, key)


async def openai_stream(
    client: httpx.AsyncClient, max_tokens: int, read_all: bool = True
) -> httpx.Response:
    body = {
        "model": "tiny-random",
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200 or read_all:
            await response.aread()
    return response  # leaving early disconnects: the generation is cancelled


async def openai_completion(
    client: httpx.AsyncClient, max_tokens: int, ignore_eos: bool = False
) -> httpx.Response:
    return await client.post(
        "/v1/chat/completions",
        json={
            "model": "tiny-random",
            "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": max_tokens,
            "ignore_eos": ignore_eos,
        },
    )


# --- rate limits ------------------------------------------------------------------------------


async def test_every_generation_response_carries_the_headers_and_the_4th_request_gets_429(
    limited_stack: Stack,
) -> None:
    await clear_of_minute_edge()
    async with await client_as(limited_stack, "rl-user", "rl-org") as client:
        native, events = await native_turn(client, {"content": "hi", "max_tokens": 4})
        assert native.status_code == 200 and events[-1].data == "[DONE]"
        streamed = await openai_stream(client, max_tokens=4)
        assert streamed.status_code == 200 and "data: [DONE]" in streamed.text
        plain = await openai_completion(client, max_tokens=4)
        assert plain.status_code == 200 and plain.json()["choices"], plain.text

        for response, remaining in ((native, 2), (streamed, 1), (plain, 0)):
            assert set(RATE_HEADERS) <= set(response.headers)
            assert response.headers["x-ratelimit-limit-requests"] == "3"
            assert response.headers["x-ratelimit-remaining-requests"] == str(remaining)
            assert response.headers["x-ratelimit-limit-tokens"] == "1000"
        # Native "hi" comes after the system prompt; "hello there" is 11 characters:
        # 3 tokens estimated. Plus max_tokens 4 per call.
        native_prompt = ceil((len(limited_stack.settings.context.system_prompt) + 2) / 4)
        assert plain.headers["x-ratelimit-remaining-tokens"] == str(
            1000 - native_prompt - 4 - 2 * 7
        )

        refused, _ = await native_turn(client, {"content": "hi", "max_tokens": 4})
        error = error_of(refused)
        assert error["code"] == "rate_limited" and error["type"] == "rate_limit_error"
        assert "user_requests_per_minute" in error["message"]
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
        assert set(RATE_HEADERS) <= set(refused.headers)

        other = await openai_stream(client, max_tokens=4)
        assert other.status_code == 429  # the OpenAI route shares the same limits
    async with await client_as(limited_stack, "rl-neighbour", "rl-other-org") as client:
        assert (await openai_completion(client, max_tokens=4)).status_code == 200


async def test_the_org_limit_counts_every_user_of_the_org(limited_stack: Stack) -> None:
    await clear_of_minute_edge()
    async with (
        await client_as(limited_stack, "org-a", "busy-org") as a,
        await client_as(limited_stack, "org-b", "busy-org") as b,
    ):
        for client in (a, a, a, b, b):
            assert (await openai_completion(client, max_tokens=2)).status_code == 200
        error = error_of(await openai_completion(b, max_tokens=2))
        assert "org_requests_per_minute" in error["message"]


async def test_tokens_per_minute_count_the_prompt_estimate_and_max_tokens(
    limited_stack: Stack,
) -> None:
    await clear_of_minute_edge()
    async with await client_as(limited_stack, "tok-user", "tok-org") as client:
        first = await openai_stream(client, max_tokens=900, read_all=False)
        assert first.status_code == 200
        assert first.headers["x-ratelimit-remaining-tokens"] == str(1000 - 903)

        refused = await openai_stream(client, max_tokens=200)
        error = error_of(refused)
        assert "user_tokens_per_minute" in error["message"]
        assert 1 <= int(refused.headers["Retry-After"]) <= 120

        too_large = await openai_completion(client, max_tokens=1200)
        error = error_of(too_large)
        assert "user_tokens_per_minute" in error["message"] and "max_tokens" in error["message"]
        assert "Retry-After" not in too_large.headers


async def test_n_choices_are_charged_as_n_answers(
    limited_stack: Stack, ledger: SQLiteLedger
) -> None:
    """`n` choices reserve n times max_tokens at admission, and billing charges every
    choice's generation (the sim engine counts the prompt's 2 words per generation)."""
    await clear_of_minute_edge()
    org = f"choices-org-{uuid.uuid4().hex[:6]}"
    async with await client_as(limited_stack, "choices-user", org) as client:
        response = await client.post(
            "/v1/chat/completions",
            json={
                "model": "tiny-random",
                "messages": [{"role": "user", "content": "hello there"}],
                "max_tokens": 50,
                "ignore_eos": True,
                "n": 2,
            },
        )
        assert response.status_code == 200, response.text
        assert response.headers["x-ratelimit-remaining-tokens"] == str(1000 - (3 + 2 * 50))
        usage = response.json()["usage"]
        assert (usage["prompt_tokens"], usage["completion_tokens"]) == (2, 100)
        assert await until_used(ledger, Account.user(org, "choices-user"), 104) == 104


# --- quotas -------------------------------------------------------------------------------------


async def test_budgets_run_out_on_completed_usage_per_user_and_per_org(
    limited_stack: Stack, ledger: SQLiteLedger
) -> None:
    quota_org = f"quota-org-{uuid.uuid4().hex[:6]}"
    async with await client_as(limited_stack, "quota-a", quota_org) as a:
        conversation = (await a.post("/v1/conversations", json={})).json()["conversation_id"]
        answered, events = await native_turn(
            a, {"content": "count to three", "max_tokens": 320, "ignore_eos": True}, conversation
        )
        assert answered.status_code == 200 and events[-1].data == "[DONE]"
        used = await until_used(ledger, Account.user(quota_org, "quota-a"), 300)
        system_words = len(limited_stack.settings.context.system_prompt.split())
        assert used == system_words + 3 + 320  # the sim engine counts prompt words

        refused, _ = await native_turn(a, {"content": "more", "max_tokens": 4}, conversation)
        error = error_of(refused)
        assert error["code"] == "quota_exceeded"
        assert error["message"].startswith(f"user token budget exhausted: {used} of 300")
        midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        until_midnight = (midnight + timedelta(days=1)).timestamp() - time.time()
        assert abs(int(refused.headers["Retry-After"]) - ceil(until_midnight)) <= 2
        assert set(RATE_HEADERS) <= set(refused.headers)
        stored = (await a.get(f"/v1/conversations/{conversation}")).json()["messages"]
        assert [m["role"] for m in stored] == ["user", "assistant"]  # the refused turn: none

    async with await client_as(limited_stack, "quota-b", quota_org) as b:
        answer = await openai_completion(b, max_tokens=200, ignore_eos=True)
        assert answer.status_code == 200  # the org has used 328 of 500
        assert await until_used(ledger, Account.org(quota_org), 500) == used + 2 + 200
    async with await client_as(limited_stack, "quota-c", quota_org) as c:
        error = error_of(await openai_completion(c, max_tokens=4))
        assert error["code"] == "quota_exceeded"
        assert error["message"].startswith("org token budget exhausted")
    async with await client_as(limited_stack, "quota-d", "quota-elsewhere") as d:
        assert (await openai_completion(d, max_tokens=4)).status_code == 200


# --- the billing stage ----------------------------------------------------------------------------


async def test_billing_counts_a_redelivered_event_once_and_dead_letters_garbage(
    limited_stack: Stack, ledger: SQLiteLedger
) -> None:
    user, request_id = f"dup-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    event = UsageEvent(
        request_id=request_id,
        attempt=0,
        conversation_id="c",
        user_id=user,
        org_id="dup-org",
        tier=Tier.FREE,
        model="tiny-random",
        worker_id="w",
        status=RequestStatus.FINISHED_STOPPED,
        prompt_tokens=10,
        completion_tokens=5,
        cached_tokens=0,
        gpu_ms=1.0,
    )
    producer = limited_stack.kafka.producer()
    await producer.start()
    try:
        publisher = Publisher(producer)
        await publisher.send_and_wait(topics.USAGE, event, key=user)
        await publisher.send_and_wait(topics.USAGE, event, key=user)  # a redelivery
        await producer.send_and_wait(topics.USAGE, b"{not json", key=user.encode())
        # A continuation: it streamed 4 more tokens after the 5 of attempt 0.
        last = await publisher.send_and_wait(
            topics.USAGE,
            event.model_copy(
                update={"attempt": 1, "prior_completion_tokens": 5, "completion_tokens": 4}
            ),
            key=user,
        )
    finally:
        await producer.stop()

    # One key, one partition: once attempt 1 is counted, everything before it was read.
    # The prompt is paid once and each generated token once: 10 + 5 + 4.
    assert await until_used(ledger, Account.user("dup-org", user), 19) == 19
    dead = await find_events(
        limited_stack.kafka,
        topics.DLQ,
        DeadLetter,
        lambda e: e.stage == "billing" and e.key == user,
    )
    assert dead and dead[0].value == "{not json"
    await until_committed(
        limited_stack, TopicPartition(topics.USAGE, last.partition), last.offset + 1
    )


async def until_committed(stack: Stack, tp: TopicPartition, offset: int) -> None:
    # A group member that never subscribes: it reads the group's offsets without joining.
    reader = AIOKafkaConsumer(
        bootstrap_servers=stack.kafka.bootstrap_servers,
        group_id=BILLING_GROUP,
        enable_auto_commit=False,
    )
    await reader.start()
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            committed = await reader.committed(tp)
            if committed is not None and committed >= offset:
                return
            await asyncio.sleep(0.2)
        raise AssertionError(f"billing never committed {tp} past {offset}")
    finally:
        await reader.stop()
