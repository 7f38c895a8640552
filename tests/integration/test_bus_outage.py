"""A bus that stops answering for a while is waited out, not turned into an error:
the broker is frozen (SIGSTOP) past the producer's request
timeout, so aiokafka gives up on the record, and the stages' publisher sends it again
until the broker is back. A record the bus refuses is not retried. A gateway's client
refuses a request at once while the bus acknowledges none of its heartbeats, and not
because its own process was held up."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from aiokafka import AIOKafkaProducer

from bus.broker import EmbeddedBroker
from bus.clients import KafkaConfig
from bus.produce_failures import RecordRejected, RetryingPublisher
from bus.request_reply import BUS_SILENT_S, BusUnreachable, RequestReplyClient
from bus.topics import ensure_topics
from schemas import topics
from schemas.events import Cancel
from tests.support.chat import generation_request, until

pytestmark = pytest.mark.timeout(120)

REQUEST_TIMEOUT_MS = 1500
FROZEN_S = 5.0


@pytest_asyncio.fixture
async def broker() -> AsyncIterator[EmbeddedBroker]:
    async with EmbeddedBroker() as broker:
        await ensure_topics(broker.bootstrap_servers)
        yield broker


@pytest_asyncio.fixture
async def publisher(broker: EmbeddedBroker) -> AsyncIterator[RetryingPublisher]:
    producer = AIOKafkaProducer(
        bootstrap_servers=broker.bootstrap_servers,
        acks=1,
        request_timeout_ms=REQUEST_TIMEOUT_MS,
        max_request_size=64 * 1024,
    )
    await producer.start()
    yield RetryingPublisher(producer)
    await producer.stop()


async def test_a_frozen_broker_is_waited_out_and_the_record_goes_through(broker, publisher, caplog):
    await publisher.send_and_wait(topics.CONTROL, Cancel(request_id="warm-up"), key="w")
    pid = broker._process.pid
    os.kill(pid, signal.SIGSTOP)
    thawed = asyncio.get_running_loop().call_later(FROZEN_S, os.kill, pid, signal.SIGCONT)
    try:
        with caplog.at_level(logging.WARNING, logger="bus.produce_failures"):
            sent = await asyncio.wait_for(
                publisher.send_and_wait(
                    topics.CONTROL, Cancel(request_id="through-the-outage"), key="r"
                ),
                60,
            )
    finally:
        thawed.cancel()
        os.kill(pid, signal.SIGCONT)
    assert sent.offset >= 0
    assert "retrying" in caplog.text, "the bus failed at least once and was waited out"


async def test_a_record_over_the_limit_is_refused_at_once(publisher):
    with pytest.raises(RecordRejected):
        await asyncio.wait_for(
            publisher.send_and_wait(topics.CONTROL, Cancel(request_id="x" * 100_000), key="r"), 5
        )


def client_of(broker: EmbeddedBroker) -> RequestReplyClient:
    kafka = KafkaConfig(bootstrap_servers=broker.bootstrap_servers)
    return RequestReplyClient(kafka, f"gw-{uuid.uuid4().hex[:6]}", partitions=1,
                              heartbeat_interval_s=0.2)  # fmt: skip


def hold_the_loop(seconds: float) -> None:
    """A blocking call in the gateway's event loop (as an engine's warm-up can be)."""
    time.sleep(seconds)


async def test_a_request_is_refused_at_once_while_the_bus_acknowledges_nothing(broker):
    async with client_of(broker) as client:
        assert client.reachable
        pid = broker._process.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            await until(lambda: not client.reachable, timeout_s=BUS_SILENT_S + 5)
            started = time.monotonic()
            with pytest.raises(BusUnreachable):
                await client.submit(generation_request(client.reply_to))
            assert time.monotonic() - started < 0.1
        finally:
            os.kill(pid, signal.SIGCONT)
        await until(lambda: client.reachable, timeout_s=30)
        stream = await client.submit(generation_request(client.reply_to))
        await stream.aclose()


async def test_a_held_up_process_is_no_silence_of_the_bus(broker):
    async with client_of(broker) as client:
        await asyncio.sleep(0.5)  # a few heartbeats acknowledged
        hold_the_loop(BUS_SILENT_S + 1)
        assert client.reachable, "the heartbeats could not be sent: the bus said nothing"
        stream = await client.submit(generation_request(client.reply_to))
        await stream.aclose()
