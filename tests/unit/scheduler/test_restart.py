"""Tables for what makes a scheduler restart safe, on the pure core: redispatch keeps
the stream's start, draining workers hand back, the journal restores what was handed
out and what ended, heartbeats teach what the journal no longer holds, a request
decided once is never queued again, the journal's commit rule, and fencing."""

from __future__ import annotations

import pytest

from scheduler.claims import fences
from scheduler.core import Scheduler
from scheduler.journal import (
    CANCELLED,
    DEADLINE_EXCEEDED,
    DISPATCH_FAILED,
    OVERLOADED,
    JournalWindow,
    unserved_end,
)
from schemas.answer import UNKNOWN_END_SEQ, AnswerLog
from schemas.events import (
    GenerationDone,
    GenerationError,
    SchedulerClaim,
    StreamPosition,
    TokenChunk,
    Unserved,
    WorkAssignment,
    stream_fields,
)
from tests.support.scheduler import Clock, heartbeat, ids, make_request, make_scheduler, sent


def dispatch_one(
    core: Scheduler, request_id: str = "a", offset: int = 0, marker: int = 10, worker: str = "w1"
):
    core.on_heartbeat(heartbeat(worker, slots=4))
    core.add_request(make_request(request_id))
    [d] = core.schedule()
    return d, sent(core, d, offset, marker)


def assignment(
    request_id: str, attempt: int = 0, worker: str = "w1", epoch: int = 1, start: int = 10
) -> WorkAssignment:
    stream = StreamPosition(partition=0, start_offset=start, attempt_offset=start + attempt)
    request = make_request(request_id).model_copy(update={"attempt": attempt, "stream": stream})
    return WorkAssignment(worker_id=worker, request=request, epoch=epoch)


# --- redispatch keeps the stream --------------------------------------------------------


@pytest.mark.parametrize("how", ["lost", "handed_back", "orphaned"])
def test_redispatch_is_the_next_attempt_and_keeps_the_stream_start(how):
    clock = Clock()
    core = make_scheduler(clock, worker_lost_after_s=5.0)
    d, request = dispatch_one(core, marker=40)
    core.on_heartbeat(heartbeat("w2", slots=4))
    if how == "lost":
        clock.now += 6
        core.on_heartbeat(heartbeat("w2", slots=4))
        core.remove_lost_workers()
    elif how == "handed_back":
        core.on_heartbeat(
            heartbeat("w1", slots=4, stopping=True, consumed={d.partition: 1}, handed_back=("a",))
        )
    else:
        core.on_heartbeat(heartbeat("w1", slots=4, partitions=(9,), consumed={}))
    [again] = core.schedule()
    assert again.worker_id == "w2" or how == "orphaned"
    assert again.request.attempt == 1
    assert again.request.stream == request.stream
    twice = sent(core, again, 1, marker=77)
    assert (twice.stream.start_offset, twice.stream.attempt_offset) == (40, 77)


def test_handed_back_heartbeat_read_twice_dispatches_once():
    core = make_scheduler()
    d, _ = dispatch_one(core)
    drained = heartbeat("w1", slots=4, stopping=True, consumed={d.partition: 1}, handed_back=("a",))
    core.on_heartbeat(drained)
    core.on_heartbeat(drained)
    assert core.waiting_count == 1
    core.on_heartbeat(heartbeat("w2", slots=4))
    [again] = core.schedule()
    core.on_heartbeat(drained)
    assert core.schedule() == [] and core.waiting_count == 0
    assert again.request.attempt == 1


# --- restore from the journal -----------------------------------------------------------


def test_restored_assignment_is_in_flight_and_its_request_is_not_queued_again():
    core = make_scheduler()
    core.restore(0, 5, assignment("a"))
    core.on_heartbeat(heartbeat("w1", slots=1, active=("a",), consumed={0: 6}))
    admission = core.add_request(make_request("a"))
    assert admission.accepted and not admission.queued and admission.end_code is None
    assert core.schedule() == [], "w1's one slot holds a"


def test_restored_assignment_finishes_when_its_worker_has_read_it_and_moved_on():
    core = make_scheduler()
    core.restore(0, 5, assignment("a"))
    core.on_heartbeat(heartbeat("w1", slots=1, consumed={0: 6}))
    core.add_request(make_request("b"))
    assert ids(core.schedule()) == ["b"]
    assert core.add_request(make_request("a")).queued is False


def test_restored_assignment_of_a_worker_that_never_reports_is_dispatched_again():
    clock = Clock()
    core = make_scheduler(clock, worker_lost_after_s=5.0)
    core.restore(0, 5, assignment("a", attempt=1, start=33))
    core.on_heartbeat(heartbeat("w2", slots=1))
    assert core.schedule() == [], "w1 may still report"
    clock.now += 6
    core.on_heartbeat(heartbeat("w2", slots=1))
    assert core.remove_lost_workers() == ["w1"]
    [again] = core.schedule()
    assert (again.request.attempt, again.request.stream.start_offset) == (2, 33)


