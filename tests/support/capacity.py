"""A sim pipeline on the embedded broker, and chats that load it."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator

import httpx

from chatpipe.dev_stack import stack_settings
from chatpipe.wiring import Stack, running_stack
from conversations.store import ApiKey
from schemas.sse import SSEMessage
from schemas.topics import Tier
from tests.support.chat import read_sse
from workers.sim_engine import SimEngine

TOKENS_PER_S = 40.0


@contextlib.asynccontextmanager
async def sim_pipeline(tmp_path, slots: int, **overrides: object) -> AsyncIterator[Stack]:
    # No generated titles: their free-tier requests would join the queues measured here.
    settings = stack_settings(
        tmp_path,
        engine="sim",
        max_slots=slots,
        auto_titles=False,
        sim_tokens_per_s=TOKENS_PER_S,
        **overrides,
    )
    engine = SimEngine(settings.inference.model_name, slots, TOKENS_PER_S, 1e6)
    async with running_stack(settings, engine) as stack:
        for tier in Tier:
            for user in ("a", "b", "c"):
                await stack.store.add_api_key(
                    f"{tier}-{user}", ApiKey(f"{tier}-{user}", f"org-{tier}", tier)
                )
        yield stack


class Chat:
    """One user's HTTP client on the native API."""

    def __init__(self, stack: Stack, key: str) -> None:
        self.client = httpx.AsyncClient(
            base_url=stack.base_url, timeout=120, headers={"Authorization": f"Bearer {key}"}
        )

    async def ask(
        self,
        content: str,
        max_tokens: int,
        until: str | None = None,
    ) -> tuple[float, list[SSEMessage]]:
        """Returns (seconds from sending to the first delta, events)."""
        conversation = (await self.client.post("/v1/conversations", json={})).json()
        started = time.monotonic()
        async with self.client.stream(
            "POST",
            f"/v1/conversations/{conversation['conversation_id']}/messages",
            json={"content": content, "max_tokens": max_tokens, "ignore_eos": True},
        ) as response:
            assert response.status_code == 200, await response.aread()
            events = await read_sse(response, stop=(lambda e: e.event == until) if until else None)
        deltas = [e for e in events if e.event == "delta"]
        return (deltas[0].at - started if deltas else float("inf")), events

    async def aclose(self) -> None:
        await self.client.aclose()
