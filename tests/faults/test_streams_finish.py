"""Every stream finishes, whatever fails underneath: workers killed or
drained, a gateway killed, clients that drop and come back, a stage that freezes.

One pipeline of processes (`bench/fault_scenarios.py`: scheduler, safety, recorder,
billing, two sim workers, two gateways) serves the scenarios in order; each puts back
what it broke. Pass criteria are what the users saw: answers finished, tokens missing
or repeated against an uninterrupted run, the longest pause, the stored answer.
"""

from __future__ import annotations

import asyncio
import signal
import time

import pytest
import pytest_asyncio

from bench import fault_scenarios as scenarios
from bench.fault_scenarios import (
    LOST_AFTER_S,
    RESUME_GRACE_S,
    STALL_S,
    TOKENS_PER_S,
    cancels_of,
    judge,
    stored_answer,
    stored_once_ended,
    usage_of,
)
from bench.process_pipeline import Pipeline
from bench.watched_streams import Watched, reading, watch
from schemas import topics
from schemas.events import Cancel
from schemas.lifecycle import RequestStatus

pytestmark = pytest.mark.timeout(240)


def held_by(cancel: Cancel) -> str | None:
    """The gateway a cancel is conditional on (None: unconditional)."""
    return cancel.held_by and topics.delivering_gateway(cancel.held_by)


@pytest_asyncio.fixture(scope="module")
async def pipeline(tmp_path_factory) -> Pipeline:
    async with scenarios.stream_pipeline(tmp_path_factory.mktemp("streams")) as pipe:
        yield pipe


async def test_a_killed_worker_s_answers_finish_on_the_other_without_gap_or_repeat(pipeline):
    result = await scenarios.worker_crash(pipeline, streams=64)
    print(result)
    assert result.clean, result
    assert result.details["continued"] >= 1, "the killed worker carried no answer"
    assert result.max_stall_ms <= (LOST_AFTER_S + 2) * 1000, result
    assert result.details["tokens_billed"] == result.details["tokens_used"], (
        "each prompt and each generated token billed once"
    )


async def test_stages_cut_off_the_broker_reconnect_and_every_answer_finishes_billed_once(
    pipeline,
):
    """The broker keeps its records (as Apache Kafka does through a restart or a leader
    change); every stage's connections to it are cut for 3 s mid-answer."""
    result = await scenarios.broker_cut(pipeline, streams=16, cut_s=3.0)
    print(result)
    assert result.clean, result
    assert result.details["stages_exited"] == 0
    assert result.details["tokens_billed"] == result.details["tokens_used"]


async def test_a_drained_worker_finishes_what_it_can_and_hands_on_the_rest(pipeline):
    result = await scenarios.worker_drain(pipeline, streams=16)
    print(result)
    assert result.clean, result
    assert result.details["exit_code"] == 0
    assert result.details["handed_back"] >= 1, "the long answers were handed back"
    assert result.details["exited_after_s"] <= scenarios.DRAIN_S + 10


async def test_a_killed_gateway_s_streams_resume_on_another(pipeline):
    result = await scenarios.gateway_death(pipeline, streams=16)
    print(result)
    assert result.clean, result
    assert result.details["resumed"] == 16
    assert result.details["stored_equal"] == 16, "the joined text is the stored answer"


async def test_a_killed_scheduler_comes_back_and_dispatches_nothing_twice(pipeline):
    result = await scenarios.scheduler_restart(pipeline, running=16, queued=8)
    print(result)
    assert result.clean, result
    assert result.details["dispatched_twice"] == 0
    assert result.details["queued_started_within_s"] <= 5.0


# --- clients that drop and come back ---------------------------------------------------------


async def test_a_dropped_stream_resumed_elsewhere_within_the_grace_is_not_cancelled(pipeline):
    async with pipeline.http("g1") as first, pipeline.http("g2") as second:
        [cid] = await scenarios.conversations(first, 1)
        answer_s = 3 * RESUME_GRACE_S
        body = scenarios.body(int(answer_s * TOKENS_PER_S), "dropped")
        seen = await (await reading([first], cid, body)).drop()  # the phone loses its network
        await asyncio.sleep(1.0)
        rest = await watch([second], cid, body, seen=seen)  # resumes after its last id
        # Resumed with a grace of RESUME_GRACE_S on g1: the answer outlives it uncancelled.
        assert rest.finished and rest.ended_at - seen.started_at > RESUME_GRACE_S + 1
        result = await judge(pipeline, "resume", [rest])
        stored = await stored_answer(second, rest)
    assert result.clean, result
    assert (stored["content"], stored["status"]) == (rest.text, rest.end["status"])
    assert await cancels_of(pipeline, rest.request_id) == []


