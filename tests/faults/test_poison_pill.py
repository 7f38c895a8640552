"""No poison pill: a record a stage cannot send — an assignment
over the bus's message limit, an event for a topic that cannot exist — ends that
request with a terminal event (`pipeline_rejected`), goes to `chat.dlq`, and the stage
goes on with the next request; a restart does not read it into a crash again.

Requests are published straight to `chat.requests.<tier>` with the bus's own producer,
as a gateway with no admission checks would; each stage is its own process.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from bench.fault_scenarios import PIPELINE_SETTINGS
from bench.process_pipeline import Pipeline, running_pipeline
from bus.produce_failures import PIPELINE_REJECTED
from schemas import topics
from schemas.codec import ANSWER_EVENT, TOKEN_EVENT, encode, headers
from schemas.events import (
    ChatMessage,
    DeadLetter,
    DeliveryDone,
    DeliveryError,
    GenerationDone,
    GenerationError,
    GenerationRequest,
    Role,
    SamplingOptions,
)

pytestmark = pytest.mark.timeout(240)

BAD_REPLY_TO = "chat.deliver.no such gateway!"
"""A topic name the bus refuses: every event for it is a record that cannot be sent."""


@pytest_asyncio.fixture(scope="module")
async def pipeline(tmp_path_factory) -> AsyncIterator[Pipeline]:
    async with running_pipeline(tmp_path_factory.mktemp("poison"), **PIPELINE_SETTINGS) as pipe:
        for stage in ("scheduler", "safety", "recorder", "billing"):
            await pipe.start(stage)
        yield pipe


async def with_worker(pipeline: Pipeline) -> None:
    if "w1" not in pipeline.stages:
        await pipeline.start("w1", "worker")
        await pipeline.wait_for_workers("w1")


def request(content: str, reply_to: str = "chat.deliver.poison-test") -> GenerationRequest:
    return GenerationRequest(
        request_id=f"req-{uuid.uuid4().hex[:8]}",
        conversation_id=f"c-{uuid.uuid4().hex[:8]}",
        message_id=f"m-{uuid.uuid4().hex[:8]}",
        user_id="u",
        org_id="o",
        tier="free",
        model="tiny-random",
        messages=(ChatMessage(role=Role.USER, content=content),),
        sampling=SamplingOptions(max_tokens=8),
        reply_to=reply_to,
    )


def just_under_the_limit(pipeline: Pipeline) -> GenerationRequest:
    """A request whose record is a few bytes under the bus's limit: it goes on the bus,
    its assignment (the request and a little more) does not."""
    limit = pipeline.kafka.producer()._max_request_size
    base = request("")

    def sized(n: int) -> tuple[int, GenerationRequest]:
        r = base.model_copy(update={"messages": (ChatMessage(role=Role.USER, content="x" * n),)})
        key = r.conversation_id.encode()
        return DefaultRecordBatchBuilder.estimate_size_in_bytes(key, encode(r), headers(r)), r

    size, _ = sized(0)
    size, big = sized(limit - size - 64)
    assert limit - 200 < size < limit
    return big


async def publish(pipeline: Pipeline, event: GenerationRequest) -> None:
    await pipeline.send(topics.requests_topic(event.tier), event, key=event.conversation_id)


async def stream_end(pipeline: Pipeline, request_id: str) -> GenerationDone | GenerationError:
    [end] = await pipeline.find(
        topics.TOKENS,
        TOKEN_EVENT,
        lambda e: (
            getattr(e, "request_id", None) == request_id
            and isinstance(e, GenerationDone | GenerationError)
        ),
        timeout_s=60,
    )
    return end


async def answer_end(pipeline: Pipeline, request_id: str) -> DeliveryDone | DeliveryError:
    """The end the safety stage delivered for a stored answer (what a gateway resuming
    the stream and the recorder read)."""
    [end] = await pipeline.find(
        topics.ANSWERS,
        ANSWER_EVENT,
        lambda e: e.request_id == request_id and isinstance(e, DeliveryDone | DeliveryError),
        timeout_s=60,
    )
    return end


async def dead_letter(pipeline: Pipeline, stage: str, request_id: str) -> DeadLetter:
    [letter] = await pipeline.find(
        topics.DLQ, DeadLetter, lambda d: d.stage == stage and request_id in d.value, timeout_s=30
    )
    return letter


async def served(pipeline: Pipeline) -> None:
    """The next ordinary request is answered to its end."""
    after = request("[[sim:reply=still serving]]")
    await publish(pipeline, after)
    end = await answer_end(pipeline, after.request_id)
    assert isinstance(end, DeliveryDone), end


async def test_a_queued_request_whose_updates_the_bus_refuses_ends_alone(pipeline):
    """No worker yet: the request waits, and its queue position cannot be sent."""
    refused = request("[[sim:reply=never]]", reply_to=BAD_REPLY_TO)
    await publish(pipeline, refused)
    end = await stream_end(pipeline, refused.request_id)
    assert isinstance(end, GenerationError) and end.code == PIPELINE_REJECTED
    await with_worker(pipeline)
    await served(pipeline)
    assert pipeline.stages["scheduler"].running


async def test_an_assignment_over_the_bus_limit_ends_its_request_not_the_scheduler(pipeline):
    await with_worker(pipeline)
    big = just_under_the_limit(pipeline)
    await publish(pipeline, big)
    end = await stream_end(pipeline, big.request_id)
    assert isinstance(end, GenerationError) and end.code == PIPELINE_REJECTED
    assert "MessageSize" not in end.message and "bytes" not in end.message
    delivered = await answer_end(pipeline, big.request_id)
    assert isinstance(delivered, DeliveryError) and delivered.code == PIPELINE_REJECTED
    letter = await dead_letter(pipeline, "scheduler", big.request_id)
    assert "MessageSizeTooLarge" in letter.error and letter.truncated
    await served(pipeline)
    assert pipeline.stages["scheduler"].running

    # A restart reads nothing of it again into a crash: it was committed past.
    await pipeline.restart("scheduler")
    await served(pipeline)
    assert pipeline.stages["scheduler"].running


async def test_a_delivery_the_bus_refuses_ends_that_answer_and_safety_goes_on(pipeline):
    await with_worker(pipeline)
    refused = request("[[sim:reply=an answer nobody can be sent]]", reply_to=BAD_REPLY_TO)
    await publish(pipeline, refused)
    end = await answer_end(pipeline, refused.request_id)
    assert isinstance(end, DeliveryError) and end.code == PIPELINE_REJECTED, end
    assert BAD_REPLY_TO not in end.message
    await dead_letter(pipeline, "safety", refused.request_id)
    await served(pipeline)
    assert all(stage.running for stage in pipeline.stages.values())
