"""Reading a topic from its first offset: what the pipeline recorded, for tests,
benchmarks and debugging. (Tansu cannot seek to the end, DESIGN §11, so every
reader starts at offset 0.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from schemas.codec import EventDecodeError, decode


async def replay(bootstrap_servers: str, topic: str, kind: Any,
                 timeout_s: float) -> AsyncIterator[tuple[int, Any]]:
    """(record timestamp ms, event) for every decodable event of `topic`, from offset 0
    of every partition, as records arrive, until `timeout_s` has passed; records that
    do not decode as `kind` are skipped; LookupError if the topic does not exist. Stop
    early by leaving the loop inside `aclosing`."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap_servers, enable_auto_commit=False,
                                fetch_max_wait_ms=20, max_partition_fetch_bytes=8 << 20)
    await consumer.start()
    try:
        partitions = await _partitions(consumer, topic)
        consumer.assign(partitions)
        for tp in partitions:
            consumer.seek(tp, 0)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=200, max_records=5000)
            for records in batch.values():
                for record in records:
                    try:
                        event = decode(kind, record.value)
                    except EventDecodeError:
                        continue
                    yield record.timestamp, event
    finally:
        await consumer.stop()


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> list[TopicPartition]:
    """The topic's partitions, waiting up to 5 s for a topic just created."""
    for _ in range(50):
        await consumer.topics()
        partitions = consumer.partitions_for_topic(topic)
        if partitions:
            return [TopicPartition(topic, p) for p in sorted(partitions)]
        await asyncio.sleep(0.1)
    raise LookupError(f"topic {topic} not found")
