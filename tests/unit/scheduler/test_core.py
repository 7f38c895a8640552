"""Edge-case tables for the scheduler core: every scheduling rule with hand-made
requests and heartbeats (empty, full, over budget, client gone, deadline passed,
worker lost)."""

from __future__ import annotations

import pytest

from scheduler.fair_queue import FairQueue
from scheduler.journal import CANCELLED
from schemas.events import (
    ChatMessage,
    GenerationRequest,
    Role,
)
from schemas.tools import ServerToolTurn, round_request_id
from schemas.topics import Tier
from tests.support.scheduler import (
    Clock,
    finish,
    heartbeat,
    ids,
    make_request,
    make_scheduler,
    sent,
)

# --- dispatch and capacity -------------------------------------------------------------


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
        core.add_request(make_request(rid, user=rid))
    dispatched = core.schedule()
    assert ids(dispatched) == ["a", "b"]
    assert {d.partition for d in dispatched} == {0, 1}
    assert core.schedule() == [], "worker is full"
    assert [r.request_id for r in core.waiting()] == ["c"]


@pytest.mark.parametrize(
    "hb,why",
    [
        (dict(stopping=True), "stopping"),
        (dict(partitions=()), "owns no chat.work partition"),
        (dict(waiting=1), "its engine already queues work"),
        (dict(free_kv_blocks=0), "its KV cache is full"),
    ],
)
def test_worker_without_capacity_gets_nothing(hb, why):
    core = make_scheduler()
    core.on_heartbeat(heartbeat(**hb))
    core.add_request(make_request("a"))
    assert core.schedule() == [], why


def test_slot_frees_when_worker_reports_request_ended():
    core = make_scheduler()
    core.on_heartbeat(heartbeat(slots=1))
    core.add_request(make_request("a"))
    core.add_request(make_request("b"))
    [first] = core.schedule()
    sent(core, first, offset=0)
    core.on_heartbeat(heartbeat(slots=1, active=("a",), consumed={first.partition: 1}))
    assert core.schedule() == [], "a is still running"
    core.on_heartbeat(heartbeat(slots=1, active=(), consumed={first.partition: 1}))
    assert ids(core.schedule()) == ["b"]


def test_assignment_not_yet_read_still_counts():
    core = make_scheduler()
    core.on_heartbeat(heartbeat(slots=1))
    core.add_request(make_request("a"))
    core.add_request(make_request("b"))
    [first] = core.schedule()
    sent(core, first, offset=5)
    core.on_heartbeat(heartbeat(slots=1, active=(), consumed={0: 5, 1: 5}))
    assert core.schedule() == [], "offset 5 is not read yet: a is in flight"


def test_model_must_match():
    core = make_scheduler()
    core.on_heartbeat(heartbeat(model="other"))
    core.add_request(make_request("a", model="big"))
    assert core.schedule() == []
    core.on_heartbeat(heartbeat("w2", model="big"))
    assert [d.worker_id for d in core.schedule()] == ["w2"]


# --- tiers -------------------------------------------------------------------------------


def test_highest_tier_first():
    core = make_scheduler()
    core.add_request(make_request("free", Tier.FREE))
    core.add_request(make_request("pro", Tier.PRO))
    core.add_request(make_request("ent", Tier.ENTERPRISE))
    core.on_heartbeat(heartbeat(slots=1))
    assert ids(core.schedule()) == ["ent"]
    assert [r.request_id for r in core.waiting()] == ["pro", "free"]


def test_lower_tier_keeps_its_minimum_share_while_higher_is_busy():
    core = make_scheduler(min_share={Tier.FREE: 0.25})
    for i in range(50):
        core.add_request(make_request(f"e{i}", Tier.ENTERPRISE, user=f"e{i}"))
        core.add_request(make_request(f"f{i}", Tier.FREE, user=f"f{i}"))
    order = []
    for _ in range(40):
        core.on_heartbeat(heartbeat(slots=1))
        dispatched = core.schedule()
        order += ids(dispatched)
        finish(core, "w1", dispatched)
    free = [rid for rid in order if rid.startswith("f")]
    assert 9 <= len(free) <= 10, order  # a quarter of 40 slots, after the first credit
    assert order[:3] == ["e0", "e1", "e2"], "strict priority until the credit is earned"