@pytest.mark.parametrize(
    "records,in_flight_attempt,end",
    [
        ([(0, assignment("a", 0)), (1, assignment("a", 1, worker="w2"))], 1, None),
        ([(1, assignment("a", 1, worker="w2")), (0, assignment("a", 0))], 1, None),
        (
            [
                (0, assignment("a", 0)),
                (1, Unserved(request_id="a", attempt=1, code=DISPATCH_FAILED)),
            ],
            None,
            DISPATCH_FAILED,
        ),
        (
            [
                (1, Unserved(request_id="a", attempt=0, code=DISPATCH_FAILED)),
                (0, assignment("a", 0)),
            ],
            None,
            DISPATCH_FAILED,
        ),
        (
            [(0, SchedulerClaim(scheduler_id="s2", epoch=5)), (0, assignment("a", 0, epoch=4))],
            None,
            None,
        ),
        (
            [(0, SchedulerClaim(scheduler_id="s2", epoch=5)), (0, assignment("a", 0, epoch=5))],
            0,
            None,
        ),
    ],
    ids=[
        "later-attempt",
        "later-attempt-first",
        "ended-after",
        "end-of-same-attempt",
        "fenced-assignment",
        "current-epoch",
    ],
)
def test_journal_replay_keeps_the_latest_decision(records, in_flight_attempt, end):
    core = make_scheduler()
    for offset, (partition, event) in enumerate(records):
        core.restore(partition, offset, event)
    flights = [f for w in core.workers.values() for f in w.in_flight.values()]
    assert [f.request.attempt for f in flights] == (
        [] if in_flight_attempt is None else [in_flight_attempt]
    )
    admission = core.add_request(make_request("a"))
    assert admission.end_code == end
    assert admission.queued == (in_flight_attempt is None and end is None)


def test_request_ended_before_a_restart_ends_again_with_its_code_and_attempt():
    core = make_scheduler()
    core.restore(2, 0, Unserved(request_id="a", attempt=1, code=DEADLINE_EXCEEDED))
    admission = core.add_request(make_request("a"))
    assert (admission.end_code, admission.recorded) == (DEADLINE_EXCEEDED, True)
    assert admission.request.attempt == 1
    core.on_heartbeat(heartbeat())
    assert core.schedule() == []


# --- decided once -----------------------------------------------------------------------


@pytest.mark.parametrize("decide", ["dispatched", "cancelled", "expired", "refused"])
def test_a_copy_of_a_decided_request_is_never_queued(decide):
    clock = Clock()
    core = make_scheduler(clock, max_wait_s={"free": 0.0} if decide == "refused" else {})
    if decide == "refused":
        core.throughput.finished(1.0)
        core.add_request(make_request("x", user="x"))
        admission = core.add_request(make_request("a"))
        assert admission.end_code == OVERLOADED
        core.ended_unserved(admission.request, OVERLOADED)
    elif decide == "dispatched":
        dispatch_one(core)
    else:
        core.add_request(make_request("a", deadline=clock.now + 1))
        clock.now += 2
        request = core.cancel("a") if decide == "cancelled" else core.expire()[0]
        core.ended_unserved(request, CANCELLED if decide == "cancelled" else DEADLINE_EXCEEDED)
    again = core.add_request(make_request("a"))
    assert not again.queued
    assert (again.end_code is None) == (decide == "dispatched")
    assert "a" not in [r.request_id for r in core.waiting()]


def test_cancel_read_before_its_request_ends_it_when_it_comes():
    core = make_scheduler()
    assert core.cancel("a") is None
    admission = core.add_request(make_request("a"))
    assert (admission.end_code, admission.recorded) == (CANCELLED, False)
    core.on_heartbeat(heartbeat())
    assert core.schedule() == []


def test_cancel_of_a_request_in_flight_is_not_kept():
    core = make_scheduler()
    dispatch_one(core)
    assert core.cancel("a") is None
    core.add_request(make_request("b"))
    assert core.add_request(make_request("b")).end_code is None


# --- in flight learned from heartbeats --------------------------------------------------


def test_heartbeat_teaches_a_request_the_journal_no_longer_holds():
    clock = Clock()
    core = make_scheduler(clock, worker_lost_after_s=5.0)
    core.on_heartbeat(
        heartbeat(
            "w1",
            slots=1,
            active=("old",),
            consumed={3: 8},
            partitions=(3,),
            assignments={"old": (3, 7)},
        )
    )
    assert core.add_request(make_request("old")).queued is False
    core.add_request(make_request("b"))
    assert core.schedule() == [], "w1's slot is taken by the learned request"
    clock.now += 6
    core.on_heartbeat(heartbeat("w2", slots=2))
    core.remove_lost_workers()
    [flight] = core.unknown
    assert (flight.request_id, flight.partition, flight.offset) == ("old", 3, 7)
    core.resolve_unknown("old", assignment("old", attempt=0, worker="w1", start=21).request)
    core.resolve_unknown("old", assignment("old", attempt=0, worker="w1", start=21).request)
    dispatched = {d.request.request_id: d.request for d in core.schedule()}
    assert set(dispatched) == {"old", "b"}
    assert (dispatched["old"].attempt, dispatched["old"].stream.start_offset) == (1, 21)
    assert core.unknown == []


