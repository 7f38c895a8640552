"""Rate limits and quotas read over HTTP."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from gateway.config import RequestLimits
from ledger.charges import Account
from ledger.periods import period_of
from ledger.store import SQLiteLedger
from tests.support.chat import read_sse


async def clear_of_minute_edge(margin_s: float = 8.0) -> None:
    """Memory windows turn over on the minute: keep a short test inside one minute."""
    into_minute = time.time() % 60
    if into_minute > 60 - margin_s:
        await asyncio.sleep(60 - into_minute + 0.1)


async def native_turn(
    client: httpx.AsyncClient, body: dict[str, Any], conversation_id: str | None = None
) -> tuple[httpx.Response, list]:
    """POST a native turn; the response (headers) and, when admitted, its SSE events."""
    if conversation_id is None:
        created = await client.post("/v1/conversations", json={})
        conversation_id = created.json()["conversation_id"]
    url = f"/v1/conversations/{conversation_id}/messages"
    async with client.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            await response.aread()
            return response, []
        return response, await read_sse(response)


def error_of(response: httpx.Response) -> dict[str, Any]:
    assert response.status_code == 429, response.text
    return response.json()["error"]


async def until_used(
    ledger: SQLiteLedger, account: Account, at_least: int, timeout_s: float = 30.0
) -> int:
    window = period_of(time.time(), "day")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        used = (await ledger.used([account], "day", window.key))[account]
        if used >= at_least:
            return used
        await asyncio.sleep(0.1)
    raise AssertionError(f"{account} never reached {at_least} tokens in the ledger")


def small_limits(**overrides: Any) -> RequestLimits:
    """Request limits small enough for a unit test to reach each one: one model
    (`tiny-random`), short messages and stop lists, at most 100 tokens."""
    fields: dict[str, Any] = {
        "models": ("tiny-random",),
        "default_model": "tiny-random",
        "tier_models": {},
        "max_message_chars": 1000,
        "max_messages": 10,
        "max_stop_sequences": 4,
        "max_stop_chars": 8,
        "max_tokens_limit": 100,
        "default_max_tokens": 10,
    }
    return RequestLimits(**(fields | overrides))
