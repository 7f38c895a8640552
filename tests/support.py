"""Test helpers: an SSE reader over a real HTTP client and a topic reader."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import orjson
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition
from pydantic import BaseModel, TypeAdapter

from bus.clients import KafkaConfig
from schemas.codec import EventDecodeError, decode

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
            value = value[1:] if value.startswith(" ") else value
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
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap_servers,
                                enable_auto_commit=False, fetch_max_wait_ms=20)
    await consumer.start()
    try:
        partitions = await _partitions(consumer, topic)
        consumer.assign(partitions)
        for tp in partitions:
            consumer.seek(tp, 0)
        found: list[Any] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(found) < count:
            batch = await consumer.getmany(timeout_ms=200)
            for records in batch.values():
                for record in records:
                    try:
                        event = decode(kind, record.value)
                    except EventDecodeError:
                        continue
                    if match(event):
                        found.append(event)
        return found[:count]
    finally:
        await consumer.stop()


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> list[TopicPartition]:
    for _ in range(50):
        await consumer.topics()
        partitions = consumer.partitions_for_topic(topic)
        if partitions:
            return [TopicPartition(topic, p) for p in sorted(partitions)]
        await asyncio.sleep(0.1)
    raise AssertionError(f"topic {topic} not found")
