"""Fair running slots (`scheduler/shares.py`): a free slot goes to the waiting tenant
holding the fewest of the model's slots, and a tenant kept waiting while another holds
more than its share gets one back by preemption; a tenant alone keeps every slot."""

from __future__ import annotations

from scheduler.core import PREEMPT_WAIT_S, Scheduler
from scheduler.shares import RunningShares
from schemas.events import SamplingOptions
from schemas.topics import Tier
from tests.support.scheduler import Clock, heartbeat, ids, make_request, make_scheduler, sent

SLOTS = 4


def running_on(core: Scheduler, dispatches, worker: str = "w1", start: int = 0) -> list[str]:
    """Acknowledge `dispatches` and report them running; the ids running now."""
    for offset, d in enumerate(dispatches, start=start):
        sent(core, d, offset)
    active = tuple(r.request_id for r in core.running())
    core.on_heartbeat(heartbeat(worker, slots=SLOTS, active=active, consumed={0: 10**6, 1: 10**6}))
    return list(active)


def handed_back(core: Scheduler, request_id: str, attempt: int, worker: str = "w1") -> None:
    """The worker gave `request_id` back (preempted): listed with its attempt, not running."""
    flight = core.registry.flight(request_id)
    assert flight is not None and flight.offset is not None
    active = tuple(r.request_id for r in core.running() if r.request_id != request_id)
    beat = heartbeat(
        worker,
        slots=SLOTS,
        active=active,
        consumed={0: 10**6, 1: 10**6},
        assignments={request_id: (flight.partition, flight.offset)},
        handed_back=(request_id,),
    )
    core.on_heartbeat(beat.model_copy(update={"handed_back_attempts": {request_id: attempt}}))


def flooded(**policy: object) -> tuple[Scheduler, list[str]]:
    """Org `a` holds every slot of the one worker (a flood that came while they were free)."""
    core = make_scheduler(**policy)
    core.on_heartbeat(heartbeat("w1", slots=SLOTS))
    for i in range(6):
        core.add_request(make_request(f"a{i}", tier=Tier.PRO, org="a", user="ua"))
    return core, running_on(core, core.schedule())


def test_a_tenant_alone_keeps_every_slot() -> None:
    core, running = flooded()
    assert running == ["a0", "a1", "a2", "a3"]
    assert core.schedule() == [] and core.preemptions() == []  # a4, a5 wait their own turn


def test_another_org_waiting_takes_a_slot_back_from_the_newest_of_the_flood() -> None:
    core, _ = flooded()
    core.add_request(make_request("b0", tier=Tier.PRO, org="b", user="ub"))
    assert core.schedule() == []
    [preemption] = core.preemptions()
    assert (preemption.request.request_id, preemption.worker_id) == ("a3", "w1")
    assert preemption.for_request_id == "b0"
    assert core.schedule() == [] and core.preemptions() == []  # asked once, not again

    handed_back(core, "a3", attempt=0)
    [dispatch] = core.schedule()
    assert dispatch.request.request_id == "b0"  # not a3's next attempt, first in org a's line
    waiting = {r.request_id: r.attempt for r in core.waiting()}
    assert waiting == {"a3": 1, "a4": 0, "a5": 0}


def test_preemption_goes_on_until_the_orgs_hold_equal_slots() -> None:
    core, _ = flooded()
    for i in range(3):
        core.add_request(make_request(f"b{i}", tier=Tier.PRO, org="b", user="ub"))
    offset = 10
    for _ in range(5):
        core.schedule()
        for preemption in core.preemptions():
            handed_back(core, preemption.request.request_id, preemption.request.attempt)
        dispatches = core.schedule()
        running_on(core, dispatches, start=offset)
        offset += len(dispatches)
    shares = core.registry.shares
    assert (shares.slots("big", "a"), shares.slots("big", "b")) == (2, 2)
    assert core.schedule() == [] and core.preemptions() == []


