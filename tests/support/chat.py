"""Test helpers: a native answer stream read whole (`post_message`, `SseResult`), a
minimal generation request (`generation_request`), a condition awaited (`until`)."""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from schemas.events import ChatMessage, GenerationRequest, Role
from schemas.sse import SSEMessage, read_messages


@dataclass
class SseResult:
    status: int
    events: list[SSEMessage] = field(default_factory=list)

    def of(self, kind: str) -> list[SSEMessage]:
        return [e for e in self.events if e.event == kind]

    @property
    def text(self) -> str:
        return "".join(e.json()["delta"] for e in self.of("delta"))

    @property
    def request(self) -> dict[str, Any]:
        return self.of("request")[0].json()

    @property
    def ended_with_done(self) -> bool:
        return bool(self.events) and self.events[-1].is_done


async def read_sse(
    response: httpx.Response,
    stop: Callable[[SSEMessage], bool] | None = None,
) -> list[SSEMessage]:
    """The response's messages as they arrive (`schemas.sse.read_messages`)."""
    return await read_messages(response.aiter_lines(), stop)


async def post_message(
    client: httpx.AsyncClient,
    conversation_id: str,
    body: dict[str, Any],
) -> SseResult:
    async with client.stream(
        "POST", f"/v1/conversations/{conversation_id}/messages", json=body
    ) as response:
        if response.status_code != 200:
            await response.aread()
            return SseResult(response.status_code)
        return SseResult(200, await read_sse(response))


def generation_request(reply_to: str) -> GenerationRequest:
    """A one-message request of a fresh id, answered on `reply_to`."""
    return GenerationRequest(
        request_id=f"r-{uuid.uuid4().hex[:8]}",
        conversation_id="c",
        message_id="m",
        user_id="u",
        org_id="o",
        tier="free",
        model="tiny-random",
        reply_to=reply_to,
        messages=(ChatMessage(role=Role.USER, content="hello"),),
    )


async def until(
    condition: Callable[[], object], timeout_s: float | None = 30.0, interval_s: float = 0.1
) -> None:
    """Until `condition()` holds (its result awaited when it is awaitable), checked every
    `interval_s`; TimeoutError after `timeout_s` (never with None)."""
    async with asyncio.timeout(timeout_s):
        while not await _value(condition()):  # noqa: ASYNC110 polls state no event announces
            await asyncio.sleep(interval_s)


async def _value(result: object) -> object:
    return await result if inspect.isawaitable(result) else result