def test_without_min_share_lower_tier_waits():
    core = make_scheduler()
    for i in range(5):
        core.add_request(make_request(f"e{i}", Tier.ENTERPRISE, user=f"e{i}"))
    core.add_request(make_request("f", Tier.FREE))
    core.on_heartbeat(heartbeat(slots=5))
    assert "f" not in ids(core.schedule())


# --- fairness inside a tier ---------------------------------------------------------------


def test_flooding_user_delays_another_user_by_at_most_one_slot():
    core = make_scheduler()
    for i in range(100):
        core.add_request(make_request(f"flood{i}", user="flooder"))
    core.add_request(make_request("single", user="polite"))
    core.on_heartbeat(heartbeat(slots=2))
    assert ids(core.schedule()) == ["flood0", "single"]


def test_fair_share_across_orgs_before_users():
    queue = FairQueue()
    for i in range(3):
        queue.push(make_request(f"a{i}", user=f"a-user{i}", org="big-org"))
    queue.push(make_request("b0", user="b-user", org="small-org"))
    assert [r.request_id for r in queue] == ["a0", "b0", "a1", "a2"]
    assert [queue.pop().request_id for _ in range(4)] == ["a0", "b0", "a1", "a2"]
    assert len(queue) == 0


def test_fair_queue_iteration_matches_pops_and_remove():
    queue = FairQueue()
    for rid, user in [("x1", "x"), ("x2", "x"), ("y1", "y"), ("z1", "z"), ("y2", "y")]:
        queue.push(make_request(rid, user=user))
    assert queue.remove("y1").request_id == "y1"
    assert queue.remove("nope") is None
    projected = [r.request_id for r in queue]
    assert projected == [queue.pop().request_id for _ in range(len(queue))]


# --- queue position, ETA, shedding ------------------------------------------------------


def test_queue_updates_on_change_and_every_interval():
    clock = Clock()
    core = make_scheduler(clock, queue_update_interval_s=1.0)
    core.add_request(make_request("a", user="a"))
    core.add_request(make_request("b", user="b"))
    assert [(u.request.request_id, u.position) for u in core.queue_updates()] == [
        ("a", 1),
        ("b", 2),
    ]
    assert core.queue_updates() == [], "nothing changed, interval not over"
    clock.now += 1.1
    assert len(core.queue_updates()) == 2, "at least once a second"
    core.cancel("a")
    assert [(u.request.request_id, u.position) for u in core.queue_updates()] == [("b", 1)]


def test_eta_comes_from_recent_throughput():
    clock = Clock()
    core = make_scheduler(clock)
    core.on_heartbeat(heartbeat(slots=1))
    core.add_request(make_request("a"))
    first = core.schedule()
    assert core.queue_updates() == []
    core.add_request(make_request("b"))
    [update] = core.queue_updates()
    assert update.eta_ms is None, "no throughput known yet"
    clock.now += 2.0
    finish(core, "w1", first, slots=0)
    core.add_request(make_request("c", user="c"))
    updates = {u.request.request_id: u for u in core.queue_updates()}
    assert updates["c"].position == 2
    assert updates["c"].eta_ms is not None and updates["c"].eta_ms > updates["b"].eta_ms


