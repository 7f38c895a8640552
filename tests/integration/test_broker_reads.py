"""chatpipe's consumers read every record the real embedded broker holds, where a plain
consumer misses some (`bus.fetch_repair`): near the end of a partition too long for the
broker to list within a fetch's wait, and while several producers write one partition."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import ConsumerRecord, TopicPartition

from bus.broker import EmbeddedBroker
from bus.clients import KafkaConfig

pytestmark = pytest.mark.timeout(120)

BATCHES = 30_000
"""Batches in the partition: listing them takes the broker ~18 ms on an idle core."""
WAIT_MS = 5
"""The consumers' fetch wait, well short of that."""
TOPIC = "long"
PARTITION = TopicPartition(TOPIC, 0)


@pytest_asyncio.fixture(scope="module")
async def broker() -> AsyncIterator[str]:
    async with EmbeddedBroker() as broker:
        yield broker.bootstrap_servers


@pytest_asyncio.fixture(scope="module")
async def long_partition(broker: str) -> str:
    """The broker, holding a partition of BATCHES batches of one record each."""
    await create_topic(broker, TOPIC)
    await write_at_once(broker, TOPIC, BATCHES)
    return broker


async def create_topic(broker: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=broker)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin.close()


async def write_at_once(broker: str, topic: str, count: int, writers: int = 4) -> None:
    """`count` records to partition 0 of `topic`, each its own write and batch, from
    `writers` producers at once."""

    async def write(count: int) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=broker)
        await producer.start()
        try:
            for _ in range(count):
                await producer.send_and_wait(topic, b"x" * 40, partition=0)
        finally:
            await producer.stop()

    await asyncio.gather(*(write(count // writers) for _ in range(writers)))


async def read_last(consumer: AIOKafkaConsumer, within_s: float) -> list[ConsumerRecord]:
    """What `consumer`, placed before the partition's last record, reads within `within_s`."""
    consumer.assign([PARTITION])
    consumer.seek(PARTITION, BATCHES - 1)
    records: list[ConsumerRecord] = []
    try:
        async with asyncio.timeout(within_s):
            while not records:
                batch = await consumer.getmany(timeout_ms=200)
                records = [record for part in batch.values() for record in part]
    except TimeoutError:
        pass
    return records


async def test_the_broker_answers_a_long_partitions_fetch_empty_below_its_watermark(
    long_partition,
):
    consumer = AIOKafkaConsumer(
        bootstrap_servers=long_partition, enable_auto_commit=False, fetch_max_wait_ms=WAIT_MS
    )
    await consumer.start()
    try:
        assert await read_last(consumer, within_s=3) == []
        assert consumer.highwater(PARTITION) == BATCHES
    finally:
        await consumer.stop()


async def test_a_consumer_reads_the_end_of_a_partition_longer_than_its_wait_can_list(
    long_partition,
):
    consumer = KafkaConfig(long_partition, fetch_max_wait_ms=WAIT_MS).consumer()
    await consumer.start()
    try:
        records = await read_last(consumer, within_s=10)
        assert [record.offset for record in records] == [BATCHES - 1]
        assert await consumer.getmany(timeout_ms=200) == {}
        # Caught up, nothing more to read: its own wait again.
        assert consumer._fetcher._fetch_max_wait_ms == WAIT_MS
    finally:
        await consumer.stop()


async def test_a_consumer_tailing_a_partition_several_producers_write_reads_every_record(broker):
    """The broker stores a write's batch after raising the watermark past it, so a fetch
    meanwhile can answer from a later writer's batch: a plain consumer skips a few of
    20,000 records this way."""
    topic, count = "written-at-once", 20_000
    await create_topic(broker, topic)
    consumer = KafkaConfig(broker).consumer()
    await consumer.start()
    partition = TopicPartition(topic, 0)
    consumer.assign([partition])
    consumer.seek(partition, 0)
    seen: list[int] = []

    async def tail() -> None:
        while not seen or seen[-1] < count - 1:  # to the last record, skipped ones or not
            batch = await consumer.getmany(timeout_ms=200)
            seen.extend(record.offset for part in batch.values() for record in part)

    try:
        reading = asyncio.create_task(tail())
        await write_at_once(broker, topic, count)
        await asyncio.wait_for(reading, timeout=30)
        assert seen == list(range(count))
    finally:
        await consumer.stop()
