"""Prometheus metrics end to end: a stack with every stage in one process (real broker,
sim engine), scraped at /metrics on the gateway's port before and after what a test does;
and stages run alone (their own processes) serving /metrics on CHATPIPE_METRICS_PORT.

Metrics are process-wide and other stacks of the session share them: each test compares
a scrape after with one before, under this stack's own model name."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest_asyncio
from aiokafka import AIOKafkaProducer

from bench.process_pipeline import prints_logs_on_failure, running_pipeline
from bus.broker import free_port
from chatpipe.dev_stack import running_sim_stack, stack_settings
from chatpipe.wiring import Stack
from conversations.store import ApiKey
from schemas import topics
from schemas.topics import Tier
from tests.support.chat import post_message
from tests.support.metrics import Samples, at, eventually, scrape, total
from tests.support.stack import client_for

MODEL = "metrics-sim"
MAX_SLOTS = 4
REQUESTS_PER_MINUTE = 3
EMAIL_REPLY = (
    "[[sim:reply=Sure. You can write to bob@example.com for the details. "
    + " ".join(f"word{i}" for i in range(100))
    + "]]"
)
STAGE_LAGS = ("gateway", "scheduler", "worker", "safety", "recorder", "billing")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def metrics_stack(tiny_model_dir, tmp_path_factory) -> AsyncIterator[Stack]:
    settings = stack_settings(
        tmp_path_factory.mktemp("metrics-stack"),
        engine="sim",
        model=tiny_model_dir,
        model_name=MODEL,
        sim_tokens_per_s=200.0,
        max_slots=MAX_SLOTS,
        auto_titles=False,
        user_requests_per_minute=REQUESTS_PER_MINUTE,
    )
    async with running_sim_stack(settings) as stack:
        yield stack


async def user_client(stack: Stack, tier: Tier = Tier.PRO) -> httpx.AsyncClient:
    key = f"metrics-{uuid.uuid4().hex[:8]}"
    await stack.store.add_api_key(key, ApiKey(user_id=key, org_id=key, tier=tier))
    return client_for(stack, key)


async def test_a_stream_moves_latency_histograms_finish_reasons_and_gauges(metrics_stack):
    url = f"{metrics_stack.base_url}/metrics"
    labels = {"tier": "pro", "model": MODEL}
    before = await scrape(url)
    async with await user_client(metrics_stack) as client:
        cid = (await client.post("/v1/conversations", json={})).json()["conversation_id"]
        result = await post_message(
            client, cid, {"content": "[[sim:length=40]] hello", "max_tokens": 100}
        )
    assert result.ended_with_done and len(result.of("delta")) >= 2, result.events
    after = await eventually(url, lambda s: at(s, "chatpipe:open_streams") == 0)

    def moved(name: str, **extra: str) -> float:
        return at(after, name, **labels, **extra) - at(before, name, **labels, **extra)

    assert moved("chatpipe:time_to_first_token_seconds_count") == 1
    assert moved("chatpipe:time_to_first_token_seconds_sum") > 0
    assert moved("chatpipe:inter_token_latency_seconds_count") >= 1
    assert moved("chatpipe:e2e_request_latency_seconds_count") == 1
    assert moved("chatpipe:request_success_total", finished_reason="stop") == 1
    assert moved("chatpipe:request_queue_time_seconds_count") == 1
    assert at(after, "chatpipe:open_streams") == 0, "the stream's end closed it"
    assert at(after, "chatpipe:worker_slots_max", model=MODEL) == MAX_SLOTS
    assert ("chatpipe:num_requests_waiting", frozenset({("tier", "pro")})) in after


async def test_consumer_lag_is_reported_for_every_stage(metrics_stack):
    samples = await eventually(
        f"{metrics_stack.base_url}/metrics", lambda s: set(STAGE_LAGS) <= lagging_stages(s)
    )
    assert set(STAGE_LAGS) <= lagging_stages(samples)
    assert (
        "chatpipe:consumer_lag",
        frozenset(
            {
                ("stage", "scheduler"),
                ("group", "chatpipe-scheduler"),
                ("topic", topics.requests_topic(Tier.PRO)),
            }
        ),
    ) in samples


def lagging_stages(samples: Samples) -> set[str]:
    return {dict(series)["stage"] for name, series in samples if name == "chatpipe:consumer_lag"}


async def test_a_retraction_is_counted_by_category_and_its_stream_as_content_filter(metrics_stack):
    url = f"{metrics_stack.base_url}/metrics"
    before = await scrape(url)
    async with await user_client(metrics_stack) as client:
        cid = (await client.post("/v1/conversations", json={})).json()["conversation_id"]
        result = await post_message(client, cid, {"content": EMAIL_REPLY, "max_tokens": 300})
    assert result.of("retract"), result.events
    after = await scrape(url)
    assert (
        at(after, "chatpipe:retractions_total", category="pii")
        - at(before, "chatpipe:retractions_total", category="pii")
    ) == 1
    assert (
        at(
            after,
            "chatpipe:request_success_total",
            tier="pro",
            model=MODEL,
            finished_reason="content_filter",
        )
        - at(
            before,
            "chatpipe:request_success_total",
            tier="pro",
            model=MODEL,
            finished_reason="content_filter",
        )
    ) == 1
    assert at(after, "chatpipe:safety_check_seconds_count") > at(
        before, "chatpipe:safety_check_seconds_count"
    )


async def test_a_rate_limited_request_is_counted_at_admission(metrics_stack):
    url = f"{metrics_stack.base_url}/metrics"
    into_minute = time.time() % 60  # memory windows turn over on the minute
    if into_minute > 50:
        await asyncio.sleep(60 - into_minute + 0.1)
    before = await scrape(url)
    body = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}
    async with await user_client(metrics_stack) as client:
        statuses = [
            (await client.post("/v1/chat/completions", json=body)).status_code
            for _ in range(REQUESTS_PER_MINUTE + 1)
        ]
    assert statuses == [200] * REQUESTS_PER_MINUTE + [429], statuses
    after = await scrape(url)
    assert (
        at(after, "chatpipe:admission_rejections_total", tier="pro", reason="rate_limited")
        - at(before, "chatpipe:admission_rejections_total", tier="pro", reason="rate_limited")
    ) == 1


async def test_a_malformed_record_is_counted_as_a_dead_letter_of_its_stage(metrics_stack):
    url = f"{metrics_stack.base_url}/metrics"
    before = total(await scrape(url), "chatpipe:dead_letters_total", stage="scheduler")
    producer = AIOKafkaProducer(bootstrap_servers=metrics_stack.kafka.bootstrap_servers)
    await producer.start()
    try:
        await producer.send_and_wait(
            topics.requests_topic(Tier.PRO), b"{not an event", key=b"bad", partition=0
        )
    finally:
        await producer.stop()
    after = await eventually(
        url, lambda s: total(s, "chatpipe:dead_letters_total", stage="scheduler") > before
    )
    assert total(after, "chatpipe:dead_letters_total", stage="scheduler") == before + 1


@prints_logs_on_failure
async def test_stages_run_alone_serve_metrics_on_the_metrics_port(tmp_path):
    ports = {stage: free_port() for stage in ("scheduler", "worker", "gateway")}
    async with running_pipeline(tmp_path) as pipe:
        await pipe.start("scheduler", metrics_port=ports["scheduler"])
        await pipe.start("w1", "worker", metrics_port=ports["worker"], max_slots=3)
        await pipe.start("gateway", metrics_port=ports["gateway"])
        await pipe.wait_for_workers("w1")
        await pipe.wait_for_gateway()

        def served(port: int) -> str:
            return f"http://127.0.0.1:{port}/metrics"

        scheduler = await eventually(
            served(ports["scheduler"]), lambda s: "scheduler" in lagging_stages(s)
        )
        assert ("chatpipe:num_requests_waiting", frozenset({("tier", "free")})) in scheduler
        assert lagging_stages(scheduler) == {"scheduler"}
        assert not any(n == "chatpipe:worker_slots_max" for n, _ in scheduler), "its own only"

        worker = await scrape(served(ports["worker"]))
        assert total(worker, "chatpipe:worker_slots_max") == 3
        for url in (served(ports["gateway"]), f"{pipe.base_url()}/metrics"):
            gateway = await scrape(url)
            assert ("chatpipe:open_streams", frozenset()) in gateway, url
