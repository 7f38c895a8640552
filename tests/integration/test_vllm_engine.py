"""VllmEngine against real vLLM serving the tiny random-weight model."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from schemas.events import ChatMessage, GenerationRequest, Role, SamplingOptions
from schemas.lifecycle import RequestStatus
from workers.engine import Continuation, EngineOutput

pytestmark = pytest.mark.vllm

# vLLM's CPU backend caches prefixes in blocks of 128 tokens and only full blocks
# can be hit, so cache tests need a prompt of a few hundred tokens (~400 here).
LONG_SYSTEM_PROMPT = " ".join(f"Rule {i}: answer politely and briefly." for i in range(20))


def make_request(
    text: str = "Hello, who are you?",
    *,
    system: str | None = None,
    cache_salt: str | None = None,
    **sampling: object,
) -> GenerationRequest:
    messages = [ChatMessage(role=Role.USER, content=text)]
    if system is not None:
        messages.insert(0, ChatMessage(role=Role.SYSTEM, content=system))
    return GenerationRequest(
        request_id=f"req-{uuid.uuid4().hex[:8]}",
        conversation_id="conv-1",
        message_id="msg-1",
        user_id="user-1",
        org_id="org-1",
        tier="pro",
        model="tiny-random",
        messages=tuple(messages),
        sampling=SamplingOptions(**{"temperature": 0.0, **sampling}),
        reply_to="chat.deliver.gw-1",
        cache_salt=cache_salt,
    )


async def collect(engine, request: GenerationRequest) -> list[EngineOutput]:
    return [out async for out in engine.generate(request)]


def unique_system_prompt() -> str:
    """A long system prompt no other test has sent, so no earlier cache entry matches."""
    return f"Session {uuid.uuid4().hex}. {LONG_SYSTEM_PROMPT}"


async def test_a_request_streams_deltas_and_ends_with_a_terminal_status(vllm_engine):
    outputs = await collect(vllm_engine, make_request(max_tokens=16))

    final = outputs[-1]
    assert final.status in {RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH}
    assert all(out.status is None for out in outputs[:-1])
    assert final.completion_tokens == sum(out.new_tokens for out in outputs) <= 16
    assert [out.completion_tokens for out in outputs] == sorted(
        out.completion_tokens for out in outputs
    )
    assert final.prompt_tokens > 5
    assert all(out.prompt_tokens == final.prompt_tokens for out in outputs)


async def test_max_tokens_is_honoured_with_ignore_eos(vllm_engine):
    outputs = await collect(vllm_engine, make_request(max_tokens=40, ignore_eos=True))

    assert outputs[-1].status is RequestStatus.FINISHED_LENGTH
    assert outputs[-1].completion_tokens == sum(out.new_tokens for out in outputs) == 40
    assert len(outputs) > 1, "output should stream, not arrive in one piece"
    assert "".join(out.text for out in outputs)


async def test_same_seed_gives_the_same_text(vllm_engine):
    def request():
        return make_request(max_tokens=20, ignore_eos=True, temperature=1.0, seed=7)

    first, second = await collect(vllm_engine, request()), await collect(vllm_engine, request())

    assert "".join(o.text for o in first) == "".join(o.text for o in second)


async def test_a_continuation_goes_on_as_the_uninterrupted_answer(vllm_engine):
    """Greedy decoding: an answer continued after its first tokens (its worker died
    there) is the answer an uninterrupted run gives, token for token."""
    request = make_request(max_tokens=40, ignore_eos=True)
    whole = await collect(vllm_engine, request)
    head = [out for out in whole if out.completion_tokens <= 17]
    head_ids = tuple(token for out in head for token in out.token_ids)
    continued = Continuation("".join(out.text for out in head), len(head_ids), head_ids)
    rest = [out async for out in vllm_engine.generate(request, continued)]

    assert len(head_ids) == head[-1].completion_tokens
    assert continued.text + "".join(out.text for out in rest) == "".join(o.text for o in whole)
    assert [t for o in rest for t in o.token_ids] == [t for o in whole for t in o.token_ids][
        len(head_ids) :
    ]
    assert rest[-1].completion_tokens == 40 and rest[-1].status is RequestStatus.FINISHED_LENGTH
    assert rest[-1].prompt_tokens == whole[-1].prompt_tokens, "the answer so far is not prompt"


async def test_concurrent_requests_run_in_one_batch(vllm_engine):
    seen_running: list[int] = []

    async def run(i: int) -> list[EngineOutput]:
        outputs = []
        request = make_request(f"question {i}", max_tokens=48, ignore_eos=True)
        async for out in vllm_engine.generate(request):
            seen_running.append(vllm_engine.stats().running)
            outputs.append(out)
        return outputs

    results = await asyncio.gather(*(run(i) for i in range(8)))

    assert [r[-1].completion_tokens for r in results] == [48] * 8
    assert max(seen_running) >= 8, "the scheduler never ran all 8 requests in one step"
    assert vllm_engine.peak_running >= 8
    assert vllm_engine.stats().running == vllm_engine.stats().waiting == 0


async def test_abort_ends_the_stream_within_one_step(vllm_engine):
    request = make_request(max_tokens=1500, ignore_eos=True)
    outputs: list[EngineOutput] = []
    outputs_after_abort = 0

    async for out in vllm_engine.generate(request):
        outputs.append(out)
        if len(outputs) == 3:
            await vllm_engine.abort(request.request_id)
        elif len(outputs) > 3:
            outputs_after_abort += 1

    assert outputs_after_abort == 1
    assert outputs[-1].status is RequestStatus.FINISHED_ABORTED
    assert outputs[-1].completion_tokens == sum(out.new_tokens for out in outputs) < 100
    assert vllm_engine.stats().running == 0


async def test_abort_of_an_unknown_request_is_harmless(vllm_engine):
    await vllm_engine.abort("no-such-request")

    outputs = await collect(vllm_engine, make_request(max_tokens=4, ignore_eos=True))
    assert outputs[-1].status is RequestStatus.FINISHED_LENGTH


async def test_the_same_prompt_twice_hits_the_prefix_cache(vllm_engine):
    system = unique_system_prompt()

    first = await collect(vllm_engine, make_request(system=system, max_tokens=4))
    second = await collect(vllm_engine, make_request(system=system, max_tokens=4))

    assert first[-1].prompt_tokens > 256
    assert first[-1].cached_tokens == 0
    assert second[-1].cached_tokens >= 128


async def test_a_different_cache_salt_gets_no_cache_hit(vllm_engine):
    system = unique_system_prompt()

    def request(salt: str) -> GenerationRequest:
        return make_request(system=system, cache_salt=salt, max_tokens=4)

    first = await collect(vllm_engine, request("org-a"))
    same = await collect(vllm_engine, request("org-a"))
    other = await collect(vllm_engine, request("org-b"))

    assert first[-1].cached_tokens == 0
    assert same[-1].cached_tokens >= 128
    assert other[-1].cached_tokens == 0


async def test_stats_report_free_kv_blocks(vllm_engine):
    stats = vllm_engine.stats()

    assert stats.free_kv_blocks is not None and stats.free_kv_blocks > 0
