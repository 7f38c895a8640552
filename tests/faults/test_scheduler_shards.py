"""Two scheduler shards side by side (`CHATPIPE_SCHEDULER_SHARDS`, docs/architecture/scale.md), each
its own process on a real broker with sim-engine workers, requests straight onto the
request topics (as in test_scheduler_restart):

- a request for each shard's model is answered, each assigned on its own shard's journal
  (`chat.work.big` for the named shard, `chat.work` for the unnamed one);
- SIGKILL one shard's scheduler: the other shard's model is still answered, the killed
  shard's request waits and is answered once its scheduler is back;
- a second scheduler of one shard fences the first of that shard only.
"""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from bench.process_pipeline import Pipeline, prints_logs_on_failure, running_pipeline
from bus.replay import read_to_end
from bus.topics import create_topics
from schemas import topics
from schemas.codec import SCHEDULER_EVENT, WORK_EVENT
from schemas.events import (
    ChatMessage,
    GenerationRequest,
    Role,
    SamplingOptions,
    SchedulerClaim,
    SchedulerStatus,
    WorkAssignment,
)
from schemas.topics import Tier
from tests.support.scheduler_journal import REPLY_TO, Journal, assert_each_ran_once, streams, submit

pytestmark = pytest.mark.timeout(180)

BIG, SMALL = "big-model", "small-model"
SHARDS = {"big": [BIG]}
"""The named shard decides for BIG; the unnamed one for every other model (SMALL)."""
BIG_WORK = topics.work_topic("big")


@pytest_asyncio.fixture(scope="module")
async def pipeline(tmp_path_factory) -> Pipeline:
    """The unnamed shard's scheduler, shard big's, and a sim worker of each model."""
    async with running_pipeline(
        tmp_path_factory.mktemp("shards"),
        scheduler_shards=SHARDS,
        max_slots=2,
        sim_tokens_per_s=50.0,
        worker_lost_after_s=2.0,
        heartbeat_interval_s=0.5,
        topic_partitions=2,
        work_partitions=2,
    ) as pipe:
        await create_topics(pipe.kafka.bootstrap_servers, {REPLY_TO: 1})
        await pipe.start("scheduler")
        await pipe.start("scheduler-big", "scheduler", scheduler_shard="big")
        await pipe.start("w-big", "worker", model_name=BIG)
        await pipe.start("w-small", "worker", model_name=SMALL)
        await pipe.wait_for_workers("w-big", "w-small")
        yield pipe


def chat(name: str, model: str, tokens: int = 15) -> GenerationRequest:
    return GenerationRequest(
        request_id=name,
        conversation_id=f"c-{name}",
        message_id=f"m-{name}",
        user_id=f"u-{name}",
        org_id="o",
        tier=Tier.FREE,
        model=model,
        messages=(ChatMessage(role=Role.USER, content=f"tell me about {name}"),),
        sampling=SamplingOptions(max_tokens=tokens, ignore_eos=True),
        reply_to=REPLY_TO,
        store=False,
    )


async def assigned(pipe: Pipeline, topic: str) -> list[WorkAssignment]:
    return [
        event
        for _, _, event in await read_to_end(pipe.kafka.bootstrap_servers, topic, WORK_EVENT)
        if isinstance(event, WorkAssignment)
    ]


async def journals(pipe: Pipeline) -> Journal:
    """Both shards' assignments (each request is in one of them only)."""
    return Journal(runnable=[*await assigned(pipe, topics.WORK), *await assigned(pipe, BIG_WORK)])


def ids(assignments: list[WorkAssignment]) -> set[str]:
    return {a.request.request_id for a in assignments}


@prints_logs_on_failure
async def test_each_shard_answers_its_own_model_on_its_own_journal(pipeline):
    requests = [chat("a-big", BIG), chat("a-small", SMALL)]
    await submit(pipeline, *requests)
    found = await streams(pipeline, requests)
    assert_each_ran_once(found, await journals(pipeline), requests)
    assert ids(await assigned(pipeline, BIG_WORK)) == {"a-big"}
    assert ids(await assigned(pipeline, topics.WORK)) == {"a-small"}
    statuses = {
        (e.shard, e.models)
        for _, _, e in await read_to_end(
            pipeline.kafka.bootstrap_servers, topics.SCHEDULER, SCHEDULER_EVENT
        )
        if isinstance(e, SchedulerStatus)
    }
    assert {("big", (BIG,)), ("", ())} <= statuses
    for name in ("scheduler", "scheduler-big"):
        assert "fenced" not in pipeline.log_tail(name, 400), name  # two shards, no rivals


@prints_logs_on_failure
async def test_a_killed_shard_leaves_the_other_shard_deciding(pipeline):
    pipeline.kill("scheduler-big")
    big, small = chat("b-big", BIG), chat("b-small", SMALL)
    await submit(pipeline, big, small)
    await streams(pipeline, [small])
    await asyncio.sleep(1.0)
    assert "b-big" not in ids(await assigned(pipeline, BIG_WORK))  # its scheduler is down
    await pipeline.restart("scheduler-big")
    found = await streams(pipeline, [big, small], timeout_s=60.0)
    assert_each_ran_once(found, await journals(pipeline), [big, small])


@prints_logs_on_failure
async def test_a_second_scheduler_of_a_shard_fences_only_that_shards_first(pipeline):
    await pipeline.start("scheduler-big-2", "scheduler", scheduler_shard="big")
    claims = await pipeline.find(
        topics.SCHEDULER,
        SCHEDULER_EVENT,
        lambda e: (
            isinstance(e, SchedulerClaim)
            and e.shard == "big"
            and e.sent_at >= pipeline.stages["scheduler-big-2"].started_at
        ),
        timeout_s=30,
    )
    assert claims
    requests = [chat("c-big", BIG), chat("c-small", SMALL)]
    await submit(pipeline, *requests)
    found = await streams(pipeline, requests, timeout_s=60.0)
    assert_each_ran_once(found, await journals(pipeline), requests)
    assert "fenced" in pipeline.log_tail("scheduler-big", 400)
    assert "fenced" not in pipeline.log_tail("scheduler", 400)
    assert "fenced" not in pipeline.log_tail("scheduler-big-2", 400)
