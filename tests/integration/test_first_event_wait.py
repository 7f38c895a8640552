"""A gateway fetches its delivery topic with the first-event wait from the moment it
queues a request, on a real broker: a poll returns only with records, so with one stream
at a time, waiting for the next poll to say so would leave the first event itself to
bring the short wait (bus/fetch_pace.py). Once the first event is in, the usual wait
comes back."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from bus.broker import EmbeddedBroker
from bus.clients import KafkaConfig, Publisher
from bus.request_reply import RequestReplyClient
from bus.topics import ensure_topics
from schemas.events import Delta
from tests.support.chat import generation_request, until

pytestmark = pytest.mark.timeout(60)

BUSY_MS, FIRST_EVENT_MS = 20, 5


@pytest_asyncio.fixture(scope="module")
async def kafka() -> AsyncIterator[KafkaConfig]:
    async with EmbeddedBroker() as broker:
        await ensure_topics(broker.bootstrap_servers)
        yield KafkaConfig(
            broker.bootstrap_servers,
            fetch_max_wait_ms=BUSY_MS,
            first_event_fetch_wait_ms=FIRST_EVENT_MS,
        )


def fetch_wait(client: RequestReplyClient) -> int:
    return client._consumer._fetcher._fetch_max_wait_ms


async def test_the_first_event_wait_starts_when_the_request_is_queued(kafka):
    async with RequestReplyClient(
        kafka, f"gw-{uuid.uuid4().hex[:6]}", partitions=1, heartbeat_interval_s=0.2
    ) as client:
        await asyncio.sleep(0.5)  # polls with nothing to read: the usual wait
        assert fetch_wait(client) == BUSY_MS
        request = generation_request(client.reply_to)
        stream = await client.submit(request)
        assert fetch_wait(client) == FIRST_EVENT_MS  # before any poll returned
        producer = kafka.producer()
        await producer.start()
        try:
            await Publisher(producer).send_and_wait(
                client.reply_to, Delta(request_id=request.request_id, text="hi"), key="c"
            )
            async with asyncio.timeout(10):
                assert [e.text for e in await stream.take()] == ["hi"]
        finally:
            await producer.stop()
        await until(lambda: fetch_wait(client) == BUSY_MS, timeout_s=10)  # the first event is in
        await stream.aclose()
