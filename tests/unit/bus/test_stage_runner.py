"""The stage runner's commit rules, with a fake consumer and publisher."""

from __future__ import annotations

import pytest
from aiokafka.structs import ConsumerRecord, TopicPartition

from bus.clients import KafkaConfig
from bus.stage_runner import Offsets, RunnerOptions, Stage, StageRunner
from tests.support.bus import TP, FakeConsumer, FakePublisher, record


class FakeStage(Stage):
    """Each hook given as a function, or the default."""

    def __init__(self, handle=None, **hooks) -> None:
        self._handle = handle
        for name, hook in hooks.items():
            setattr(self, name, hook)

    async def handle(self, record: ConsumerRecord) -> None:
        if self._handle is not None:
            await self._handle(record)


def runner(
    consumer: FakeConsumer, stage: Stage | None = None, options: RunnerOptions = RunnerOptions()
) -> StageRunner:
    made = StageRunner(
        KafkaConfig("127.0.0.1:1"), "billing", "g", [TP.topic], stage or FakeStage(), options
    )
    made.consumer = consumer  # type: ignore[assignment]
    made.publisher = FakePublisher()  # type: ignore[assignment]
    return made


async def run_out(stage: StageRunner) -> None:
    consumer = stage.consumer
    await stage.consume(until=lambda: not consumer.batches)  # type: ignore[attr-defined]


async def test_commits_one_past_what_was_handled_after_each_batch_once_published():
    consumer = FakeConsumer([record(0), record(1)], [record(2)])
    stage = runner(consumer)

    await run_out(stage)
    assert consumer.commits == [{TP: 2}, {TP: 3}]
    assert stage.publisher.flushes == 2  # type: ignore[attr-defined]


async def test_a_record_that_fails_is_dead_lettered_and_committed_past():
    consumer = FakeConsumer([record(0), record(1)])
    ended: list[int] = []

    async def handle(r: ConsumerRecord) -> None:
        if r.offset == 0:
            raise ValueError("bad event")

    async def on_failure(r: ConsumerRecord, exc: Exception) -> None:
        ended.append(r.offset)

    stage = runner(consumer, FakeStage(handle, on_failure=on_failure))
    await stage.consume(until=lambda: not consumer.batches)
    assert [topic for topic, _ in stage.publisher.sent] == ["chat.dlq"]  # type: ignore[attr-defined]
    assert ended == [0]
    assert consumer.commits == [{TP: 2}]


async def test_a_record_held_open_that_fails_later_takes_the_same_dead_letter_path():
    """Work a handler holds open (`tracker.started`) and fails after it returned: the
    record is dead-lettered, `on_failure` ends what it belonged to, and once marked done
    it is committed past."""
    consumer = FakeConsumer([record(0)], [])
    ended: list[tuple[int, str]] = []

    async def handle(r: ConsumerRecord) -> None:
        stage.tracker.started(TP, r.offset)

    async def on_failure(r: ConsumerRecord, exc: Exception) -> None:
        ended.append((r.offset, str(exc)))

    stage = runner(consumer, FakeStage(handle, on_failure=on_failure))
    await stage.consume(until=lambda: len(consumer.batches) == 1)
    assert consumer.commits == [{TP: 0}]  # held open: nothing past it
    assert stage.publisher.sent == []  # type: ignore[attr-defined]

    await stage.failed(record(0), RuntimeError("the round failed"))
    stage.tracker.done(TP, 0)
    await stage.consume(until=lambda: not consumer.batches)
    [(topic, letter)] = stage.publisher.sent  # type: ignore[attr-defined]
    assert topic == "chat.dlq" and letter.error == "RuntimeError: the round failed"
    assert (letter.stage, letter.offset) == ("billing", 0)
    assert ended == [(0, "the round failed")]
    assert consumer.commits[-1] == {TP: 1}


async def test_never_commits_past_the_floor_nor_a_record_held_open():
    consumer = FakeConsumer([record(0), record(1), record(2)], [])
    floor: dict[TopicPartition, int] = {TP: 1}

    async def handle(r: ConsumerRecord) -> None:
        if r.offset == 2:
            stage.tracker.started(TP, r.offset)

    async def after_batch() -> None:
        if not consumer.batches:  # the second batch: the floor's answer is done
            floor.clear()

    stage = runner(consumer, FakeStage(handle, commit_floor=floor.get, after_batch=after_batch))
    await run_out(stage)
    assert consumer.commits == [{TP: 1}, {TP: 2}]
    stage.tracker.done(TP, 2)
    await stage.commit()
    assert consumer.commits[-1] == {TP: 3}


