"""SimEngine: deterministic text, token rate, max_tokens, stop, abort and slots."""

from __future__ import annotations

import asyncio
import time

import pytest

from schemas.events import ChatMessage, GenerationRequest, Role, SamplingOptions
from schemas.lifecycle import RequestStatus
from tests.support.chat import until
from workers.engine import EngineOutput, EngineStats
from workers.sim_engine import SimEngine, SimEngineFailure, StepClock, plan_reply


def make_request(
    request_id: str = "req-1", text: str = "hello there", **sampling: object
) -> GenerationRequest:
    return GenerationRequest(
        request_id=request_id,
        conversation_id="conv-1",
        message_id="msg-1",
        user_id="user-1",
        org_id="org-1",
        tier="pro",
        model="sim",
        messages=(
            ChatMessage(role=Role.SYSTEM, content="be brief"),
            ChatMessage(role=Role.USER, content=text),
        ),
        sampling=SamplingOptions(**sampling),
        reply_to="chat.deliver.gw-1",
    )


def make_engine(max_slots: int = 4, tokens_per_s: float = 2000.0) -> SimEngine:
    return SimEngine("sim", max_slots, tokens_per_s=tokens_per_s, prompt_tokens_per_s=1e6)


async def collect(engine: SimEngine, request: GenerationRequest) -> list[EngineOutput]:
    return [out async for out in engine.generate(request)]


def text_of(outputs: list[EngineOutput]) -> str:
    return "".join(out.text for out in outputs)


async def wait_until(condition) -> None:
    await until(condition, timeout_s=5.0, interval_s=0.001)


async def test_same_request_gives_same_text_and_other_requests_differ():
    first = await collect(make_engine(), make_request("req-1"))
    again = await collect(make_engine(), make_request("req-1"))
    other_id = await collect(make_engine(), make_request("req-2"))
    other_text = await collect(make_engine(), make_request("req-1", text="something else"))

    assert text_of(first) == text_of(again) != ""
    assert text_of(first) != text_of(other_id)
    assert text_of(first) != text_of(other_text)
    assert text_of(first) == "".join(plan_reply(make_request("req-1")).tokens)


async def test_stream_counts_tokens_and_ends_with_one_terminal_status():
    outputs = await collect(make_engine(), make_request(max_tokens=30, ignore_eos=True))

    assert [out.status for out in outputs[:-1]] == [None] * (len(outputs) - 1)
    assert outputs[-1].status is RequestStatus.FINISHED_LENGTH
    assert outputs[-1].completion_tokens == sum(out.new_tokens for out in outputs) == 30
    assert len(text_of(outputs).split()) == 30
    assert all(out.prompt_tokens == 4 and out.cached_tokens == 0 for out in outputs)


@pytest.mark.parametrize(
    ("length", "max_tokens", "tokens", "status"),
    [
        (50, 10, 10, RequestStatus.FINISHED_LENGTH),
        (5, 10, 5, RequestStatus.FINISHED_STOPPED),
        (10, 10, 10, RequestStatus.FINISHED_STOPPED),
    ],
)
async def test_max_tokens_cuts_a_longer_reply(length, max_tokens, tokens, status):
    request = make_request(text=f"hi [[sim:length={length}]]", max_tokens=max_tokens)

    outputs = await collect(make_engine(), request)

    assert outputs[-1].completion_tokens == tokens
    assert outputs[-1].status is status


async def test_scripted_reply_and_stop_string():
    scripted = make_request(text="[[sim:reply=Hello brave new world]]")
    stopped = make_request(text="[[sim:reply=Hello brave new world]]", stop=("new",))

    assert text_of(await collect(make_engine(), scripted)) == "Hello brave new world"
    outputs = await collect(make_engine(), stopped)
    assert text_of(outputs) == "Hello brave "
    assert outputs[-1].status is RequestStatus.FINISHED_STOPPED


async def test_scripted_failure_raises():
    with pytest.raises(SimEngineFailure):
        await collect(make_engine(), make_request(text="[[sim:fail]]"))


async def test_tokens_come_no_faster_than_the_rate():
    engine = make_engine(tokens_per_s=200.0)
    started = time.monotonic()
    stamps: list[tuple[float, int]] = []
    async for out in engine.generate(make_request(max_tokens=40, ignore_eos=True)):
        stamps.append((time.monotonic() - started, out.completion_tokens))

    # token i is due at i / rate: 40 tokens take at least 39 / 200 s
    assert stamps[-1][1] == 40
    assert all(count <= 1 + elapsed * 200.0 + 1e-6 for elapsed, count in stamps)
    assert stamps[-1][0] >= 39 / 200.0
    assert stamps[-1][0] < 5.0


async def test_abort_ends_the_stream_at_once_with_an_accurate_count():
    engine = make_engine(tokens_per_s=500.0)
    outputs: list[EngineOutput] = []
    async for out in engine.generate(make_request(max_tokens=5000, ignore_eos=True)):
        outputs.append(out)
        if len(outputs) == 3:
            await engine.abort("req-1")

    assert len(outputs) == 4
    assert outputs[-1].status is RequestStatus.FINISHED_ABORTED
    assert outputs[-1].new_tokens == 0
    assert outputs[-1].completion_tokens == sum(out.new_tokens for out in outputs) < 100
    assert engine.stats().running == 0


async def test_extra_requests_wait_for_a_slot_and_can_be_aborted_while_waiting():
    engine = make_engine(max_slots=2, tokens_per_s=100.0)
    requests = [make_request(f"req-{i}", max_tokens=10_000, ignore_eos=True) for i in range(4)]
    tasks = [asyncio.create_task(collect(engine, request)) for request in requests]
    await wait_until(lambda: engine.stats() == EngineStats(running=2, waiting=2))

    await engine.abort("req-2")
    await engine.abort("req-3")
    waiting = await asyncio.wait_for(asyncio.gather(tasks[2], tasks[3]), timeout=5)
    assert engine.stats() == EngineStats(running=2, waiting=0)

    await engine.abort("req-0")
    await engine.abort("req-1")
    running = await asyncio.wait_for(asyncio.gather(tasks[0], tasks[1]), timeout=5)

    assert [len(outputs) for outputs in waiting] == [1, 1]
    assert all(outputs[-1].completion_tokens == 0 for outputs in waiting)
    assert all(o[-1].status is RequestStatus.FINISHED_ABORTED for o in waiting + running)
    assert engine.peak_running == 2
    assert engine.stats() == EngineStats(running=0, waiting=0)


async def test_a_freed_slot_goes_to_a_waiting_request():
    engine = make_engine(max_slots=1, tokens_per_s=5000.0)

    requests = [make_request(f"req-{i}", max_tokens=20, ignore_eos=True) for i in range(3)]

    results = await asyncio.gather(*(collect(engine, request) for request in requests))

    assert engine.peak_running == 1
    assert [r[-1].completion_tokens for r in results] == [20, 20, 20]
    assert engine.stats().waiting == 0


async def test_a_waiter_cancelled_mid_step_leaves_the_others_waiting_for_it():
    # What a preempted or handed-back request does: its task is cancelled while every
    # running request waits on the same step.
    steps = StepClock(0.01)
    steps.join()
    steps.join()
    kept = asyncio.create_task(steps.next())
    gone = asyncio.create_task(steps.next())
    await asyncio.sleep(0)  # both wait on the step
    gone.cancel()
    await asyncio.wait_for(kept, 1)  # the step still comes for the other
    assert kept.done() and not kept.cancelled()
