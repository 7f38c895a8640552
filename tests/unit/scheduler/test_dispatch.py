"""The scheduler adapter's dispatch with a fake bus: the attempt's marker comes first and
sets the stream position; a dispatch that cannot be sent ends only its own request."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiokafka.errors import MessageSizeTooLargeError
from aiokafka.structs import ConsumerRecord

from bus.clients import KafkaConfig
from scheduler.claims import Claim
from scheduler.core import Policy
from scheduler.journal import DISPATCH_FAILED, JournalWindow
from scheduler.shards import Shard
from scheduler.stage import SchedulerStage
from schemas import topics
from schemas.codec import encode, headers
from schemas.events import (
    AttemptStarted,
    Cancel,
    DeadLetter,
    GenerationError,
    Unserved,
    WorkAssignment,
)
from tests.support.scheduler import heartbeat, make_request


@dataclass
class Sent:
    partition: int
    offset: int


def never(topic: str, event: Any) -> bool:
    return False


@dataclass
class FakeBus:
    """A publisher that numbers what it is sent per topic; what `fails` raises."""

    fails: Callable[[str, Any], bool] = never
    events: list[tuple[str, Any]] = field(default_factory=list)

    async def send_and_wait(
        self, topic: str, event: Any, key: str | None = None, partition: int | None = None
    ) -> Sent:
        if self.fails(topic, event):
            raise MessageSizeTooLargeError("too big for the bus")
        self.events.append((topic, event))
        return Sent(partition or 0, sum(1 for t, _ in self.events if t == topic) - 1)

    async def send(
        self, topic: str, event: Any, key: str | None = None, partition: int | None = None
    ) -> Sent:
        return await self.send_and_wait(topic, event, key, partition)

    def of(self, topic: str) -> list[Any]:
        return [event for t, event in self.events if t == topic]


def stage_on(bus: FakeBus) -> SchedulerStage:
    stage = SchedulerStage(KafkaConfig("unused:9092"), Policy(), scheduler_id="s1")
    stage.core.on_heartbeat(heartbeat("w1", slots=4))
    stage.publisher = bus  # type: ignore[assignment]
    stage.claim = Claim(bus, None, "unused:9092", "s1", epoch=7)  # type: ignore[arg-type]
    stage.journal = JournalWindow({p: 0 for p in range(4)}, {p: 0 for p in range(4)})
    stage.work_partitions = 4
    return stage


async def test_dispatch_marks_the_attempt_then_assigns_with_the_stream_position():
    bus = FakeBus()
    stage = stage_on(bus)
    bus.events += [(topics.TOKENS, "earlier output")] * 5
    stage.core.add_request(make_request("a"))
    [dispatch] = stage.core.schedule()
    await stage._dispatch(dispatch)
    [marker] = [e for e in bus.of(topics.TOKENS) if isinstance(e, AttemptStarted)]
    [assignment] = bus.of(topics.WORK)
    assert (marker.request_id, marker.attempt, marker.worker_id) == ("a", 0, "w1")
    assert assignment.epoch == 7
    stream = assignment.request.stream
    assert (stream.start_offset, stream.attempt_offset) == (5, 5)

    stage.core.on_heartbeat(
        heartbeat(
            "w1", slots=4, stopping=True, handed_back=("a",), consumed={dispatch.partition: 1}
        )
    )
    stage.core.on_heartbeat(heartbeat("w2", slots=4))
    [again] = stage.core.schedule()
    await stage._dispatch(again)
    retry = bus.of(topics.WORK)[-1]
    assert isinstance(retry, WorkAssignment) and retry.request.attempt == 1
    assert (retry.request.stream.start_offset, retry.request.stream.attempt_offset) == (5, 6)


async def test_dispatch_that_cannot_be_sent_ends_its_request_and_the_stage_goes_on():
    bus = FakeBus(
        fails=lambda topic, event: (
            isinstance(event, WorkAssignment) and event.request.request_id == "big"
        )
    )
    stage = stage_on(bus)
    stage.core.add_request(make_request("big"))
    stage.core.add_request(make_request("ok", user="other"))
    for dispatch in stage.core.schedule():
        await stage._dispatch(dispatch)

    [letter] = bus.of(topics.DLQ)
    assert isinstance(letter, DeadLetter) and letter.topic == topics.WORK
    assert "MessageSizeTooLargeError" in letter.error and '"big"' in letter.value
    unserved = [e for e in bus.of(topics.WORK) if isinstance(e, Unserved)]
    assert [(u.request_id, u.code) for u in unserved] == [("big", DISPATCH_FAILED)]
    [end] = [e for e in bus.of(topics.TOKENS) if isinstance(e, GenerationError)]
    assert (end.request_id, end.code, end.seq) == ("big", DISPATCH_FAILED, 0)
    assert [a.request.request_id for a in bus.of(topics.WORK) if isinstance(a, WorkAssignment)] == [
        "ok"
    ]
    assert stage.core.registry.flight("big") is None
    assert stage.core.add_request(make_request("big")).end_code == DISPATCH_FAILED


@pytest.mark.parametrize(
    ("shard", "running_here", "forwarded"),
    [
        (Shard(), False, True),  # not sharded: the workers decide whether they run it
        (Shard.of({"big": ["big"]}, "big"), True, True),
        (Shard.of({"big": ["big"]}, "big"), False, False),  # another shard's request
        (Shard.of({"big": ["big"]}, ""), False, False),
    ],
)
async def test_a_sharded_scheduler_passes_on_a_conditional_cancel_only_for_its_requests(
    shard, running_here, forwarded
):
    bus = FakeBus()
    stage = stage_on(bus)
    stage.shard = shard
    if running_here:
        stage.core.add_request(make_request("a"))
        [dispatch] = stage.core.schedule()
        await stage._dispatch(dispatch)
    await stage._on_cancel(Cancel(request_id="a", held_by="chat.deliver.gw"))
    sent = [c for c in bus.of(topics.CONTROL) if isinstance(c, Cancel)]
    assert [(c.request_id, c.held_by) for c in sent] == ([("a", None)] if forwarded else [])


async def test_a_shard_passes_over_requests_and_heartbeats_of_other_shards_models():
    stage = stage_on(FakeBus())
    stage.shard = Shard.of({"big": ["big"]}, "")  # the unnamed shard: not "big"
    for request in (make_request("mine", model="small"), make_request("theirs", model="big")):
        await stage.handle(_record(topics.requests_topic(request.tier), request))
    await stage.handle(_record(topics.WORKERS, heartbeat("w9", model="big")))
    assert [r.request_id for r in stage.core.waiting()] == ["mine"]
    assert "w9" not in stage.core.workers


def _record(topic: str, event: Any) -> ConsumerRecord:
    return ConsumerRecord(topic, 0, 0, 0, 0, None, encode(event), None, 0, 0, headers(event))