def test_within_an_org_a_user_kept_waiting_gets_a_slot_of_the_user_holding_them() -> None:
    core, _ = flooded()
    core.add_request(make_request("y0", tier=Tier.PRO, org="a", user="other"))
    core.schedule()
    [preemption] = core.preemptions()
    assert preemption.request.request_id == "a3"


def test_a_lower_tier_does_not_preempt_a_higher_one() -> None:
    core, _ = flooded()
    core.add_request(make_request("f0", tier=Tier.FREE, org="b", user="ub"))
    core.schedule()
    assert core.preemptions() == []


def test_an_answer_held_to_a_schema_is_never_preempted() -> None:
    core = make_scheduler()
    core.on_heartbeat(heartbeat("w1", slots=2))
    structured = SamplingOptions(json_object=True)
    for i in range(2):
        request = make_request(f"a{i}", tier=Tier.PRO, org="a", user="ua")
        core.add_request(request.model_copy(update={"sampling": structured}))
    for offset, d in enumerate(core.schedule()):
        sent(core, d, offset)
    core.add_request(make_request("b0", tier=Tier.PRO, org="b", user="ub"))
    core.schedule()
    assert core.preemptions() == []


def test_an_unanswered_preemption_is_asked_again_later() -> None:
    clock = Clock()
    core = make_scheduler(clock)
    core.on_heartbeat(heartbeat("w1", slots=SLOTS))
    for i in range(SLOTS):
        core.add_request(make_request(f"a{i}", tier=Tier.PRO, org="a", user="ua"))
    running_on(core, core.schedule())
    core.add_request(make_request("b0", tier=Tier.PRO, org="b", user="ub"))
    core.schedule()
    assert ids(p for p in core.preemptions()) == ["a3"]
    clock.now += PREEMPT_WAIT_S + 1
    core.schedule()
    assert ids(p for p in core.preemptions()) == ["a3"]


def test_no_preemption_when_it_is_off() -> None:
    core, _ = flooded(fair_preemption=False)
    core.add_request(make_request("b0", tier=Tier.PRO, org="b", user="ub"))
    core.schedule()
    assert core.preemptions() == []


def test_a_hand_back_of_an_earlier_attempt_leaves_the_later_one_running() -> None:
    core, _ = flooded()
    core.add_request(make_request("b0", tier=Tier.PRO, org="b", user="ub"))
    core.schedule()
    core.preemptions()
    handed_back(core, "a3", attempt=0)
    running_on(core, core.schedule(), start=20)  # b0 takes the slot
    core.on_heartbeat(heartbeat("w1", slots=SLOTS + 1, consumed={0: 10**6, 1: 10**6},
                                active=tuple(r.request_id for r in core.running())))  # fmt: skip
    [again] = core.schedule()  # a slot more: a3's next attempt runs
    assert (again.request.request_id, again.request.attempt) == ("a3", 1)
    sent(core, again, 30)
    # A heartbeat still listing attempt 0 as handed back does not requeue attempt 1.
    beat = heartbeat("w1", slots=SLOTS + 1, consumed={0: 10**6, 1: 10**6},
                     active=tuple(r.request_id for r in core.running()), handed_back=("a3",),
                     assignments={"a3": (0, 3)})  # fmt: skip
    core.on_heartbeat(beat.model_copy(update={"handed_back_attempts": {"a3": 0}}))
    assert "a3" not in {r.request_id for r in core.waiting()}
    assert core.registry.flight("a3") is not None


def test_the_shares_count_what_runs_and_forget_what_ended() -> None:
    shares = RunningShares()
    requests = [
        make_request(f"r{i}", org="a" if i < 3 else "b", user=f"u{i % 2}") for i in range(4)
    ]
    for request in requests:
        shares.add(request)
    assert (shares.slots("big", "a"), shares.slots("big", "b"), shares.slots("big", "a", "u0")) == (
        3,
        1,
        2,
    )
    shares.add(requests[0])  # a copy counts once
    assert shares.slots("big", "a") == 3
    for request in requests:
        shares.remove(request.request_id)
    shares.remove("r0")  # twice: nothing
    assert len(shares) == 0 and shares.slots("big", "a") == 0
