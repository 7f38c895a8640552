"""Reading a topic from its first offset: what the pipeline recorded, for tests,
benchmarks and debugging (`chatpipe replay`, `chatpipe dlq`: chatpipe/ops_commands.py).
Tansu cannot seek to the end nor find an offset by time, so every reader
starts at an offset it knows (0, or one it was given) and ends where a partition ends
when it is first fetched; `offsets_at` finds offsets by time only where the broker's
answer can be believed."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, Callable, Collection, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError, OffsetOutOfRangeError
from aiokafka.structs import ConsumerRecord, TopicPartition

from bus.clients import KafkaConfig, kafka_config
from bus.fetch_pace import PacedConsumer
from bus.topics import topic_partitions
from schemas.codec import EventDecodeError, decode


async def replay(
    kafka: KafkaConfig | str, topic: str, kind: Any, timeout_s: float
) -> AsyncGenerator[tuple[int, Any]]:
    """(record timestamp ms, event) for every decodable event of `topic`, from offset 0
    of every partition, as records arrive, until `timeout_s` has passed; records that
    do not decode as `kind` are skipped; LookupError if the topic does not exist. Stop
    early by leaving the loop inside `aclosing`."""
    consumer = _reader(kafka)
    await consumer.start()
    try:
        partitions = await topic_partitions(consumer, topic, wait_s=5.0)
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


def _reader(kafka: KafkaConfig | str, **options: Any) -> PacedConsumer:
    """A consumer outside any group, reading where it is told to, every record the
    broker holds (`bus.fetch_repair`)."""
    return PacedConsumer(
        **kafka_config(kafka).connection(),
        enable_auto_commit=False,
        fetch_max_wait_ms=20,
        max_partition_fetch_bytes=8 << 20,
        **options,
    )


async def read_between(
    kafka: KafkaConfig | str,
    topic: str,
    bounds: dict[int, tuple[int, int]],
    kind: Any,
    timeout_s: float = 10.0,
    key: bytes | None = None,
) -> list[tuple[int, int, Any]]:
    """(partition, offset, event) for every record of `topic` in `[start, end)` of each
    partition's bounds, in partition order: a read up to a known end (Tansu cannot say
    where a partition ends). Records that do not decode as `kind` are
    skipped, and with `key` those of other keys (before they are decoded); TimeoutError
    if the records are not all there within `timeout_s`."""
    wanted = {p: (start, end) for p, (start, end) in bounds.items() if end > start}
    if not wanted:
        return []
    return await _read(kafka, topic, wanted, kind, timeout_s, key)


async def read_to_end(
    kafka: KafkaConfig | str, topic: str, kind: Any, timeout_s: float = 10.0
) -> list[tuple[int, int, Any]]:
    """(partition, offset, event) for every record of `topic` from offset 0 up to where
    each partition ends when it is first fetched (the high watermark a fetch reports,
    which Tansu gets right), in partition order; records not of `kind` are skipped."""
    return await _read(kafka, topic, None, kind, timeout_s)


async def _read(
    kafka: KafkaConfig | str,
    topic: str,
    bounds: dict[int, tuple[int, int]] | None,
    kind: Any,
    timeout_s: float,
    key: bytes | None = None,
) -> list[tuple[int, int, Any]]:
    """`bounds` None: every partition from 0 to its first reported end."""
    consumer = _reader(kafka)
    await consumer.start()
    try:
        if bounds is None:
            starts = {tp: 0 for tp in await topic_partitions(consumer, topic, wait_s=5.0)}
        else:
            starts = {TopicPartition(topic, p): start for p, (start, _) in bounds.items()}
        records = await _read_partitions(
            consumer,
            starts,
            (lambda tp, _: bounds[tp.partition][1]) if bounds is not None else _first_end,
            (lambda r: r.key == key) if key is not None else None,
            timeout_s,
            idle=False,
        )
    finally:
        await consumer.stop()
    found: list[tuple[int, int, Any]] = []
    for record in records:
        with contextlib.suppress(EventDecodeError):
            found.append((record.partition, record.offset, decode(kind, record.value)))
    return found


async def existing_partitions(
    kafka: KafkaConfig | str,
    topics: Collection[str] | None = None,
) -> dict[str, list[TopicPartition]]:
    """The partitions of each of `topics` the broker has (of every topic without)."""
    consumer = _reader(kafka)
    await consumer.start()
    try:
        names = await consumer.topics()
        wanted = sorted(names if topics is None else set(topics) & set(names))
        return {
            topic: [
                TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())
            ]
            for topic in wanted
        }
    finally:
        await consumer.stop()


async def read_records(
    kafka: KafkaConfig | str,
    starts: Mapping[TopicPartition, int],
    keep: Callable[[ConsumerRecord], bool] | None = None,
    idle_timeout_s: float = 30.0,
    stops: Mapping[TopicPartition, int] | None = None,
) -> list[ConsumerRecord]:
    """Every record of each partition from its start offset up to where the partition
    ended when first fetched (the high watermark a fetch reports), or its `stops` offset
    if that is sooner, kept by `keep`, in partition order: what the bus holds now, of
    any number of topics, with one client. A start past the end reads nothing.
    TimeoutError if a fetch brings nothing new for `idle_timeout_s`."""
    if not starts:
        return []
    consumer = _reader(kafka, auto_offset_reset="none")
    await consumer.start()
    try:
        return await _read_partitions(
            consumer,
            starts,
            lambda tp, end: min(end, (stops or {}).get(tp, end)),
            keep,
            idle_timeout_s,
            idle=True,
        )
    finally:
        await consumer.stop()


def _first_end(_: TopicPartition, end: int) -> int:
    return end


async def _read_partitions(
    consumer: AIOKafkaConsumer,
    starts: Mapping[TopicPartition, int],
    end_of: Callable[[TopicPartition, int], int],
    keep: Callable[[ConsumerRecord], bool] | None,
    timeout_s: float,
    idle: bool,
) -> list[ConsumerRecord]:
    """The one reading loop: each partition from its start up to `end_of(partition, the
    end its first fetch reports)`, records kept by `keep`, sorted by topic, partition and
    offset. TimeoutError after `timeout_s`, counted from the start, or with `idle` from
    the last fetch that brought records. A start past the end reads nothing."""
    open_ = dict(starts)
    consumer.assign(list(open_))
    for tp, start in open_.items():
        consumer.seek(tp, start)
    ends: dict[TopicPartition, int] = {}
    found: list[ConsumerRecord] = []
    deadline = time.monotonic() + timeout_s
    while open_:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{sorted(map(str, open_))} not read within {timeout_s}s")
        try:
            batch = await consumer.getmany(*open_, timeout_ms=200)
        except OffsetOutOfRangeError as exc:  # started past the end: nothing to read
            for tp in exc.args[0] if exc.args and isinstance(exc.args[0], dict) else open_:
                open_.pop(tp, None)
                consumer.pause(tp)
            continue
        if idle and any(batch.values()):
            deadline = time.monotonic() + timeout_s
        for tp in list(open_):
            if tp not in ends:
                if consumer.highwater(tp) is None:
                    continue  # not fetched yet: its end comes with its first fetch
                ends[tp] = end_of(tp, consumer.highwater(tp))
            found.extend(
                record
                for record in batch.get(tp, [])
                if record.offset < ends[tp] and (keep is None or keep(record))
            )
            if await consumer.position(tp) >= ends[tp]:
                del open_[tp]
                consumer.pause(tp)
    return sorted(found, key=lambda r: (r.topic, r.partition, r.offset))


async def offsets_at(
    kafka: KafkaConfig | str,
    partitions: Collection[TopicPartition],
    time_ms: int,
    believable: Callable[[list[Any], int], bool],
) -> dict[TopicPartition, int | None] | None:
    """The first offset of each partition whose record is at or after `time_ms` (None:
    no record that late), from the broker's `offsets_for_times`; None when the broker
    cannot say, or says what `believable` rejects once the records at and before each
    offset are read (`ops.time_bounds.TimeAnswer`; Tansu answers with its own clock)."""
    consumer = _reader(kafka)
    await consumer.start()
    try:
        answers = await consumer.offsets_for_times({tp: time_ms for tp in partitions})
    except (KafkaError, ValueError):
        return None
    finally:
        await consumer.stop()
    said = {tp: (a.offset, a.timestamp) for tp, a in answers.items() if a is not None}
    if any(offset < 0 or stamp < time_ms for offset, stamp in said.values()):
        return None
    around = await read_records(
        kafka,
        {tp: max(offset - 1, 0) for tp, (offset, _) in said.items()},
        stops={tp: offset + 1 for tp, (offset, _) in said.items()},
    )
    stamps = {(r.topic, r.partition, r.offset): r.timestamp for r in around}
    checked = [
        None
        if tp not in said
        else (
            said[tp][0],
            said[tp][1],
            stamps.get((tp.topic, tp.partition, said[tp][0])),
            stamps.get((tp.topic, tp.partition, said[tp][0] - 1)),
        )
        for tp in answers
    ]
    if not believable(checked, time_ms):
        return None
    return {tp: said[tp][0] if tp in said else None for tp in answers}