async def test_a_stream_dropped_twice_is_cancelled_by_no_gateway_that_held_it(pipeline):
    """g1 asks, the client drops and resumes on g2, drops again and resumes on g1: g2's
    grace runs out while g1 relays the stream, and g2's cancel must not end it."""
    async with pipeline.http("g1") as first, pipeline.http("g2") as second:
        [cid] = await scenarios.conversations(first, 1)
        body = scenarios.body(int(4 * RESUME_GRACE_S * TOKENS_PER_S), "twice")
        seen = await (await reading([first], cid, body)).drop()
        await asyncio.sleep(0.5)
        seen = await (await reading([second], cid, body, seen=seen)).drop()
        await asyncio.sleep(0.5)
        rest = await watch([first], cid, body, seen=seen)
        result = await judge(pipeline, "twice", [rest])
    assert result.clean, result
    assert rest.connections == 3
    cancels = [(c.reason, held_by(c)) for c in await cancels_of(pipeline, rest.request_id)]
    assert cancels == [("client_gone", "g2")], "asked, and dropped by the scheduler"


async def test_a_stream_resumed_before_its_old_connection_closed_is_not_cancelled(pipeline):
    """The phone switches networks: the new connection (g2) resumes while the old one
    (g1) has not closed yet; when it closes, g1's grace must not end the stream."""
    async with pipeline.http("g1") as first, pipeline.http("g2") as second:
        [cid] = await scenarios.conversations(first, 1)
        body = scenarios.body(int(4 * RESUME_GRACE_S * TOKENS_PER_S), "switch")
        old = await reading([first], cid, body)
        resumed = Watched(
            ids=dict(old.seen.ids),
            deltas=list(old.seen.deltas),
            last_id=old.seen.last_id,
            started_at=old.seen.started_at,
        )
        new = await reading([second], cid, body, seen=resumed)
        await asyncio.sleep(1.0)
        await old.drop()  # only now does g1 see its client go
        rest = await new.result()
        result = await judge(pipeline, "switch", [rest])
    assert result.clean, result
    cancels = [(c.reason, held_by(c)) for c in await cancels_of(pipeline, rest.request_id)]
    assert cancels == [("client_gone", "g1")], "asked, and dropped by the scheduler"


async def test_a_dropped_stream_nobody_resumes_is_cancelled_after_the_grace(pipeline):
    async with pipeline.http("g1") as client:
        [cid] = await scenarios.conversations(client, 1)
        tokens = int(10 * RESUME_GRACE_S * TOKENS_PER_S)
        seen = await (await reading([client], cid, scenarios.body(tokens, "gone"))).drop()
        dropped = time.monotonic()
        usage = await usage_of(pipeline, seen.request_id, timeout_s=RESUME_GRACE_S + 10)
        ended_after = time.monotonic() - dropped
        stored = await stored_once_ended(client, seen)
    assert usage.status == RequestStatus.FINISHED_ABORTED
    assert RESUME_GRACE_S - 0.5 <= ended_after <= RESUME_GRACE_S + 3, ended_after
    assert usage.completion_tokens < tokens / 2, "cancelled, not run to its end"
    cancels = [(c.reason, held_by(c)) for c in await cancels_of(pipeline, seen.request_id)]
    assert cancels == [("client_gone", "g1"), ("client_gone", None)], (
        "g1 asks, the scheduler (g1 still holds it) passes the cancel on"
    )
    assert stored["status"] == "finished_aborted", "the recorder stored what nobody relayed"


async def test_a_dead_gateway_s_stream_nobody_resumes_is_cancelled_after_the_grace(pipeline):
    async with pipeline.http("g1") as client:
        [cid] = await scenarios.conversations(client, 1)
        tokens = int(10 * RESUME_GRACE_S * TOKENS_PER_S)
        orphan = await reading([client], cid, scenarios.body(tokens, "orphan"))
        pipeline.kill("g1")
        killed = time.monotonic()
        seen = await orphan.drop()
        usage = await usage_of(pipeline, seen.request_id, timeout_s=RESUME_GRACE_S + 15)
        ended_after = time.monotonic() - killed
    await pipeline.restart("g1")
    await pipeline.wait_for_gateway("g1")
    assert usage.status == RequestStatus.FINISHED_ABORTED
    assert ended_after <= RESUME_GRACE_S + 4, "a dead gateway wastes at most the grace"
    assert usage.completion_tokens < tokens / 2
    assert [c.reason for c in await cancels_of(pipeline, seen.request_id)] == ["gateway_gone"]


