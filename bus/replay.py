"""Reading a topic from its first offset: what the pipeline recorded, for tests,
benchmarks and debugging. (Tansu cannot seek to the end, DESIGN §11, so every
reader starts at offset 0.)"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from bus.clients import KafkaConfig, kafka_config
from schemas.codec import EventDecodeError, decode


async def replay(kafka: KafkaConfig | str, topic: str, kind: Any,
                 timeout_s: float) -> AsyncIterator[tuple[int, Any]]:
    """(record timestamp ms, event) for every decodable event of `topic`, from offset 0
    of every partition, as records arrive, until `timeout_s` has passed; records that
    do not decode as `kind` are skipped; LookupError if the topic does not exist. Stop
    early by leaving the loop inside `aclosing`."""
    consumer = _reader(kafka)
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


def _reader(kafka: KafkaConfig | str) -> AIOKafkaConsumer:
    """A consumer outside any group, reading where it is told to."""
    return AIOKafkaConsumer(**kafka_config(kafka).connection(), enable_auto_commit=False,
                            fetch_max_wait_ms=20, max_partition_fetch_bytes=8 << 20)


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> list[TopicPartition]:
    """The topic's partitions, waiting up to 5 s for a topic just created."""
    for _ in range(50):
        await consumer.topics()
        partitions = consumer.partitions_for_topic(topic)
        if partitions:
            return [TopicPartition(topic, p) for p in sorted(partitions)]
        await asyncio.sleep(0.1)
    raise LookupError(f"topic {topic} not found")


async def read_between(kafka: KafkaConfig | str, topic: str, bounds: dict[int, tuple[int, int]],
                       kind: Any, timeout_s: float = 10.0,
                       key: bytes | None = None) -> list[tuple[int, int, Any]]:
    """(partition, offset, event) for every record of `topic` in `[start, end)` of each
    partition's bounds, in partition order: a read up to a known end (Tansu cannot say
    where a partition ends, DESIGN §11). Records that do not decode as `kind` are
    skipped, and with `key` those of other keys (before they are decoded); TimeoutError
    if the records are not all there within `timeout_s`."""
    wanted = {p: (start, end) for p, (start, end) in bounds.items() if end > start}
    if not wanted:
        return []
    return await _read(kafka, topic, wanted, kind, timeout_s, key)


async def read_to_end(kafka: KafkaConfig | str, topic: str, kind: Any,
                      timeout_s: float = 10.0) -> list[tuple[int, int, Any]]:
    """(partition, offset, event) for every record of `topic` from offset 0 up to where
    each partition ends when it is first fetched (the high watermark a fetch reports,
    which Tansu gets right), in partition order; records not of `kind` are skipped."""
    return await _read(kafka, topic, None, kind, timeout_s)


async def _read(kafka: KafkaConfig | str, topic: str, bounds: dict[int, tuple[int, int]] | None,
                kind: Any, timeout_s: float, key: bytes | None = None,
                ) -> list[tuple[int, int, Any]]:
    """`bounds` None: every partition from 0 to its first reported end."""
    consumer = _reader(kafka)
    await consumer.start()
    found: list[tuple[int, int, Any]] = []
    try:
        if bounds is None:
            partitions = {tp.partition: tp for tp in await _partitions(consumer, topic)}
        else:
            partitions = {p: TopicPartition(topic, p) for p in bounds}
        consumer.assign(list(partitions.values()))
        ends = {p: end for p, (_, end) in (bounds or {}).items()}
        for p, tp in partitions.items():
            consumer.seek(tp, bounds[p][0] if bounds is not None else 0)
        deadline = time.monotonic() + timeout_s
        while partitions:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic}: {sorted(partitions)} not read within {timeout_s}s")
            batch = await consumer.getmany(*partitions.values(), timeout_ms=200)
            for p, tp in list(partitions.items()):
                if p not in ends:
                    if consumer.highwater(tp) is None:
                        continue  # not fetched yet: its end comes with its first fetch
                    ends[p] = consumer.highwater(tp)
                for record in batch.get(tp, []):
                    if record.offset < ends[p] and (key is None or record.key == key):
                        with contextlib.suppress(EventDecodeError):
                            found.append((p, record.offset, decode(kind, record.value)))
                if await consumer.position(tp) >= ends[p]:
                    del partitions[p]
    finally:
        await consumer.stop()
    return sorted(found, key=lambda item: (item[0], item[1]))