def test_shedding_when_expected_wait_exceeds_tier_bound():
    clock = Clock()
    core = make_scheduler(clock, max_wait_s={Tier.FREE: 3.0, Tier.ENTERPRISE: 100.0})
    core.on_heartbeat(heartbeat(slots=1))
    core.add_request(make_request("first"))
    dispatched = core.schedule()
    clock.now += 1.0
    finish(core, "w1", dispatched, slots=0)  # throughput: about one request a second
    admitted = [core.add_request(make_request(f"r{i}", user=f"u{i}")) for i in range(6)]
    assert all(a.accepted for a in admitted[:2])
    refused = admitted[-1]
    assert not refused.accepted and refused.retry_after_s >= 1
    assert core.status()[Tier.FREE].shedding
    assert core.add_request(make_request("vip", Tier.ENTERPRISE)).accepted, (
        "a higher tier has its own bound"
    )


def test_after_a_quiet_spell_the_wait_is_how_fast_the_running_slots_free():
    clock = Clock()
    core = make_scheduler(clock, max_wait_s={Tier.FREE: 20.0})
    core.on_heartbeat(heartbeat(slots=4))
    core.add_request(make_request("long ago"))
    first = core.schedule()
    clock.now += 30.0
    finish(core, "w1", first, slots=4)  # one end in the window: one request per 30 s seen
    burst = [core.add_request(make_request(f"run{i}", user=f"r{i}")) for i in range(4)]
    assert all(a.accepted for a in burst), "a burst the free slots take waits for nothing"
    running = []
    for offset in range(1001, 1009):
        for dispatch in core.schedule():
            sent(core, dispatch, offset)
            running.append(dispatch)
    assert len(running) == 4  # every slot runs; the next ones wait
    admitted = [core.add_request(make_request(f"w{i}", user=f"w{i}")) for i in range(3)]
    # four slots of 30 s free one every 7.5 s: waits of 7.5 and 15 s fit, 22.5 s does not
    assert [a.accepted for a in admitted] == [True, True, False]
    assert core.status()[Tier.FREE].expected_wait_s == 22.5


def test_no_shedding_without_throughput_or_with_free_slots():
    core = make_scheduler(max_wait_s={Tier.FREE: 0.0})
    assert core.add_request(make_request("a")).accepted, "nothing is known yet"
    core2 = make_scheduler(max_wait_s={Tier.FREE: 0.0})
    core2.on_heartbeat(heartbeat(slots=4))
    assert core2.add_request(make_request("a")).accepted


# --- client gone, deadlines, duplicates ----------------------------------------------------


def test_cancel_waiting_request_is_never_dispatched():
    core = make_scheduler()
    core.add_request(make_request("a"))
    assert core.cancel("a") is not None
    assert core.cancel("a") is None
    core.on_heartbeat(heartbeat())
    assert core.schedule() == []


def tool_round(answer_id: str, round_: int) -> GenerationRequest:
    """Round `round_` of a server-tools turn whose answer is `answer_id`."""
    return make_request(answer_id).model_copy(
        update={
            "request_id": round_request_id(answer_id, round_),
            "attempt": round_,
            "server_tools": ServerToolTurn(answer_id=answer_id, round=round_, max_rounds=4),
        }
    )


def test_a_cancelled_answers_later_tool_round_ends_when_it_comes():
    """The cancel came while the first round ran; it paused on tool calls, and
    `chat.tools` queued the next round: it never reaches a worker."""
    core = make_scheduler()
    core.on_heartbeat(heartbeat(slots=4))
    core.add_request(tool_round("a", 0))
    [first] = core.schedule()
    sent(core, first, 0, 10)
    assert core.cancel_answer("a") is None  # running: the workers abort it
    assert core.add_request(tool_round("a", 1)).end_code == CANCELLED
    assert core.add_request(tool_round("b", 1)).end_code is None, "another answer's round"
    assert ids(core.schedule()) == ["b.tool1"]


def test_a_cancel_of_the_answer_drops_its_tool_round_waiting():
    core = make_scheduler()
    core.add_request(tool_round("a", 2))
    dropped = core.cancel_answer("a")
    assert dropped is not None and dropped.request_id == "a.tool2"
    assert core.cancel_answer("a") is None
    core.on_heartbeat(heartbeat())
    assert core.schedule() == []


