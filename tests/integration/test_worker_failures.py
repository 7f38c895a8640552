"""A worker whose generation fails, on a real broker: the
client's stream ends with a stable code and a fixed message, never the exception's
text, and the worker serves the next request. An engine that raises (the sim engine's
`[[sim:fail]]`, a prompt real vLLM refuses) ends `engine_error`; a chunk the bus
refuses (over a lowered message limit) ends `pipeline_rejected`."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from aiokafka import AIOKafkaProducer

from bench.topic_log import find_events
from bus.broker import EmbeddedBroker
from bus.clients import KafkaConfig, Publisher
from bus.produce_failures import PIPELINE_REJECTED, PIPELINE_REJECTED_MESSAGE
from bus.topics import ensure_topics
from schemas import topics
from schemas.codec import TOKEN_EVENT
from schemas.events import (
    ChatMessage,
    GenerationDone,
    GenerationError,
    GenerationRequest,
    Role,
    SamplingOptions,
    WorkAssignment,
)
from workers.core import WorkerConfig
from workers.engine import Engine
from workers.failures import ENGINE_ERROR, ENGINE_ERROR_MESSAGE
from workers.sim_engine import SimEngine
from workers.stage import WorkerStage

pytestmark = pytest.mark.timeout(180)

LEAKS = ("Traceback", "Error", "/", ".py", "scripted failure", "maximum model length")
"""What an exception's text holds (class names, paths, vLLM's own words)."""


@dataclasses.dataclass(frozen=True)
class SmallRecords(KafkaConfig):
    """Clients whose producers refuse records over `max_record_bytes` (the bus's limit,
    lowered so a test can reach it with one long token)."""

    max_record_bytes: int = 8 * 1024 * 1024

    def producer(self) -> AIOKafkaProducer:
        producer = super().producer()
        producer._max_request_size = self.max_record_bytes  # what its size check reads
        return producer


@pytest_asyncio.fixture(scope="module")
async def broker() -> AsyncIterator[EmbeddedBroker]:
    async with EmbeddedBroker() as broker:
        await ensure_topics(broker.bootstrap_servers)
        yield broker


@contextlib.asynccontextmanager
async def running_worker(kafka: KafkaConfig, engine: Engine) -> AsyncIterator[WorkerStage]:
    worker = WorkerStage(kafka, engine, WorkerConfig(f"w-{uuid.uuid4().hex[:6]}"))
    task = asyncio.create_task(worker.run())
    try:
        async with asyncio.timeout(60):
            while not worker.partitions:
                assert not task.done(), task.result()
                await asyncio.sleep(0.1)
        yield worker
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def make_request(content: str, max_tokens: int = 16) -> GenerationRequest:
    return GenerationRequest(
        request_id=f"req-{uuid.uuid4().hex[:8]}",
        conversation_id=f"c-{uuid.uuid4().hex[:8]}",
        message_id="m",
        user_id="u",
        org_id="o",
        tier="pro",
        model="tiny-random",
        messages=(ChatMessage(role=Role.USER, content=content),),
        sampling=SamplingOptions(max_tokens=max_tokens, temperature=0.0),
        reply_to="chat.deliver.gw-test",
    )


async def run_on(
    worker: WorkerStage,
    request: GenerationRequest,
) -> GenerationDone | GenerationError:
    """Hand `request` to `worker` as the scheduler would; the end of its stream."""
    producer = KafkaConfig(worker.kafka.bootstrap_servers).producer()
    await producer.start()
    try:
        await Publisher(producer).send_and_wait(
            topics.WORK,
            WorkAssignment(worker_id=worker.worker_id, request=request),
            key=request.conversation_id,
        )
    finally:
        await producer.stop()
    [end] = await find_events(
        KafkaConfig(worker.kafka.bootstrap_servers),
        topics.TOKENS,
        TOKEN_EVENT,
        lambda e: (
            getattr(e, "request_id", None) == request.request_id
            and isinstance(e, GenerationDone | GenerationError)
        ),
        timeout_s=60,
    )
    return end


def assert_no_exception_text(error: GenerationError) -> None:
    assert not [leak for leak in LEAKS if leak in error.message], error.message


@pytest_asyncio.fixture(scope="module")
async def sim_engine() -> AsyncIterator[SimEngine]:
    engine = SimEngine("tiny-random", 8, tokens_per_s=500.0, prompt_tokens_per_s=1e6)
    await engine.start()
    yield engine
    await engine.stop()


async def test_an_engine_failure_reaches_the_client_as_a_code_only(broker, sim_engine):
    async with running_worker(KafkaConfig(broker.bootstrap_servers), sim_engine) as worker:
        failed = await run_on(worker, make_request("[[sim:fail]]"))
        after = await run_on(worker, make_request("[[sim:reply=still serving]]"))
    assert isinstance(failed, GenerationError)
    assert (failed.code, failed.message) == (ENGINE_ERROR, ENGINE_ERROR_MESSAGE)
    assert_no_exception_text(failed)
    assert isinstance(after, GenerationDone)


async def test_a_chunk_over_the_bus_limit_ends_its_request_and_the_worker_goes_on(
    broker, sim_engine
):
    kafka = SmallRecords(broker.bootstrap_servers, max_record_bytes=4096)
    async with running_worker(kafka, sim_engine) as worker:
        refused = await run_on(worker, make_request(f"[[sim:reply={'x' * 6000}]]"))
        after = await run_on(worker, make_request("[[sim:reply=next one fits]]"))
        assert not worker.work._closed, "the worker's consumer still runs"
    assert isinstance(refused, GenerationError)
    assert (refused.code, refused.message) == (PIPELINE_REJECTED, PIPELINE_REJECTED_MESSAGE)
    assert_no_exception_text(refused)
    assert isinstance(after, GenerationDone)


@pytest.mark.vllm
async def test_a_request_vllm_refuses_reaches_the_client_as_a_code_only(broker, vllm_engine):
    too_long = " ".join(["word"] * 5000)  # past the tiny model's 4,096 positions
    async with running_worker(KafkaConfig(broker.bootstrap_servers), vllm_engine) as worker:
        refused = await run_on(worker, make_request(too_long))
        after = await run_on(worker, make_request("Hello there", max_tokens=4))
    assert isinstance(refused, GenerationError)
    assert (refused.code, refused.message) == (ENGINE_ERROR, ENGINE_ERROR_MESSAGE)
    assert_no_exception_text(refused)
    assert isinstance(after, GenerationDone)
