"""The scheduler's slots for a vLLM worker are what its engine runs: vLLM's resolved
`max_num_seqs`, by default vLLM's own, else CHATPIPE_VLLM_ARGS's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from bench.topic_log import find_events
from chatpipe.dev_stack import running_engine_stack, stack_settings
from chatpipe.wiring import Stack, build_engine
from schemas import topics
from schemas.events import WorkerHeartbeat
from tests.support.chat import post_message
from tests.support.stack import client_for

pytestmark = pytest.mark.vllm

FEW_SLOTS = 5


async def heartbeats(stack: Stack, count: int = 1) -> list[WorkerHeartbeat]:
    return await find_events(
        stack.kafka,
        topics.WORKERS,
        WorkerHeartbeat,
        lambda h: h.worker_id == stack.settings.worker.worker_id,
        count=count,
    )


async def test_by_default_a_worker_offers_the_slots_vllm_chose(vllm_stack, vllm_engine) -> None:
    assert "max_num_seqs" not in vllm_engine.engine_args()  # left to vLLM
    resolved = vllm_engine.vllm_config.scheduler_config.max_num_seqs

    [heartbeat] = await heartbeats(vllm_stack)

    assert heartbeat.max_slots == vllm_engine.max_slots == resolved
    print(f"\nvLLM's default max_num_seqs here: {resolved}")


@pytest_asyncio.fixture(loop_scope="session")
async def few_slots_stack(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Stack]:
    """A second engine, configured as a user would: CHATPIPE_VLLM_ARGS (eager and a
    small cache, as it only has to start soon beside the session's engine)."""
    monkeypatch.setenv(
        "CHATPIPE_VLLM_ARGS",
        f'{{"max_num_seqs": {FEW_SLOTS}, "enforce_eager":'
        f' true, "kv_cache_memory_bytes": {256 << 20}}}',
    )
    settings = stack_settings(tmp_path, engine="vllm", model=tiny_model_dir)
    async with running_engine_stack(settings, build_engine(settings)) as stack:
        yield stack


async def test_vllm_args_set_the_slots_the_scheduler_fills(few_slots_stack: Stack) -> None:
    async with client_for(few_slots_stack) as client:
        conversations = [
            (await client.post("/v1/conversations", json={})).json()["conversation_id"]
            for _ in range(FEW_SLOTS + 3)
        ]
        results = await asyncio.gather(
            *(
                post_message(
                    client, cid, {"content": f"question {i}", "max_tokens": 24, "ignore_eos": True}
                )
                for i, cid in enumerate(conversations)
            )
        )
    assert all(r.ended_with_done for r in results)

    beats = await heartbeats(few_slots_stack, count=2)
    assert {h.max_slots for h in beats} == {FEW_SLOTS}
    assert few_slots_stack.engine.vllm_config.scheduler_config.max_num_seqs == FEW_SLOTS
    assert few_slots_stack.engine.peak_running <= FEW_SLOTS