def test_duplicate_request_is_ignored():
    core = make_scheduler()
    assert core.add_request(make_request("a")).accepted
    assert core.add_request(make_request("a")).accepted
    assert core.waiting_count == 1


def test_deadline_passed_is_expired():
    clock = Clock()
    core = make_scheduler(clock)
    core.add_request(make_request("late", deadline=clock.now + 1))
    core.add_request(make_request("fine", deadline=clock.now + 100))
    late_continuation = make_request("continued", deadline=clock.now + 1)
    core.add_request(late_continuation.model_copy(update={"attempt": 1}))
    clock.now += 2
    assert [r.request_id for r in core.expire()] == ["late"]
    assert [r.request_id for r in core.waiting()] == ["fine", "continued"], (
        "an answer that has started is never cut off by the wait deadline"
    )


# --- lost workers ----------------------------------------------------------------------


def test_lost_worker_requests_are_dispatched_again_continuing_their_stream():
    clock = Clock()
    core = make_scheduler(clock, worker_lost_after_s=5.0)
    core.on_heartbeat(heartbeat("w1", slots=2))
    core.add_request(make_request("running"))
    core.add_request(make_request("unread", user="v"))
    first = {d.request.request_id: d for d in core.schedule()}
    sent(core, first["running"], 0, marker=40)
    sent(core, first["unread"], 1, marker=41)
    core.on_heartbeat(
        heartbeat(
            "w1",
            slots=2,
            active=("running",),
            consumed={0: 1},
            assignments={"running": (first["running"].partition, 0)},
        )
    )
    clock.now += 3
    core.on_heartbeat(heartbeat("w2", slots=2))
    clock.now += 3
    assert core.remove_lost_workers() == ["w1"]
    again = {d.request.request_id: d for d in core.schedule()}
    assert set(again) == {"running", "unread"}
    assert all(d.worker_id == "w2" and d.request.attempt == 1 for d in again.values())
    assert again["running"].request.stream.start_offset == 40, "the stream still starts there"
    assert again["unread"].request.stream.start_offset == 41


def test_assignment_orphaned_by_a_partition_move_is_dispatched_again():
    core = make_scheduler()
    core.on_heartbeat(heartbeat("w1", slots=1, partitions=(0,)))
    core.add_request(make_request("a"))
    [d] = core.schedule()
    sent(core, d, 7)
    core.on_heartbeat(heartbeat("w1", slots=1, partitions=(1,), consumed={0: 7}))
    [again] = core.schedule()
    assert again.request.request_id == "a" and again.request.attempt == 1


def test_a_request_that_ran_and_ended_after_its_partition_moved_is_finished_not_redone():
    core = make_scheduler()
    core.on_heartbeat(heartbeat("w1", slots=1, partitions=(0,)))
    core.add_request(make_request("a"))
    [d] = core.schedule()
    sent(core, d, 7)
    core.on_heartbeat(heartbeat("w1", slots=1, partitions=(0,), active=("a",), consumed={0: 8}))
    # A rebalance moved partition 0 away while "a" kept streaming; then it ended.
    core.on_heartbeat(heartbeat("w1", slots=1, partitions=(1,), active=("a",)))
    core.on_heartbeat(heartbeat("w1", slots=1, partitions=(1,)))
    assert core.schedule() == [] and core.waiting_count == 0
    assert core.workers["w1"].in_flight == {}


def test_a_worker_process_restarted_under_its_id_loses_what_the_old_one_ran():
    core = make_scheduler()
    core.on_heartbeat(heartbeat("w1", slots=2, incarnation="first"))
    core.add_request(make_request("a"))
    [d] = core.schedule()
    assert d.incarnation == "first", "the assignment names the process it is for"
    sent(core, d, 3, marker=50)
    core.on_heartbeat(
        heartbeat("w1", slots=2, incarnation="first", active=("a",), consumed={0: 4, 1: 4})
    )
    core.on_heartbeat(heartbeat("w1", slots=2, incarnation="second"))
    [again] = core.schedule()
    assert (again.request.request_id, again.request.attempt) == ("a", 1)
    assert again.incarnation == "second" and again.request.stream.start_offset == 50


