"""A tools stage (`chat.tools`) that dies loses no round: a round
paused on its worker waits on `chat.tools` for the next tools stage, which runs it
(its offset is committed only once its results and next round are acknowledged), and
the client sees the answer whole: one `tool_call`, one `tool_result`, the text. A
client whose round waits longer than the stream stall timeout gets an error event,
never a hang, and its answer is cancelled: the round queued once a tools stage is back
ends at the scheduler, never reaching a worker. A round the bus cannot hand on (its next
round over the bus's limit) ends its answer with an error after its result, leaves a
dead letter on `chat.dlq`, and the stage goes on."""

from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import pytest
import pytest_asyncio
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from bench import fault_scenarios as scenarios
from bench.fault_scenarios import PIPELINE_SETTINGS
from bench.process_pipeline import Pipeline, running_pipeline
from bus.produce_failures import PIPELINE_REJECTED, PIPELINE_REJECTED_MESSAGE
from scheduler.journal import CANCELLED
from schemas import topics
from schemas.codec import ANSWER_EVENT, TOKEN_EVENT, WORK_EVENT, encode, headers
from schemas.events import (
    ChatMessage,
    DeadLetter,
    DeliveredToolCall,
    DeliveredToolResult,
    DeliveryError,
    Event,
    GenerationDone,
    GenerationError,
    GenerationRequest,
    RequestStatus,
    Role,
    SamplingOptions,
    TokenChunk,
    ToolCallsMade,
    ToolResult,
    ToolRound,
    Unserved,
    WorkAssignment,
    stream_fields,
)
from schemas.tools import (
    FunctionCall,
    ServerToolTurn,
    ToolCall,
    ToolCalls,
    ToolUse,
    round_request_id,
)
from servertools.catalog import specs
from servertools.core import Outcome, next_round, results
from tests.support.chat import SseResult, post_message
from tests.support.server_tools import ANSWER, ask, calling, step

pytestmark = pytest.mark.timeout(120)

TOOLS = "tools"
PATIENT_STALL_S = 60.0
"""The stall timeout of the gateway the answers are read through: longer than a
restart of the tools stage (a SIGKILLed member's session runs out first)."""
STALL_S = 3.0
"""The stall timeout of the `impatient` gateway."""


@pytest_asyncio.fixture(scope="module")
async def pipeline(tmp_path_factory) -> Pipeline:
    settings = {**PIPELINE_SETTINGS, "stream_stall_s": PATIENT_STALL_S}
    async with running_pipeline(tmp_path_factory.mktemp("tools"), **settings) as pipe:
        for stage in ("scheduler", "safety", "recorder", TOOLS, "gateway"):
            await pipe.start(stage)
        await pipe.start("impatient", "gateway", stream_stall_s=STALL_S)
        await pipe.start("w1", "worker")
        await pipe.wait_for_workers("w1")
        await pipe.wait_for_gateway()
        await pipe.wait_for_gateway("impatient")
        yield pipe


async def test_a_round_waits_for_a_killed_tools_stage_and_ends_whole(pipeline):
    pipeline.kill(TOOLS)
    async with pipeline.http() as client:
        [cid] = await scenarios.conversations(client, 1)
        asked = asyncio.create_task(
            ask(client, cid, calling("calculator", {"expression": "(6 + 1) * 6"}))
        )
        await paused_round(pipeline, cid)
        assert await results_of(pipeline, cid) == [], "no tools stage ran the round"
        await pipeline.restart(TOOLS)
        result = await asyncio.wait_for(asked, 30)
    _call, answer = step(result)
    # It loads search_documents' embedding model at start, though no round searched.
    for _ in range(300):
        if "warmed up in" in pipeline.log_tail(TOOLS, 200):
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError(pipeline.log_tail(TOOLS, 40))
    assert json.loads(answer["content"]) == {"expression": "(6 + 1) * 6", "result": 42}
    assert result.text == ANSWER
    assert result.of("done")[-1].json()["status"] == "finished_stopped"


async def test_a_round_waiting_past_the_stall_timeout_ends_the_stream_in_error(pipeline):
    pipeline.kill(TOOLS)
    try:
        async with pipeline.http("impatient") as client:
            [cid] = await scenarios.conversations(client, 1)
            result = await asyncio.wait_for(stalled(client, cid), STALL_S + 15)
    finally:
        await pipeline.restart(TOOLS)
    kinds = [e.event for e in result.events if e.event != "request" and not e.is_done]
    assert kinds == ["tool_call", "error"], kinds
    assert result.of("error")[0].json()["code"] == "stalled"
    assert result.ended_with_done
    # The gateway cancelled the answer: its next round, queued once the tools stage is
    # back, ends at the scheduler, never handed to a worker, generating nothing.
    answer_id = result.request["request_id"]
    [done] = await pipeline.find(
        topics.TOKENS,
        TOKEN_EVENT,
        lambda e: isinstance(e, GenerationDone) and e.request_id == answer_id,
    )
    assert (done.attempt, done.status) == (1, RequestStatus.FINISHED_ABORTED)
    next_round = round_request_id(answer_id, 1)
    [unserved] = await pipeline.find(
        topics.WORK, WORK_EVENT, lambda e: isinstance(e, Unserved) and e.request_id == next_round
    )
    assert unserved.code == CANCELLED
    assert not await pipeline.find(
        topics.WORK,
        WORK_EVENT,
        lambda e: isinstance(e, WorkAssignment) and e.request.request_id == next_round,
        timeout_s=1.0,
    )
    assert not await pipeline.find(
        topics.TOKENS,
        TOKEN_EVENT,
        lambda e: isinstance(e, TokenChunk) and e.request_id == answer_id,
        timeout_s=1.0,
    )


