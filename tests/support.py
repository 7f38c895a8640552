"""Test helpers: an SSE reader over a real HTTP client and a topic reader."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import orjson
from pydantic import BaseModel, TypeAdapter

from bus.clients import KafkaConfig
from bus.replay import replay

E = TypeVar("E", bound=BaseModel)


@dataclass
class SseEvent:
    event: str
    data: str
    id: str | None
    at: float

    def json(self) -> Any:
        return orjson.loads(self.data)


@dataclass
class SseResult:
    status: int
    events: list[SseEvent] = field(default_factory=list)

    def of(self, kind: str) -> list[SseEvent]:
        return [e for e in self.events if e.event == kind]

    @property
    def text(self) -> str:
        return "".join(e.json()["delta"] for e in self.of("delta"))

    @property
    def request(self) -> dict[str, Any]:
        return self.of("request")[0].json()

    @property
    def ended_with_done(self) -> bool:
        return bool(self.events) and self.events[-1].data == "[DONE]"


async def read_sse(response: httpx.Response, stop: Callable[[SseEvent], bool] | None = None,
                   ) -> list[SseEvent]:
    """Parse an SSE body line by line (per the SSE spec: blank line ends an event)."""
    return await read_sse_lines(response.aiter_lines(), stop)


async def read_sse_lines(lines: AsyncIterator[str],
                         stop: Callable[[SseEvent], bool] | None = None) -> list[SseEvent]:
    """Like `read_sse` on a line iterator that can be read again after a `stop`."""
    events: list[SseEvent] = []
    kind, data, event_id = "message", [], None
    async for line in lines:
        if line == "":
            if data:
                events.append(SseEvent(kind, "\n".join(data), event_id, time.monotonic()))
                if stop is not None and stop(events[-1]):
                    return events
            kind, data, event_id = "message", [], None
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                kind = value
            elif name == "data":
                data.append(value)
            elif name == "id":
                event_id = value
    return events


async def post_message(client: httpx.AsyncClient, conversation_id: str, body: dict[str, Any],
                       ) -> SseResult:
    async with client.stream("POST", f"/v1/conversations/{conversation_id}/messages",
                             json=body) as response:
        if response.status_code != 200:
            await response.aread()
            return SseResult(response.status_code)
        return SseResult(200, await read_sse(response))


async def find_events(
    kafka: KafkaConfig,
    topic: str,
    kind: type[E] | TypeAdapter[Any],
    match: Callable[[Any], bool],
    count: int = 1,
    timeout_s: float = 30.0,
) -> list[Any]:
    """Read `topic` from the start until `count` decodable events satisfy `match`."""
    found: list[Any] = []
    async with aclosing(replay(kafka.bootstrap_servers, topic, kind, timeout_s)) as events:
        async for _, event in events:
            if match(event):
                found.append(event)
                if len(found) == count:
                    break
    return found


