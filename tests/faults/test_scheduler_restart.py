"""The scheduler survives SIGKILL and a rival: requests go straight onto
the request topics and the stages run as processes (`bench/process_pipeline.py`), so
what is measured is the scheduler with real workers on a real broker.

Pass criteria, read from the bus after each scenario:
- every request's stream ends exactly once (one distinct end event) with its whole
  answer: the text the sim engine plans for it, no gap and no repeat;
- no (request, attempt) is in two assignments a worker would run (`chat.work`);
- queued requests are dispatched within 5 s of the scheduler's restart;
- a request cancelled while queued ends once, aborted, and is never assigned;
- a rival scheduler fences the first, which logs it and dispatches nothing after.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest
import pytest_asyncio

from bench.process_pipeline import Pipeline, prints_logs_on_failure, running_pipeline
from bus.clients import keyed_partition
from bus.replay import read_to_end
from bus.topics import create_topics
from schemas import topics
from schemas.codec import SCHEDULER_EVENT, WORK_EVENT
from schemas.events import (
    Cancel,
    ChatMessage,
    GenerationDone,
    GenerationRequest,
    Role,
    SamplingOptions,
    SchedulerClaim,
    Unserved,
    WorkAssignment,
)
from schemas.lifecycle import RequestStatus
from schemas.topics import Tier
from tests.support.scheduler_journal import REPLY_TO, Journal, assert_each_ran_once, streams, submit

pytestmark = pytest.mark.timeout(120)

TOKENS_PER_S = 50.0
SLOTS = 2
WORKERS = ("w1", "w2")
REQUEST_PARTITIONS = 2
RESTART_TO_DISPATCH_S = 5.0


@pytest_asyncio.fixture(scope="module")
async def pipeline(tmp_path_factory) -> Pipeline:
    """Scheduler and two sim workers, each a process; the scenarios run in order on it
    and each leaves one acting scheduler and both workers up."""
    async with running_pipeline(
        tmp_path_factory.mktemp("faults"),
        max_slots=SLOTS,
        sim_tokens_per_s=TOKENS_PER_S,
        worker_lost_after_s=2.0,
        heartbeat_interval_s=0.5,
        topic_partitions=REQUEST_PARTITIONS,
    ) as pipe:
        await create_topics(pipe.kafka.bootstrap_servers, {REPLY_TO: 1})
        await pipe.start("scheduler")
        for worker in WORKERS:
            await pipe.start(worker, "worker")
        await pipe.wait_for_workers(*WORKERS)
        yield pipe


def chat(name: str, tokens: int, partition: int | None = None) -> GenerationRequest:
    """A request answering with exactly `tokens` tokens (`tokens / TOKENS_PER_S` s); its
    conversation lands on request partition `partition` when given."""
    conversation = f"c-{name}"
    salt = 0
    while (
        partition is not None
        and keyed_partition(conversation.encode(), range(REQUEST_PARTITIONS), ()) != partition
    ):
        salt += 1
        conversation = f"c-{name}-{salt}"
    return GenerationRequest(
        request_id=name,
        conversation_id=conversation,
        message_id=f"m-{name}",
        user_id=f"u-{name}",
        org_id="o",
        tier=Tier.FREE,
        model="tiny-random",
        messages=(ChatMessage(role=Role.USER, content=f"tell me about {name}"),),
        sampling=SamplingOptions(max_tokens=tokens, ignore_eos=True),
        reply_to=REPLY_TO,
        store=False,
    )


async def journal(pipe: Pipeline) -> Journal:
    found, epochs = Journal(), Counter()
    for partition, _, event in await read_to_end(
        pipe.kafka.bootstrap_servers, topics.WORK, WORK_EVENT
    ):
        if isinstance(event, Unserved):
            found.unserved.append(event)
            continue
        if isinstance(event, WorkAssignment):
            runs = event.epoch >= epochs[partition]
            (found.runnable if runs else found.fenced).append(event)
        epochs[partition] = max(epochs[partition], event.epoch)
    return found


async def until_assigned(
    pipe: Pipeline, requests: list[GenerationRequest], timeout_s: float = 15.0
) -> Journal:
    deadline = time.monotonic() + timeout_s
    while True:
        work = await journal(pipe)
        if all(work.of(r) for r in requests):
            return work
        assert time.monotonic() < deadline, "requests were not dispatched"
        await asyncio.sleep(0.2)


async def restart_scheduler(pipe: Pipeline, name: str = "scheduler") -> float:
    """Restart (or start) scheduler `name`; returns the wall time of the restart once its
    claim is on chat.scheduler."""
    restarted = time.time()
    if name in pipe.stages:
        await pipe.restart(name)
    else:
        await pipe.start(name, "scheduler")
    await pipe.find(
        topics.SCHEDULER,
        SCHEDULER_EVENT,
        lambda e: isinstance(e, SchedulerClaim) and e.sent_at >= restarted,
        timeout_s=15,
    )
    return restarted


@prints_logs_on_failure
async def test_a_killed_scheduler_restarts_without_dispatching_twice(pipeline):
    running = [chat(f"a-run-{i}", tokens=100) for i in range(SLOTS * len(WORKERS))]
    queued = [chat(f"a-queued-{i}", tokens=25) for i in range(4)]
    await submit(pipeline, *running)
    await until_assigned(pipeline, running)
    await submit(pipeline, *queued)
    await asyncio.sleep(0.5)  # read and waiting: every slot is taken
    killed = time.time()
    pipeline.kill("scheduler")
    await streams(pipeline, running)  # the workers finish them meanwhile
    restarted = await restart_scheduler(pipeline)
    found = await streams(pipeline, running + queued)
    work = await journal(pipeline)

    started = {r.request_id: min(a.dispatched_at for a in work.of(r)) for r in queued}
    assert min(started.values()) > killed, "a queued request was dispatched before the kill"
    print(
        f"restart to first dispatch: {min(started.values()) - restarted:.2f} s, "
        f"to the last queued: {max(started.values()) - restarted:.2f} s"
    )
    assert max(started.values()) - restarted < RESTART_TO_DISPATCH_S
    assert_each_ran_once(found, work, running + queued)
    assert {a.request.attempt for a in work.runnable} == {0}, "no worker was lost"


@prints_logs_on_failure
async def test_b_request_cancelled_while_queued_stays_cancelled_across_a_restart(pipeline):
    busy = [chat(f"b-busy-{i}", tokens=250) for i in range(SLOTS * len(WORKERS))]
    await submit(pipeline, *busy)
    await until_assigned(pipeline, busy)
    # `first` waits before `gone` on the same partition: a restart reads `gone` again.
    first, gone = chat("b-first", tokens=25, partition=0), chat("b-gone", tokens=25, partition=0)
    await submit(pipeline, first, gone)
    await asyncio.sleep(0.5)
    await pipeline.send(
        topics.CONTROL, Cancel(request_id=gone.request_id, reason="test"), key=gone.request_id
    )
    await streams(pipeline, [gone])
    pipeline.kill("scheduler")
    await restart_scheduler(pipeline)
    found = await streams(pipeline, [*busy, first, gone])
    work = await journal(pipeline)

    assert work.of(gone) == [], "a cancelled request was dispatched"
    assert [u.code for u in work.unserved if u.request_id == gone.request_id] == ["cancelled"]
    ended = found[gone.request_id]
    assert isinstance(ended.log.end, GenerationDone)
    assert ended.log.end.status == RequestStatus.FINISHED_ABORTED
    assert list(ended.ends.values()) == [2], "read again after the restart, ended the same"
    assert_each_ran_once(found, work, [*busy, first])


@prints_logs_on_failure
async def test_c_worker_killed_after_a_scheduler_restart_has_its_requests_finished(pipeline):
    long = [chat(f"c-long-{i}", tokens=300) for i in range(len(WORKERS))]  # one per worker
    await submit(pipeline, *long)
    work = await until_assigned(pipeline, long)
    await asyncio.sleep(1.0)  # read and committed: the new scheduler learns them from heartbeats
    pipeline.kill("scheduler")
    await restart_scheduler(pipeline)
    await asyncio.sleep(1.0)  # a heartbeat of each worker
    victim = work.of(long[0])[0].worker_id
    pipeline.kill(victim)
    found = await streams(pipeline, long, timeout_s=45)
    work = await journal(pipeline)

    moved = [r for r in long if work.of(r)[0].worker_id == victim]
    assert moved
    for request in moved:
        assert [(a.request.attempt, a.worker_id != victim) for a in work.of(request)] == [
            (0, False),
            (1, True),
        ], request.request_id
    assert_each_ran_once(found, work, long)
    await pipeline.restart(victim)
    await pipeline.wait_for_workers(victim)


@prints_logs_on_failure
async def test_d_a_second_scheduler_fences_the_first(pipeline):
    requests = [chat(f"d-{i}", tokens=25) for i in range(12)]
    await submit(pipeline, *requests[:6])
    claimed = await restart_scheduler(pipeline, "scheduler-2")
    for request in requests[6:]:
        await submit(pipeline, request)
        await asyncio.sleep(0.2)
    found = await streams(pipeline, requests)
    work = await journal(pipeline)
    claims = [
        e
        for _, _, e in await read_to_end(
            pipeline.kafka.bootstrap_servers, topics.SCHEDULER, SCHEDULER_EVENT
        )
        if isinstance(e, SchedulerClaim)
    ]
    newest = max(claims, key=lambda c: c.epoch)

    assert "fenced" in pipeline.log_tail("scheduler", lines=200)
    assert newest.sent_at >= claimed and pipeline.stages["scheduler"].running
    late = [
        a
        for a in work.runnable + work.fenced
        if a.epoch < newest.epoch and a.dispatched_at > newest.sent_at + 1.0
    ]
    assert late == [], "the fenced scheduler kept dispatching"
    assert_each_ran_once(found, work, requests)
