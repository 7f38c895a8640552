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
import time
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord, TopicPartition

from analytics.rows import TOPICS, Record, Row, Table, rows_of
from analytics.warehouse import Warehouse
from bus.clients import KafkaConfig
from bus.stage_runner import RunnerOptions, Stage, StageRunner
from schemas.codec import EVENT_TYPE_HEADER

STAGE = "analytics"
GROUP = "chatpipe-analytics"


@dataclass
class IngestCounts:
    records: int = 0
    rows: dict[str, int] = field(default_factory=dict)
    files: int = 0


class AnalyticsStage(Stage):
    def __init__(
        self, kafka: KafkaConfig, warehouse: Warehouse, group: str = GROUP, flush_s: float = 5.0
    ) -> None:
        self.warehouse = warehouse
        self.flush_s = flush_s
        self.counts = IngestCounts()
        self._pending: dict[Table, list[Row]] = {}
        self._unwritten: dict[TopicPartition, int] = {}
        """Per partition, the first offset whose rows are not in a file yet."""
        self.runner = StageRunner(
            kafka, STAGE, group, TOPICS, self, RunnerOptions(bulk=True, max_records=5000)
        )
        self._flushed_at = self._last_record_at = time.monotonic()
        self._until_idle = False
        self._idle_s = 10.0
        self._idle = False

    async def run(self, until_idle: bool = False, idle_s: float = 10.0) -> IngestCounts:
        """Consume until cancelled; with `until_idle`, stop once every partition is read
        to its end (or nothing came for `idle_s` after joining the group)."""
        self.warehouse.ensure_tables()
        self._flushed_at = self._last_record_at = time.monotonic()
        self._until_idle, self._idle_s, self._idle = until_idle, idle_s, False
        await self.runner.run(until=lambda: self._idle)
        return self.counts

    async def handle(self, record: ConsumerRecord) -> None:
        self._last_record_at = time.monotonic()
        await self._take(record)

    async def after_batch(self) -> None:
        """Write what is pending every `flush_s` (and once idle, with `until_idle`)."""
        consumer = self.runner.consumer
        now = time.monotonic()
        self._idle = self._until_idle and (
            await _caught_up(consumer)
            or bool(consumer.assignment() and now - self._last_record_at > self._idle_s)
        )
        if self._idle or now - self._flushed_at >= self.flush_s:
            await self._flush()
            self._flushed_at = now

    def commit_floor(self, tp: TopicPartition) -> int | None:
        return self._unwritten.get(tp)

    async def _take(self, record: ConsumerRecord) -> None:
        """Buffer the record's rows; one that does not parse raises (dead-lettered)."""
        tp = TopicPartition(record.topic, record.partition)
        self._unwritten.setdefault(tp, record.offset)
        self.counts.records += 1
        event_type = dict(record.headers or ()).get(EVENT_TYPE_HEADER)
        rows = rows_of(
            Record(
                record.topic,
                record.partition,
                record.offset,
                record.timestamp,
                event_type.decode() if event_type is not None else None,
                record.value,
            )
        )
        for table, row in rows:
            self._pending.setdefault(table, []).append(row)

    async def _flush(self) -> None:
        """Write what is pending; the runner then commits the offsets it came from. A
        write that fails keeps the rows and their floors: the runner retries the step,
        and commits nothing past them meanwhile."""
        if self._pending:
            written = await asyncio.to_thread(self.warehouse.write, self._pending)
            self.counts.files += len(written)
            for table, rows in self._pending.items():
                self.counts.rows[table.name] = self.counts.rows.get(table.name, 0) + len(rows)
            self._pending = {}
        self._unwritten.clear()

    def on_revoke(self, tp: TopicPartition) -> None:
        """The partition's next owner reads from the group's commit: a floor kept from
        before would hold (or move back) its commits if it comes back here. Its rows
        still pending are written with the rest (the warehouse counts a key once)."""
        self._unwritten.pop(tp, None)


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
