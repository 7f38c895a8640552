"""The stage runner's commit rules, with a fake consumer and publisher."""

from __future__ import annotations

from aiokafka.structs import ConsumerRecord, TopicPartition

from bus.clients import KafkaConfig
from bus.stage_runner import StageRunner

TP = TopicPartition("chat.usage", 0)


def record(offset: int, value: bytes = b"{}") -> ConsumerRecord:
    return ConsumerRecord(TP.topic, TP.partition, offset, 0, 0, None, value, None, 0,
                          len(value), ())


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


def runner(consumer: FakeConsumer, **options) -> StageRunner:
    made = StageRunner(KafkaConfig("127.0.0.1:1"), "billing", "g", [TP.topic], **options)
    made.consumer = consumer  # type: ignore[assignment]
    made.publisher = FakePublisher()  # type: ignore[assignment]
    return made


async def run_out(stage: StageRunner, handle, after_batch=None) -> None:
    consumer = stage.consumer
    await stage.consume(handle, after_batch, until=lambda: not consumer.batches)  # type: ignore[attr-defined]


async def test_commits_one_past_what_was_handled_after_each_batch_once_published():
    consumer = FakeConsumer([record(0), record(1)], [record(2)])
    stage = runner(consumer)

    async def handle(_: ConsumerRecord) -> None:
        pass

    await run_out(stage, handle)
    assert consumer.commits == [{TP: 2}, {TP: 3}]
    assert stage.publisher.flushes == 2  # type: ignore[attr-defined]


async def test_a_record_that_fails_is_dead_lettered_and_committed_past():
    consumer = FakeConsumer([record(0), record(1)])
    stage = runner(consumer)
    ended: list[int] = []

    async def handle(r: ConsumerRecord) -> None:
        if r.offset == 0:
            raise ValueError("bad event")

    async def on_failure(r: ConsumerRecord, exc: Exception) -> None:
        ended.append(r.offset)

    await stage.consume(handle, on_failure=on_failure, until=lambda: not consumer.batches)
    assert [topic for topic, _ in stage.publisher.sent] == ["chat.dlq"]  # type: ignore[attr-defined]
    assert ended == [0]
    assert consumer.commits == [{TP: 2}]


async def test_never_commits_past_the_floor_nor_a_record_held_open():
    consumer = FakeConsumer([record(0), record(1), record(2)], [])
    floor: dict[TopicPartition, int] = {TP: 1}
    stage = runner(consumer, commit_floor=floor.get)

    async def handle(r: ConsumerRecord) -> None:
        if r.offset == 2:
            stage.tracker.started(TP, r.offset)

    async def after_batch() -> None:
        if not consumer.batches:  # the second batch: the floor's answer is done
            floor.clear()

    await run_out(stage, handle, after_batch)
    assert consumer.commits == [{TP: 1}, {TP: 2}]
    stage.tracker.done(TP, 2)
    await stage.commit()
    assert consumer.commits[-1] == {TP: 3}


async def test_a_failing_after_batch_step_is_retried_and_commits_nothing_meanwhile():
    consumer = FakeConsumer([record(0)], [])
    stage = runner(consumer)
    attempts = 0

    async def handle(_: ConsumerRecord) -> None:
        pass

    async def after_batch() -> None:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise OSError("store unreachable")
        assert consumer.commits == []

    await run_out(stage, handle, after_batch)
    assert attempts == 2
    assert consumer.commits == [{TP: 1}]


async def test_a_revoked_partition_is_forgotten_by_the_stage_and_the_tracker():
    consumer = FakeConsumer()
    forgotten: list[int] = []
    stage = runner(consumer, on_revoke=forgotten.append, commit_on_revoke=True)
    stage.tracker.seen(TP, 4)
    await stage.revoked({TP})
    assert forgotten == [0]
    assert consumer.commits == [{TP: 5}]
    assert stage.tracker.to_commit() == {}
