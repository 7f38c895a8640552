"""The analytics stage's commits around its warehouse writes, with the runner's fakes."""

from __future__ import annotations

import math
from pathlib import Path

from aiokafka.structs import TopicPartition

from analytics.rows import Row, Table
from analytics.stage import AnalyticsStage
from bus.clients import KafkaConfig
from schemas import topics
from schemas.codec import encode
from schemas.events import UsageEvent
from schemas.lifecycle import RequestStatus
from tests.support.bus import TP, FakeConsumer, FakePublisher, record

assert TP.topic == topics.USAGE


def usage(offset: int):
    event = UsageEvent(
        request_id=f"r{offset}",
        conversation_id="c1",
        user_id="u1",
        org_id="acme",
        tier=topics.Tier.FREE,
        model="tiny-random",
        worker_id="w1",
        status=RequestStatus.FINISHED_STOPPED,
        prompt_tokens=3,
        completion_tokens=2,
        cached_tokens=0,
        gpu_ms=1.0,
        created_at=100.0,
    )
    return record(offset, encode(event))


class FlakyWarehouse:
    """Its first `fail` writes raise; it remembers the request ids of what it wrote."""

    def __init__(self, consumer: FakeConsumer, fail: int = 1) -> None:
        self.consumer = consumer
        self.fail = fail
        self.written: list[list[str]] = []
        self.commits_before_writes: list[list[dict[TopicPartition, int]]] = []

    def write(self, rows: dict[Table, list[Row]]) -> list[Path]:
        self.commits_before_writes.append(list(self.consumer.commits))
        if self.fail:
            self.fail -= 1
            raise OSError("disk full")
        self.written.append([row[0] for table_rows in rows.values() for row in table_rows])
        return [Path(f"{table.name}.parquet") for table in rows]


def stage_on(consumer: FakeConsumer, warehouse: object) -> AnalyticsStage:
    stage = AnalyticsStage(KafkaConfig("127.0.0.1:1"), warehouse)  # type: ignore[arg-type]
    stage.runner.consumer = consumer  # type: ignore[assignment]
    stage.runner.publisher = FakePublisher()  # type: ignore[assignment]
    return stage


async def test_rows_of_a_failed_write_are_written_on_the_retry_and_only_then_committed():
    consumer = FakeConsumer([usage(0), usage(1)], [])
    warehouse = FlakyWarehouse(consumer)
    stage = stage_on(consumer, warehouse)
    stage.flush_s = 0.0  # every batch's rows written after it
    await stage.runner.consume(until=lambda: not consumer.batches)
    assert warehouse.commits_before_writes == [[], []]  # nothing committed past the rows
    assert warehouse.written == [["r0", "r1"]]
    assert consumer.commits == [{TP: 2}]
    assert stage.counts.rows == {"usage": 2}


async def test_a_revoked_partition_read_again_commits_from_where_it_is_read_not_before():
    consumer = FakeConsumer([usage(9)])
    stage = stage_on(consumer, FlakyWarehouse(consumer, fail=0))
    await stage._take(usage(5))  # buffered, not written: its floor is 5
    await stage.runner.revoked({TP})
    # The group committed up to 9 meanwhile; the partition comes back and is read from 9.
    stage.flush_s = math.inf  # no rows written
    await stage.runner.consume(until=lambda: not consumer.batches)
    assert consumer.commits == [{TP: 9}]  # never 5: behind the group's commit
