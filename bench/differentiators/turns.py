"""Native turns read to their end with every event kept (`queued` and `retract`
included), each stamped with its arrival time."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from schemas.sse import SSEMessage, read_messages


@dataclass
class Turn:
    """One native answer as the client saw it. `sent_at` and every event's `at` are
    `time.monotonic()`; `wall_offset` turns them into epoch seconds."""

    status: int = 0
    sent_at: float = 0.0
    wall_offset: float = field(default_factory=lambda: time.time() - time.monotonic())
    events: list[SSEMessage] = field(default_factory=list)

    @property
    def request_id(self) -> str | None:
        first = self.first("request")
        return None if first is None else str(first.json()["request_id"])

    def first(self, event: str) -> SSEMessage | None:
        return next((m for m in self.events if m.event == event), None)

    def wall(self, at: float) -> float:
        return at + self.wall_offset


async def native_turn(client: httpx.AsyncClient, body: dict[str, Any]) -> Turn:
    """A new conversation, one message posted, its answer read to `[DONE]`."""
    created = await client.post("/v1/conversations", json={})
    created.raise_for_status()
    path = f"/v1/conversations/{created.json()['conversation_id']}/messages"
    turn = Turn(sent_at=time.monotonic())
    async with client.stream("POST", path, json=body) as response:
        turn.status = response.status_code
        if response.status_code == 200:
            turn.events = await read_messages(response.aiter_lines())
    return turn
