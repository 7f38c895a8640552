"""Edge-case table for the scheduler core: empty, full, tiers, models, cancel, lost, deadlines."""

from __future__ import annotations

import pytest

from scheduler.core import Scheduler
from schemas.events import ChatMessage, GenerationRequest, Role, WorkerHeartbeat
from schemas.topics import Tier


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_request(request_id: str, tier: Tier = Tier.FREE, model: str = "tiny",
                 deadline: float | None = None) -> GenerationRequest:
    return GenerationRequest(
        request_id=request_id, conversation_id=f"c-{request_id}", message_id=f"m-{request_id}",
        user_id="u", org_id="o", tier=tier, model=model,
        messages=(ChatMessage(role=Role.USER, content="hi"),), reply_to="chat.deliver.gw",
        deadline=deadline,
    )


def heartbeat(worker_id: str = "w1", slots: int = 2, active: tuple[str, ...] = (),
              consumed: dict[int, int] | None = None, model: str = "tiny",
              partitions: tuple[int, ...] = (0, 1), stopping: bool = False) -> WorkerHeartbeat:
    return WorkerHeartbeat(worker_id=worker_id, model=model, partitions=partitions,
                           max_slots=slots, active=active, consumed=consumed or {},
                           stopping=stopping)


def make_scheduler(clock: Clock | None = None) -> Scheduler:
    clock = clock or Clock()
    return Scheduler(worker_lost_after_s=5.0, clock=clock, wall=clock)


def test_empty_schedules_nothing():
    core = make_scheduler()
    core.on_heartbeat(heartbeat())
    assert core.schedule() == []


def test_no_workers_keeps_requests_waiting():
    core = make_scheduler()
    core.add_request(make_request("a"))
    assert core.schedule() == []
    assert core.waiting_count == 1


def test_dispatch_fills_free_slots_only():
    core = make_scheduler()
    core.on_heartbeat(heartbeat(slots=2))
    for rid in "abc":
        core.add_request(make_request(rid))
    dispatched = core.schedule()
    assert [d.request.request_id for d in dispatched] == ["a", "b"]
    assert {d.partition for d in dispatched} == {0, 1}
    assert core.schedule() == [], "worker is full"
    assert [r.request_id for r in core.waiting()] == ["c"]


def test_highest_tier_first():
    core = make_scheduler()
    core.add_request(make_request("free", Tier.FREE))
    core.add_request(make_request("pro", Tier.PRO))
    core.add_request(make_request("ent", Tier.ENTERPRISE))
    core.on_heartbeat(heartbeat(slots=1))
    assert [d.request.request_id for d in core.schedule()] == ["ent"]
    assert [r.request_id for r in core.waiting()] == ["pro", "free"]


def test_model_must_match():
    core = make_scheduler()
    core.on_heartbeat(heartbeat(model="big"))
    core.add_request(make_request("a", model="tiny"))
    assert core.schedule() == []
    core.on_heartbeat(heartbeat("w2", model="tiny"))
    assert [d.worker_id for d in core.schedule()] == ["w2"]


def test_slot_frees_when_worker_reports_request_ended():
    core = make_scheduler()
    core.on_heartbeat(heartbeat(slots=1))
    core.add_request(make_request("a"))
    core.add_request(make_request("b"))
    [first] = core.schedule()
    core.on_dispatched("a", "w1", offset=0)
    core.on_heartbeat(heartbeat(slots=1, active=("a",), consumed={first.partition: 1}))
    assert core.schedule() == [], "a is still running"
    core.on_heartbeat(heartbeat(slots=1, active=(), consumed={first.partition: 1}))
    assert [d.request.request_id for d in core.schedule()] == ["b"]


def test_assignment_not_yet_read_still_counts():
    core = make_scheduler()
    core.on_heartbeat(heartbeat(slots=1))
    core.add_request(make_request("a"))
    core.add_request(make_request("b"))
    core.schedule()
    core.on_dispatched("a", "w1", offset=5)
    core.on_heartbeat(heartbeat(slots=1, active=(), consumed={0: 5, 1: 5}))
    assert core.schedule() == [], "offset 5 is not read yet: a is in flight"


def test_cancel_waiting_request_is_never_dispatched():
    core = make_scheduler()
    core.add_request(make_request("a"))
    assert core.cancel("a") is not None
    assert core.cancel("a") is None
    core.on_heartbeat(heartbeat())
    assert core.schedule() == []


def test_duplicate_request_is_ignored():
    core = make_scheduler()
    assert core.add_request(make_request("a"))
    assert not core.add_request(make_request("a"))
    assert core.waiting_count == 1


def test_deadline_passed_is_expired():
    clock = Clock()
    core = make_scheduler(clock)
    core.add_request(make_request("late", deadline=clock.now + 1))
    core.add_request(make_request("fine", deadline=clock.now + 100))
    clock.now += 2
    assert [r.request_id for r in core.expire()] == ["late"]
    assert [r.request_id for r in core.waiting()] == ["fine"]


def test_lost_worker_is_forgotten():
    clock = Clock()
    core = make_scheduler(clock)
    core.on_heartbeat(heartbeat("w1"))
    clock.now += 3
    core.on_heartbeat(heartbeat("w2"))
    clock.now += 3
    assert core.remove_lost_workers() == ["w1"]
    assert set(core.workers) == {"w2"}


@pytest.mark.parametrize("stopping,partitions", [(True, (0,)), (False, ())])
def test_stopping_or_partitionless_worker_gets_nothing(stopping, partitions):
    core = make_scheduler()
    core.on_heartbeat(heartbeat(stopping=stopping, partitions=partitions))
    core.add_request(make_request("a"))
    assert core.schedule() == []
