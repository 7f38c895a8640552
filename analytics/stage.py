"""The analytics consumer's Kafka adapter: records in, Parquet files out.

Its own consumer group (`chatpipe-analytics`), so it never takes records from another
stage. Commit policy: rows are buffered and written every `flush_s` (and at the end);
the offsets they came from are committed only after their Parquet files are written.
A crash in between re-reads those records and writes their rows again, and the
warehouse's views count each key once: idempotent on redelivery. A record it counts
that does not parse goes to chat.dlq and is committed past.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord, TopicPartition

from analytics.rows import TOPICS, Record, Row, Table, rows_of
from analytics.warehouse import Warehouse
from bus.clients import KafkaConfig, Publisher
from bus.offsets import ForgetRevoked, OffsetTracker
from bus.subscriber import failed
from schemas.codec import EVENT_TYPE_HEADER

log = logging.getLogger(__name__)

STAGE = "analytics"
GROUP = "chatpipe-analytics"


@dataclass
class IngestCounts:
    records: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    files: int = 0


class AnalyticsStage:
    def __init__(self, kafka: KafkaConfig, warehouse: Warehouse, group: str = GROUP,
                 flush_s: float = 5.0) -> None:
        self.kafka = kafka
        self.warehouse = warehouse
        self.group = group
        self.flush_s = flush_s
        self.tracker = OffsetTracker()
        self.counts = IngestCounts()
        self._pending: dict[Table, list[Row]] = {}

    async def run(self, until_idle: bool = False, idle_s: float = 10.0) -> IngestCounts:
        """Consume until cancelled; with `until_idle`, stop once every partition is read
        to its end (or nothing came for `idle_s` after joining the group)."""
        self.warehouse.ensure_tables()
        producer = self.kafka.producer()
        consumer = self.kafka.consumer(group_id=self.group, bulk=True)
        consumer.subscribe(list(TOPICS), listener=ForgetRevoked(self.tracker))
        publisher = Publisher(producer)
        await producer.start()
        await consumer.start()
        try:
            flushed_at = last_record_at = time.monotonic()
            while True:
                batch = await consumer.getmany(timeout_ms=200, max_records=5000)
                for records in batch.values():
                    for record in records:
                        await self._take(record, publisher)
                now = time.monotonic()
                if batch:
                    last_record_at = now
                done = until_idle and (await _caught_up(consumer) or (
                    consumer.assignment() and now - last_record_at > idle_s))
                if done or now - flushed_at >= self.flush_s:
                    await self._flush(consumer)
                    flushed_at = now
                if done:
                    return self.counts
        finally:
            await consumer.stop()
            await producer.stop()

    async def _take(self, record: ConsumerRecord, publisher: Publisher) -> None:
        headers = dict(record.headers or ())
        event_type = headers.get(EVENT_TYPE_HEADER)
        try:
            rows = rows_of(Record(record.topic, record.partition, record.offset,
                                  record.timestamp,
                                  event_type.decode() if event_type is not None else None,
                                  record.value))
        except Exception as exc:  # noqa: BLE001 - a bad record is dead-lettered, never fatal
            await failed(STAGE, publisher, record, exc)
            rows = []
        for table, row in rows:
            self._pending.setdefault(table, []).append(row)
        self.counts.records += 1
        self.tracker.seen(TopicPartition(record.topic, record.partition), record.offset)

    async def _flush(self, consumer: AIOKafkaConsumer) -> None:
        """Write what is pending, then commit the offsets it came from."""
        offsets = self.tracker.to_commit()
        pending, self._pending = self._pending, {}
        if pending:
            written = await asyncio.to_thread(self.warehouse.write, pending)
            self.counts.files += len(written)
            for table, rows in pending.items():
                self.counts.rows[table.name] = self.counts.rows.get(table.name, 0) + len(rows)
        if offsets:
            await consumer.commit(offsets)
            self.tracker.committed(offsets)


async def _caught_up(consumer: AIOKafkaConsumer) -> bool:
    """Every assigned partition read to the end its last fetch reported."""
    assigned = consumer.assignment()
    if not assigned:
        return False
    for tp in assigned:
        end = consumer.highwater(tp)
        if end is None or await consumer.position(tp) < end:
            return False
    return True
