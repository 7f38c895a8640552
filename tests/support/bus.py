"""Fakes for a stage's Kafka clients: a consumer fed records by hand, a publisher that
keeps what it sends."""

from __future__ import annotations

from aiokafka.structs import ConsumerRecord, TopicPartition

TP = TopicPartition("chat.usage", 0)


def record(offset: int, value: bytes = b"{}") -> ConsumerRecord:
    return ConsumerRecord(
        TP.topic, TP.partition, offset, 0, 0, None, value, None, 0, len(value), ()
    )


class FakeConsumer:
    def __init__(self, *batches: list[ConsumerRecord]) -> None:
        self.batches = [{TP: records} if records else {} for records in batches]
        self.commits: list[dict[TopicPartition, int]] = []

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None):
        return self.batches.pop(0) if self.batches else {}

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.commits.append(dict(offsets))

    def assignment(self) -> set[TopicPartition]:
        return set()


class FakePublisher:
    def __init__(self) -> None:
        self.sent: list[tuple[str, object]] = []
        self.flushes = 0

    async def send_and_wait(self, topic: str, event: object, key: str | None = None):
        self.sent.append((topic, event))

    async def flush(self) -> None:
        self.flushes += 1
