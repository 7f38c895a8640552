"""Test helpers: a native answer stream read whole (`post_message`, `SseResult`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

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


async def read_sse(response: httpx.Response, stop: Callable[[SSEMessage], bool] | None = None,
                   ) -> list[SSEMessage]:
    """The response's messages as they arrive (`schemas.sse.read_messages`)."""
    return await read_messages(response.aiter_lines(), stop)


async def post_message(client: httpx.AsyncClient, conversation_id: str, body: dict[str, Any],
                       ) -> SseResult:
    async with client.stream("POST", f"/v1/conversations/{conversation_id}/messages",
                             json=body) as response:
        if response.status_code != 200:
            await response.aread()
            return SseResult(response.status_code)
        return SseResult(200, await read_sse(response))
