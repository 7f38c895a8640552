"""`chatpipe up` with scheduler shards (docs/architecture/scale.md): one scheduler per
shard runs in the stack, the served model's requests are decided by its shard's
scheduler on that shard's `chat.work.<shard>`, and a turn through the gateway is answered."""

from __future__ import annotations

from bench.topic_log import find_events
from schemas import topics
from schemas.codec import SCHEDULER_EVENT, WORK_EVENT
from schemas.events import SchedulerStatus, WorkAssignment
from tests.support.capacity import Chat, sim_pipeline

SHARDS = {"main": ["tiny-random"], "other": ["absent-model"]}


async def test_the_stack_runs_a_scheduler_per_shard_and_answers_through_the_models_shard(tmp_path):
    async with sim_pipeline(
        tmp_path, slots=2, model_name="tiny-random", scheduler_shards=SHARDS
    ) as stack:
        assert {"scheduler", "scheduler-main", "scheduler-other"} <= set(stack.tasks)
        chat = Chat(stack, "pro-a")
        _, events = await chat.ask("hello shards", 8)
        await chat.aclose()
        assert "done" in [e.event for e in events], [e.event for e in events]
        (assignment,) = await find_events(
            stack.kafka,
            topics.work_topic("main"),
            WORK_EVENT,
            lambda e: isinstance(e, WorkAssignment),
            timeout_s=10,
        )
        assert assignment.request.model == "tiny-random"
        seen: set[str] = set()

        def new_shard(event: object) -> bool:
            if not isinstance(event, SchedulerStatus) or event.shard in seen:
                return False
            seen.add(event.shard)
            return True

        statuses = await find_events(
            stack.kafka, topics.SCHEDULER, SCHEDULER_EVENT, new_shard, count=3, timeout_s=15
        )
        assert {s.shard for s in statuses} == {"", "main", "other"}