async def test_a_failing_after_batch_step_is_retried_and_commits_nothing_meanwhile():
    consumer = FakeConsumer([record(0)], [])
    attempts = 0

    async def after_batch() -> None:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise OSError("store unreachable")
        assert consumer.commits == []

    stage = runner(consumer, FakeStage(after_batch=after_batch))
    await run_out(stage)
    assert attempts == 2
    assert consumer.commits == [{TP: 1}]


async def test_a_revoked_partition_is_forgotten_by_the_stage_and_the_tracker():
    consumer = FakeConsumer()
    forgotten: list[TopicPartition] = []
    stage = runner(
        consumer, FakeStage(on_revoke=forgotten.append), RunnerOptions(commit_on_revoke=True)
    )
    stage.tracker.seen(TP, 4)
    await stage.revoked({TP})
    assert forgotten == [TP]  # the topic too: a stage reading several must tell them apart
    assert consumer.commits == [{TP: 5}]
    assert stage.tracker.to_commit() == {}


async def test_a_commit_rule_says_what_to_commit_now_and_after_commit_hears_each_step():
    consumer = FakeConsumer([record(0)], [record(1), record(2)])
    heard: list[dict[TopicPartition, int]] = []

    async def after_commit(committed: dict[TopicPartition, int]) -> None:
        heard.append(committed)

    def commit_rule(done: Offsets) -> Offsets:
        return done if done[TP] >= 3 else {}

    stage = runner(consumer, FakeStage(commit_rule=commit_rule, after_commit=after_commit))
    await run_out(stage)
    assert consumer.commits == [{TP: 3}]
    assert heard == [{}, {TP: 3}]
    assert stage.publisher.flushes == 1  # type: ignore[attr-defined]


class AssignedConsumer(FakeConsumer):
    """Two partitions of chat.usage, the first committed at 5; it has no `subscribe`."""

    def __init__(self) -> None:
        super().__init__()
        self.assigned: list[TopicPartition] = []
        self.positions: dict[TopicPartition, int] = {}
        self.stopped = False

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self.stopped = True

    async def topics(self) -> set[str]:
        return {TP.topic}

    def partitions_for_topic(self, topic: str) -> set[int]:
        return {1, 0} if topic == TP.topic else set()

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned = list(partitions)

    async def committed(self, tp: TopicPartition) -> int | None:
        return 5 if tp.partition == 0 else None

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.positions[tp] = offset


class FakeProducer:
    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass


class AssignedKafka:
    def __init__(self, consumer: AssignedConsumer) -> None:
        self.made = consumer

    def producer(self) -> FakeProducer:
        return FakeProducer()

    def consumer(self, group_id: str, bulk: bool) -> AssignedConsumer:
        return self.made


async def test_by_assignment_it_reads_every_partition_from_the_groups_commit_without_joining():
    consumer = AssignedConsumer()
    stage = StageRunner(
        AssignedKafka(consumer),
        "scheduler",
        "g",
        [TP.topic],  # type: ignore[arg-type]
        FakeStage(),
        RunnerOptions(assign=True),
    )
    await stage.start()
    second = TopicPartition(TP.topic, 1)
    assert consumer.assigned == [TP, second]
    assert stage.committed == consumer.positions == {TP: 5, second: 0}
    assert stage.partitions(TP.topic) == [TP, second]
    await stage.stop()


async def test_by_assignment_a_missing_topic_stops_what_started():
    consumer = AssignedConsumer()
    stage = StageRunner(
        AssignedKafka(consumer),
        "scheduler",
        "g",
        ["chat.none"],  # type: ignore[arg-type]
        FakeStage(),
        RunnerOptions(assign=True),
    )
    with pytest.raises(LookupError):
        await stage.start()
    assert consumer.stopped


class PacingConsumer(AssignedConsumer):
    """Remembers what the stage said about its work (`PacedConsumer.busy_while`)."""

    told: tuple[int, bool, bool] | None = None

    def busy_while(self, busy, wakes=None, eager=None) -> None:
        self.told = (busy(), wakes("chat.workers"), eager({}))


async def test_a_stage_with_its_own_word_on_its_work_paces_the_consumer_with_it():
    consumer = PacingConsumer()
    stage = StageRunner(
        AssignedKafka(consumer),
        "safety",
        "g",
        [TP.topic],  # type: ignore[arg-type]
        FakeStage(busy=lambda: 3),
        RunnerOptions(assign=True),
    )
    await stage.start()
    assert consumer.told == (3, False, False)  # its own busy; the default wakes and eager
    await stage.stop()
