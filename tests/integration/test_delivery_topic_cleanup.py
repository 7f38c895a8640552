"""Delivery topics of gateways that are gone are deleted, on a real broker:
the scheduler deletes the `chat.deliver.<id>` topic of a gateway silent for
the TTL, and of one left from before it started, while a live gateway's topic, and a
silent one's that a waiting request still delivers to, are kept. A gateway whose topic
was deleted under it creates it again."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from prometheus_client import REGISTRY

from bus import request_reply
from bus.broker import EmbeddedBroker
from bus.clients import KafkaConfig
from bus.request_reply import RequestReplyClient
from bus.topics import create_topics, delete_topics, ensure_topics, list_topics
from scheduler.core import Policy
from scheduler.stage import SchedulerStage
from schemas import topics
from tests.support.chat import generation_request, until

pytestmark = pytest.mark.timeout(120)

TTL_S = 1.5
DELETED = "chatpipe:delivery_topics_deleted_total"


@pytest_asyncio.fixture(scope="module")
async def kafka() -> AsyncIterator[KafkaConfig]:
    async with EmbeddedBroker() as broker:
        await ensure_topics(broker.bootstrap_servers)
        yield KafkaConfig(broker.bootstrap_servers)


@contextlib.asynccontextmanager
async def running_scheduler(kafka: KafkaConfig) -> AsyncIterator[SchedulerStage]:
    # No resume grace: a silent gateway's waiting request stays until cancelled.
    stage = SchedulerStage(kafka, Policy(), deliver_topic_ttl_s=TTL_S)
    task = asyncio.create_task(stage.run())
    try:
        yield stage
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def client(kafka: KafkaConfig, name: str) -> RequestReplyClient:
    return RequestReplyClient(
        kafka, f"{name}-{uuid.uuid4().hex[:6]}", partitions=1, heartbeat_interval_s=0.1
    )


async def test_the_topics_of_gone_gateways_are_deleted_those_still_used_kept(kafka):
    left = topics.deliver_topic("left", uuid.uuid4().hex[:6])  # died before the scheduler
    await create_topics(kafka, {left: 1})
    deleted_before = REGISTRY.get_sample_value(DELETED) or 0
    live, dead, waiting = client(kafka, "live"), client(kafka, "dead"), client(kafka, "busy")
    async with running_scheduler(kafka) as scheduler, live:
        await dead.start()
        await waiting.start()
        queued = generation_request(waiting.reply_to)
        await waiting.submit(queued)

        async def queued_there() -> bool:
            return scheduler.core.waiting_count == 1

        await until(queued_there)
        await dead.stop()  # heartbeats stop: as if killed
        await waiting.stop()

        async def swept() -> bool:
            listed = await list_topics(kafka, topics.DELIVER_PREFIX)
            return dead.reply_to not in listed and left not in listed

        await until(swept)
        listed = await list_topics(kafka, topics.DELIVER_PREFIX)
        assert live.reply_to in listed, "a gateway that heartbeats keeps its topic"
        assert waiting.reply_to in listed, "a waiting request still delivers there"

        await live.cancel(queued.request_id)

        async def waiting_topic_gone() -> bool:
            return waiting.reply_to not in await list_topics(kafka, topics.DELIVER_PREFIX)

        await until(waiting_topic_gone)
        assert live.reply_to in await list_topics(kafka, topics.DELIVER_PREFIX)
    assert (REGISTRY.get_sample_value(DELETED) or 0) - deleted_before == 3


async def test_a_gateway_whose_topic_was_deleted_under_it_creates_it_again(kafka, monkeypatch):
    # As after a pause longer than the TTL: every heartbeat looks at the topic.
    monkeypatch.setattr(request_reply, "TOPIC_RECHECK_S", 0.0)
    async with client(kafka, "paused") as paused:
        assert await delete_topics(kafka, [paused.reply_to]) == [paused.reply_to]

        async def back() -> bool:
            return paused.reply_to in await list_topics(kafka, topics.DELIVER_PREFIX)

        await until(back, timeout_s=10)