async def test_a_round_the_bus_cannot_hand_on_ends_its_answer_and_is_dead_lettered(pipeline):
    """Published as a worker would: the calls on `chat.tokens`, then the round on
    `chat.tools`, a few bytes under the bus's limit, so its next round (the same turn
    with the call and its result appended) is over it."""
    tool_round = round_near_the_bus_limit(pipeline)
    request = tool_round.request
    answer_id = request.answer_id
    made = ToolCallsMade(**stream_fields(request, tool_round.seq), calls=tool_round.calls.calls)
    await pipeline.send(topics.TOKENS, made, key=request.conversation_id)
    await pipeline.send(topics.TOOLS, tool_round, key=request.conversation_id)

    [end] = await pipeline.find(
        topics.TOKENS,
        TOKEN_EVENT,
        lambda e: isinstance(e, GenerationError) and e.request_id == answer_id,
        timeout_s=30,
    )
    assert (end.code, end.message) == (PIPELINE_REJECTED, PIPELINE_REJECTED_MESSAGE)
    delivered = await pipeline.find(
        topics.ANSWERS,
        ANSWER_EVENT,
        lambda e: e.request_id == answer_id,
        count=3,
        timeout_s=30,
    )
    assert [type(e) for e in delivered] == [DeliveredToolCall, DeliveredToolResult, DeliveryError]
    result, error = delivered[1], delivered[2]
    assert json.loads(result.content) == {"expression": EXPRESSION, "result": 42}
    assert error.code == PIPELINE_REJECTED and error.seq > result.seq
    assert "MessageSize" not in error.message and "bytes" not in error.message
    [letter] = await pipeline.find(
        topics.DLQ,
        DeadLetter,
        lambda d: d.stage == TOOLS and answer_id in d.value,
        timeout_s=30,
    )
    assert letter.topic == topics.TOOLS and letter.truncated
    assert "RecordRejected" in letter.error and "MessageSizeTooLarge" in letter.error
    assert not await pipeline.find(
        topics.requests_topic(request.tier),
        GenerationRequest,
        lambda r: r.request_id == round_request_id(answer_id, 1),
        timeout_s=1.0,
    )

    # The stage goes on: the next turn's round runs, and its answer ends whole.
    async with pipeline.http() as client:
        [cid] = await scenarios.conversations(client, 1)
        served = await asyncio.wait_for(
            ask(client, cid, calling("calculator", {"expression": "(6 + 1) * 6"})), 30
        )
    _call, answer = step(served)
    assert json.loads(answer["content"]) == {"expression": "(6 + 1) * 6", "result": 42}
    assert served.text == ANSWER
    assert pipeline.stages[TOOLS].running


EXPRESSION = "0 + " * 45 + "42"
"""Echoed in the result: the next round carries it twice (call and result), the round once."""


def round_near_the_bus_limit(pipeline: Pipeline) -> ToolRound:
    """A calculator round whose record is a few bytes under the bus's limit, checked to
    make a next round over it."""
    limit = pipeline.kafka.producer()._max_request_size
    rid = f"req-{uuid.uuid4().hex[:8]}"
    arguments = json.dumps({"expression": EXPRESSION})
    calls = ToolCalls(
        calls=(
            ToolCall(id="call_0", function=FunctionCall(name="calculator", arguments=arguments)),
        )
    )

    def sized(padding: int) -> tuple[int, ToolRound]:
        request = GenerationRequest(
            request_id=rid,
            conversation_id=f"c-{uuid.uuid4().hex[:8]}",
            message_id=f"m-{rid}",
            user_id="u",
            org_id="o",
            tier="free",
            model="tiny-random",
            messages=(ChatMessage(role=Role.USER, content="x" * padding),),
            sampling=SamplingOptions(max_tokens=8),
            reply_to="chat.deliver.tools-fault",
            tool_use=ToolUse(tools=specs(["calculator"]), choice="auto"),
            server_tools=ServerToolTurn(answer_id=rid, max_rounds=2),
        )
        made = ToolRound(request=request, calls=calls, seq=0)
        return record_bytes(request.conversation_id, made), made

    size, _ = sized(0)
    size, near = sized(limit - size - 64)
    assert limit - 200 < size < limit
    answered = results(near, [Outcome(json.dumps({"expression": EXPRESSION, "result": 42}))])
    following = next_round(near, answered)
    assert record_bytes(following.conversation_id, following) > limit
    return near


def record_bytes(key: str, event: Event) -> int:
    return DefaultRecordBatchBuilder.estimate_size_in_bytes(
        key.encode(), encode(event), headers(event)
    )


async def stalled(client: httpx.AsyncClient, cid: str) -> SseResult:
    result = await post_message(
        client,
        cid,
        {
            "content": calling("calculator", {"expression": "1 + 1"}),
            "max_tokens": 64,
            "tool_choice": "auto",
        },
    )
    assert result.status == 200, result
    return result


async def paused_round(pipeline: Pipeline, conversation_id: str) -> ToolRound:
    """The conversation's round as its worker put it on `chat.tools`."""
    [paused] = await pipeline.find(
        topics.TOOLS, ToolRound, lambda r: r.request.conversation_id == conversation_id
    )
    return paused


async def results_of(pipeline: Pipeline, conversation_id: str) -> list[ToolResult]:
    """The conversation's tool results on `chat.tokens` so far."""
    return await pipeline.find(
        topics.TOKENS,
        TOKEN_EVENT,
        lambda e: isinstance(e, ToolResult) and e.conversation_id == conversation_id,
        timeout_s=1.0,
    )