async def test_a_gateway_restarted_under_its_id_lets_go_of_what_its_last_start_relayed(pipeline):
    """A pod's container restarting keeps its id: the new start reads a delivery topic of
    its own, so the stream the old one relayed, which nobody resumed, stops after the
    grace as if its gateway had died, and the restarted one serves new answers."""
    async with pipeline.http("g1") as client:
        cid, other = await scenarios.conversations(client, 2)
        tokens = int(10 * RESUME_GRACE_S * TOKENS_PER_S)
        orphan = await reading([client], cid, scenarios.body(tokens, "restarted"))
        await pipeline.restart("g1")  # SIGKILL, then the same id again at once
        restarted = time.time()
        seen = await orphan.drop()
        await pipeline.wait_for_gateway("g1")
        usage = await usage_of(pipeline, seen.request_id, timeout_s=RESUME_GRACE_S + 15)
        # When the worker ended it (its clock is this machine's), not when this test read
        # so, having waited for the new start to come up first.
        ended_after = usage.created_at - restarted
        after = await watch([client], other, scenarios.body(40, "after"))
    assert usage.status == RequestStatus.FINISHED_ABORTED
    assert ended_after <= RESUME_GRACE_S + 4, "the old start's stream wastes at most the grace"
    assert usage.completion_tokens < tokens / 2
    assert [c.reason for c in await cancels_of(pipeline, seen.request_id)] == ["gateway_gone"]
    assert after.finished and after.request_id != seen.request_id
    starts = await scenarios.delivery_topics_of(pipeline, "g1")
    assert len(starts) >= 2, f"one delivery topic per start of g1: {starts}"


async def test_stop_on_another_gateway_cancels_at_once(pipeline):
    async with pipeline.http("g1") as first, pipeline.http("g2") as second:
        [cid] = await scenarios.conversations(first, 1)
        answer = await reading([first], cid, scenarios.body(400, "stop"))
        stopped = await second.post(f"/v1/requests/{answer.seen.request_id}/cancel")
        assert stopped.status_code == 202, stopped.text
        watched = await answer.result(timeout_s=10)
    assert watched.end_event == "done" and watched.end["status"] == "finished_aborted"
    assert watched.end["usage"]["completion_tokens"] < 200


# --- no stream hangs -------------------------------------------------------------------------


async def test_a_stream_that_stops_moving_ends_stalled_and_is_cancelled(pipeline):
    async with pipeline.http("g1") as client:
        [cid] = await scenarios.conversations(client, 1)
        answer = await reading([client], cid, scenarios.body(400, "stall"))
        pipeline.signal("safety", signal.SIGSTOP)  # frozen: nothing reaches the gateway
        try:
            watched = await answer.result(timeout_s=STALL_S + 10)
        finally:
            pipeline.signal("safety", signal.SIGCONT)
        stored = await stored_answer(client, watched)
    assert watched.end_event == "error" and watched.end["code"] == "stalled"
    stall = watched.ended_at - watched.deltas[-1][2]
    assert STALL_S - 0.5 <= stall <= STALL_S + 2, stall
    assert [c.reason for c in await cancels_of(pipeline, watched.request_id)] == ["stalled"]
    assert stored["status"] == "finished_error" and stored["content"] == watched.text


# --- read your writes ------------------------------------------------------------------------


async def test_the_answer_is_stored_before_its_end_reaches_the_client(pipeline):
    async with pipeline.http("g1") as client:
        [cid] = await scenarios.conversations(client, 1)
        answer = await reading([client], cid, scenarios.body(40, "ryw"))
        during = await stored_answer(client, answer.seen)
        watched = await answer.result()
        after = await stored_answer(client, watched)
        again = await client.post(
            f"/v1/conversations/{cid}/messages", json={"content": "next", "max_tokens": 4}
        )
    assert during["status"] == "in_progress"
    assert (after["content"], after["status"]) == (watched.text, watched.end["status"])
    assert again.status_code == 200, "the next turn never waits on a finished answer"
