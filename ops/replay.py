"""The Kafka side of `chatpipe replay` and `chatpipe dlq`: read what the bus holds now
(`bus.replay.read_records`) and hand it to the pure parts (`ops.bus_records`,
`ops.request_life`, `ops.dead_letter_queue`); send a dead letter's record again."""

from __future__ import annotations

from dataclasses import dataclass

from aiokafka.structs import ConsumerRecord, TopicPartition

from bus.clients import KafkaConfig
from bus.replay import existing_partitions, offsets_at, read_records
from ops.bus_records import BusRecord, ReadRecord, decoded, window
from ops.client_ids import parse_client_id
from ops.dead_letter_queue import RETRY_HEADER, original_record, parse_dead_letter_id, retry_of
from ops.request_life import answer_requests, conversation_requests, life_topics
from ops.time_bounds import time_offsets_believable
from schemas import topics
from schemas.events import DeadLetter


def _decoded(records: list[ConsumerRecord]) -> list[ReadRecord]:
    return [decoded(BusRecord.of(record)) for record in records]


async def starts_at(
    kafka: KafkaConfig, partitions: list[TopicPartition], since_ms: int | None
) -> dict[TopicPartition, int]:
    """Where to start reading each partition for records from `since_ms` on: the broker's
    `offsets_for_times` where it answers right (a partition with nothing that late is
    left out), else the first offset (the caller filters by time)."""
    if since_ms is not None:
        found = await offsets_at(kafka, partitions, since_ms, time_offsets_believable)
        if found is not None:
            return {tp: offset for tp, offset in found.items() if offset is not None}
    return {tp: 0 for tp in partitions}


async def request_records(
    kafka: KafkaConfig, request_ids: list[str], since_ms: int | None = None
) -> list[ReadRecord]:
    """Every record of the topics a request crosses (from `since_ms` on) that may belong
    to one of `request_ids` (its bytes carry the id; `request_life.owner` decides)."""
    partitions = await existing_partitions(kafka)
    wanted = [tp for topic in life_topics(partitions) for tp in partitions[topic]]
    ids = [rid.encode() for rid in request_ids]

    def carries(record: ConsumerRecord) -> bool:
        return any(rid in (record.value or b"") or rid == record.key for rid in ids)

    records = await read_records(kafka, await starts_at(kafka, wanted, since_ms), carries)
    return window(_decoded(records), since_ms)


async def conversation_request_ids(
    kafka: KafkaConfig, conversation_id: str, since_ms: int | None = None
) -> list[str]:
    """The conversation's requests (queued from `since_ms` on), in the order queued."""
    return conversation_requests(await _queued(kafka, conversation_id, since_ms), conversation_id)


async def named_request_id(
    kafka: KafkaConfig, client_id: str, since_ms: int | None = None
) -> str | None:
    """The request an id the client was shown names (`ops.client_ids`); a response's is
    the first queued for its answer (from `since_ms` on), None when none was."""
    named = parse_client_id(client_id)
    if named.message_id is None:
        return named.request_id
    found = answer_requests(await _queued(kafka, named.message_id, since_ms), named.message_id)
    return found[0] if found else None


async def _queued(kafka: KafkaConfig, id_: str, since_ms: int | None) -> list[ReadRecord]:
    """The request topics' records (from `since_ms` on) whose bytes carry `id_`."""
    partitions = await existing_partitions(kafka, topics.request_topics())
    wanted = [tp for tps in partitions.values() for tp in tps]
    needle = id_.encode()
    records = await read_records(
        kafka, await starts_at(kafka, wanted, since_ms), lambda r: needle in (r.value or b"")
    )
    return window(_decoded(records), since_ms)


async def topic_records(
    kafka: KafkaConfig,
    topic: str,
    from_offset: int | None = None,
    since_ms: int | None = None,
    until_ms: int | None = None,
    key: str | None = None,
    limit: int | None = None,
) -> list[ReadRecord]:
    """`topic`'s records from `from_offset` (each partition) or `since_ms`, up to
    `until_ms`, of key `key`, the first `limit`."""
    partitions = (await existing_partitions(kafka, [topic])).get(topic)
    if not partitions:
        raise LookupError(f"no topic {topic}")
    if from_offset is not None:
        starts = {tp: from_offset for tp in partitions}
    else:
        starts = await starts_at(kafka, partitions, since_ms)
    wanted = key.encode() if key is not None else None
    records = await read_records(
        kafka, starts, None if wanted is None else lambda r: r.key == wanted
    )
    return window(_decoded(records), since_ms, until_ms, key, limit)


async def dead_letter_records(kafka: KafkaConfig) -> list[ReadRecord]:
    partitions = (await existing_partitions(kafka, [topics.DLQ])).get(topics.DLQ, [])
    return _decoded(await read_records(kafka, {tp: 0 for tp in partitions}))


class AlreadyRetried(RuntimeError):
    """The dead letter was sent again before (`retry_dead_letter(force=True)` to repeat)."""


@dataclass(frozen=True)
class Retried:
    letter_id: str
    topic: str
    partition: int
    offset: int
    """Where the record lies now."""


async def retry_dead_letter(kafka: KafkaConfig, letter_id: str, force: bool = False) -> Retried:
    """Send the dead letter's original record (value, key, headers) to its topic and
    partition again, marked as a retry of `letter_id`. LookupError: no such dead letter
    or its topic is gone; ValueError: it cannot be sent as it was; AlreadyRetried."""
    letter = await _dead_letter_at(kafka, *parse_dead_letter_id(letter_id))
    if letter is None:
        raise LookupError(f"no dead letter {letter_id} (see `chatpipe dlq list`)")
    record = original_record(letter, letter_id)
    source = TopicPartition(record.topic, record.partition)
    if source not in (await existing_partitions(kafka, [record.topic])).get(record.topic, []):
        raise LookupError(f"{letter_id}: {record.topic} partition {record.partition} is gone")
    marked = await read_records(
        kafka,
        {source: letter.offset + 1},
        lambda r: any(name == RETRY_HEADER for name, _ in r.headers),
    )
    earlier = retry_of(map(BusRecord.of, marked), letter_id)
    if earlier is not None and not force:
        raise AlreadyRetried(
            f"{letter_id} was retried already: {earlier.topic} partition "
            f"{earlier.partition} offset {earlier.offset}; --force sends it "
            "again"
        )
    producer = kafka.producer()
    await producer.start()
    try:
        sent = await producer.send_and_wait(
            record.topic,
            record.value,
            key=record.key,
            partition=record.partition,
            headers=record.headers,
        )
    finally:
        await producer.stop()
    return Retried(letter_id, sent.topic, sent.partition, sent.offset)


async def _dead_letter_at(kafka: KafkaConfig, partition: int, offset: int) -> DeadLetter | None:
    dlq = TopicPartition(topics.DLQ, partition)
    found = await read_records(
        kafka, {dlq: offset}, lambda r: r.offset == offset, stops={dlq: offset + 1}
    )
    letter = decoded(BusRecord.of(found[0])).event if found else None
    return letter if isinstance(letter, DeadLetter) else None
