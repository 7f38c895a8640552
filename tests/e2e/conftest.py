"""A slow pipeline for the client tests: one engine slot at 25 tokens a second, so an
answer visibly streams and a second request has to queue behind the first."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest_asyncio

from chatpipe.dev_stack import stack_settings
from chatpipe.wiring import Stack, running_stack
from schemas.sse import read_messages
from tests.support.chat import post_message
from tests.support.stack import client_for
from workers.sim_engine import SimEngine

SLOW_TOKENS_PER_S = 25.0


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def slow_stack(tmp_path_factory) -> AsyncIterator[Stack]:
    # No generated titles: they would take the only slot between the tests' requests.
    settings = stack_settings(
        tmp_path_factory.mktemp("slow-stack"),
        engine="sim",
        sim_tokens_per_s=SLOW_TOKENS_PER_S,
        max_slots=1,
        auto_titles=False,
    )
    engine = SimEngine(settings.inference.model_name, 1, SLOW_TOKENS_PER_S, 1e6)
    async with running_stack(settings, engine) as stack:
        await _first_answer(stack)
        yield stack


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def warm_stacks(sim_stack, slow_stack) -> None:
    """Both stacks past their first answer, for tests that time what they see."""
    await _first_answer(sim_stack)


async def _first_answer(stack: Stack) -> None:
    """One answer: the first turn waits for the gateway to load its tokenizers (tens of
    seconds on 2 cores once torch is imported), which tests that time what they see
    must not."""
    async with client_for(stack) as client:
        cid = (await client.post("/v1/conversations", json={})).json()["conversation_id"]
        result = await post_message(client, cid, {"content": "[[sim:reply=ready]]"})
    assert result.text == "ready", result


class BusySlot:
    """Holds the slow stack's only slot with a long answer until released."""

    def __init__(self, stack: Stack) -> None:
        self._stack = stack
        self._task: asyncio.Task[None] | None = None

    async def occupy(self) -> None:
        """Returns once the long answer is running (its first delta arrived)."""
        running = asyncio.Event()
        self._task = asyncio.create_task(self._hold(running))
        waiter = asyncio.create_task(running.wait())
        await asyncio.wait([self._task, waiter], timeout=60, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if self._task.done():
            self._task.result()
        assert running.is_set(), "the long answer did not start"

    async def _hold(self, running: asyncio.Event) -> None:
        async with client_for(self._stack) as client:
            cid = (await client.post("/v1/conversations", json={})).json()["conversation_id"]
            body = {"content": "[[sim:length=2000]]", "max_tokens": 2000}
            async with client.stream(
                "POST", f"/v1/conversations/{cid}/messages", json=body
            ) as response:
                assert response.status_code == 200, await response.aread()
                lines = response.aiter_lines()
                events = await read_messages(lines, stop=lambda e: e.event == "delta")
                assert events and events[-1].event == "delta", events
                running.set()
                async for _ in lines:  # keep reading: a client that stops reading is let go
                    pass

    async def release(self) -> None:
        """Drop the long answer's connection: the gateway cancels it and frees the slot."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


@pytest_asyncio.fixture(loop_scope="session")
async def busy_slot(slow_stack) -> AsyncIterator[BusySlot]:
    slot = BusySlot(slow_stack)
    try:
        yield slot
    finally:
        await slot.release()
