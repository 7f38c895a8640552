"""The worker stage's start-up: what started is stopped when a later step fails."""

from __future__ import annotations

import pytest

from workers.core import WorkerConfig
from workers.stage import WorkerStage


class FakeConsumer:
    def __init__(self, metadata_fails: bool = False) -> None:
        self.metadata_fails = metadata_fails
        self.started = self.stopped = False

    def busy_while(self, busy, wakes=None, eager=None) -> None:
        pass

    def subscribe(self, topics, listener=None) -> None:
        pass

    def assign(self, partitions) -> None:
        pass

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    async def topics(self) -> set[str]:
        if self.metadata_fails:
            raise OSError("the broker went away")
        return set()


class FakeProducer:
    stopped = False

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        self.stopped = True


class FakeKafka:
    def __init__(self) -> None:
        self.work = FakeConsumer()
        self.control = FakeConsumer(metadata_fails=True)
        self.made_producer = FakeProducer()

    def producer(self) -> FakeProducer:
        return self.made_producer

    def consumer(self, group_id: str | None = None, bulk: bool = False) -> FakeConsumer:
        return self.work if group_id is not None else self.control


async def test_a_control_consumer_that_cannot_be_assigned_stops_both_consumers():
    kafka = FakeKafka()
    stage = WorkerStage(kafka, engine=object(), config=WorkerConfig("w1"))  # type: ignore[arg-type]
    with pytest.raises(OSError):
        await stage.run()
    assert kafka.control.started and kafka.control.stopped
    assert kafka.work.started and kafka.work.stopped and kafka.made_producer.stopped
    assert not stage.started.is_set()