def test_heartbeat_listing_a_request_known_elsewhere_teaches_nothing():
    core = make_scheduler()
    dispatch_one(core, worker="w2")
    core.on_heartbeat(
        heartbeat("w1", slots=2, active=("a",), consumed={0: 9}, assignments={"a": (0, 3)})
    )
    assert core.workers["w1"].in_flight == {}
    assert list(core.workers["w2"].in_flight) == ["a"]


def test_unknown_request_handed_back_is_read_back_and_dispatched_again_once():
    core = make_scheduler()
    drained = heartbeat("w1", stopping=True, handed_back=("h",), assignments={"h": (1, 4)})
    core.on_heartbeat(drained)
    core.on_heartbeat(drained)
    assert [f.request_id for f in core.unknown] == ["h"]
    core.resolve_unknown("h", assignment("h").request)
    core.on_heartbeat(heartbeat("w2"))
    [again] = core.schedule()
    assert (again.worker_id, again.request.attempt) == ("w2", 1)


def test_assignment_not_found_is_given_up():
    core = make_scheduler(worker_lost_after_s=0.0)
    core.on_heartbeat(heartbeat("w1", active=("x",), assignments={"x": (0, 1)}))
    core.workers["w1"].last_seen -= 1
    core.remove_lost_workers()
    core.resolve_unknown("x", None)
    assert core.unknown == [] and core.waiting_count == 0


# --- the journal's commit rule ----------------------------------------------------------


def test_journal_commit_stays_at_the_ends_when_each_uncommitted_request_was_read():
    window = JournalWindow(ends={0: 10, 1: 4}, replayed_from={0: 0, 1: 0})
    assert window.to_commit({}) == {0: 10, 1: 4}
    window.committed({0: 10, 1: 4})
    window.read("req-0", 100)
    window.wrote(0, 10)
    window.read("req-0", 101)
    window.wrote(1, 4)
    window.wrote(0, 11)
    assert window.to_commit({}) == {}, "request 100 was read at ends {0: 10, 1: 4}"
    window.requests_committed({"req-0": 101})
    assert window.to_commit({}) == {0: 11}, "request 101 was read at {0: 11, 1: 4}"
    window.committed({0: 11})
    window.requests_committed({"req-0": 102})
    assert window.to_commit({}) == {0: 12, 1: 5}


def test_journal_commit_stays_below_assignments_their_worker_has_not_read():
    window = JournalWindow(ends={0: 20}, replayed_from={0: 0})
    assert window.to_commit({0: 15}) == {0: 15}


def test_journal_commit_holds_the_replayed_window_until_requests_are_read_up_to_their_start_end():
    window = JournalWindow(ends={0: 30}, replayed_from={0: 12})
    window.hold_until_read("req-0", committed=5)
    assert window.ends_unknown() == ["req-0"]
    assert window.to_commit({}) == {0: 12}
    window.committed({0: 12})
    window.end_at_start("req-0", 9)
    window.requests_committed({"req-0": 8})
    assert window.to_commit({}) == {}
    window.requests_committed({"req-0": 9})
    assert window.to_commit({}) == {0: 30}


def test_nothing_to_read_again_releases_the_replayed_window_at_once():
    window = JournalWindow(ends={0: 30}, replayed_from={0: 12})
    window.hold_until_read("req-0", committed=9)
    window.end_at_start("req-0", 9)
    assert window.to_commit({}) == {0: 30}


# --- ends and fencing -------------------------------------------------------------------


@pytest.mark.parametrize(
    "code,kind",
    [
        (CANCELLED, GenerationDone),
        (DEADLINE_EXCEEDED, GenerationError),
        (OVERLOADED, GenerationError),
        (DISPATCH_FAILED, GenerationError),
    ],
)
def test_unserved_end_ends_the_answer_even_after_earlier_attempts_streamed(code, kind):
    first = make_request("a")
    later = first.model_copy(update={"attempt": 1})
    answer = AnswerLog()
    answer.take(
        TokenChunk(**stream_fields(first, 0), text="hi", token_count=1, completion_tokens=1)
    )
    end = unserved_end(later, code, retry_after=3.0)
    assert isinstance(end, kind) and answer.take(end) and answer.ended
    assert unserved_end(first, code).seq == 0 and end.seq == UNKNOWN_END_SEQ


@pytest.mark.parametrize(
    "claim,fenced",
    [
        (SchedulerClaim(scheduler_id="other", epoch=11), True),
        (SchedulerClaim(scheduler_id="other", epoch=10), False),
        (SchedulerClaim(scheduler_id="other", epoch=9), False),
        (SchedulerClaim(scheduler_id="me", epoch=12), False),
    ],
)
def test_only_a_newer_claim_by_another_scheduler_fences(claim, fenced):
    assert fences(claim, "me", 10) is fenced