# --- affinity and routing ----------------------------------------------------------------


def test_next_turn_goes_to_the_same_worker_while_it_has_room():
    core = make_scheduler(affinity_max_load=0.5)
    core.on_heartbeat(heartbeat("w1", slots=4))
    core.on_heartbeat(heartbeat("w2", slots=4))
    core.add_request(make_request("t1", conversation="conv"))
    [first] = core.schedule()
    core.add_request(make_request("t2", conversation="conv"))
    [second] = core.schedule()
    assert second.worker_id == first.worker_id
    core.add_request(make_request("x", user="x"))
    core.schedule()
    core.add_request(make_request("t3", conversation="conv"))
    [third] = core.schedule()
    assert third.worker_id != first.worker_id, "over the load bound: go elsewhere"


def test_saturated_model_falls_back_to_smaller_model():
    core = make_scheduler(fallback_models={"big": "small"})
    core.on_heartbeat(heartbeat("big1", slots=1, model="big"))
    core.on_heartbeat(heartbeat("small1", slots=4, model="small"))
    core.add_request(make_request("a"))
    core.add_request(make_request("b", user="b"))
    first, second = core.schedule()
    assert (first.worker_id, first.routed_reason) == ("big1", None)
    assert second.worker_id == "small1" and second.routed_reason == "saturated"
    assert (second.request.model, second.request.requested_model) == ("small", "big")


def test_fallback_respects_tier_models():
    core = make_scheduler(fallback_models={"big": "small"}, tier_models={Tier.FREE: ["big"]})
    core.on_heartbeat(heartbeat("small1", slots=4, model="small"))
    core.add_request(make_request("a"))
    assert core.schedule() == []


def test_simple_requests_route_to_small_model():
    core = make_scheduler(small_model="small", simple_request_max_chars=20)
    short = core.add_request(make_request("short", text="hi"))
    long = core.add_request(make_request("long", text="x" * 50))
    assert short.routed_reason == "simple_request" and short.request.model == "small"
    assert long.routed_reason is None and long.request.model == "big"


def test_a_simple_request_is_judged_by_its_last_user_message():
    core = make_scheduler(small_model="small", simple_request_max_chars=20)
    request = make_request("a").model_copy(
        update={
            "messages": (
                ChatMessage(role=Role.SYSTEM, content="s" * 50),
                ChatMessage(role=Role.USER, content="an earlier question, long"),
                ChatMessage(role=Role.ASSISTANT, content="a" * 50),
                ChatMessage(role=Role.USER, content="and now?"),
            )
        }
    )
    assert request.last_user_message == "and now?"
    assert core.add_request(request).routed_reason == "simple_request"
    no_user = request.model_copy(update={"messages": request.messages[:1]})
    assert no_user.last_user_message == ""


def test_the_live_workers_it_counts_per_model_take_work_now() -> None:
    clock = Clock()
    core = make_scheduler(clock, worker_lost_after_s=5.0)
    core.on_heartbeat(heartbeat("w1"))
    core.on_heartbeat(heartbeat("w2"))
    core.on_heartbeat(heartbeat("s1", model="small"))
    core.on_heartbeat(heartbeat("joining", partitions=()))  # no chat.work partition yet
    core.on_heartbeat(heartbeat("draining", model="small", stopping=True))
    assert core.live_workers() == {"big": 2, "small": 1}
    clock.now += 3.0
    core.on_heartbeat(heartbeat("w1"))
    clock.now += 3.0
    core.remove_lost_workers()
    assert core.live_workers() == {"big": 1}
