"""The one streaming client both sides are driven with.

A deliberately small HTTP/1.0 client for `POST /v1/chat/completions` with
`stream=true`: HTTP/1.0 makes the server frame the body by closing the
connection, so the raw bytes are the SSE stream and parsing costs little. The
client shares two cores with the server under test, so it must stay cheap, and
it costs both sides the same per event.

Every SSE event is stamped with the time the read that carried it returned; the events
are parsed by the one client-side reader, `schemas.sse.SSEReader`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from schemas.sse import SSEMessage, SSEReader


@dataclass(frozen=True)
class Target:
    """A server speaking the OpenAI chat API."""

    name: str
    port: int
    api_key: str
    model: str
    host: str = "127.0.0.1"


@dataclass
class StreamRecord:
    """What one streamed request looked like from the client."""

    started: float
    """perf_counter() when the request was sent; every time below is on that clock."""
    wall_started: float = 0.0
    """time.time() when the request was sent (to compare with Kafka record timestamps)."""
    status: int = 0
    request_id: str | None = None
    times: list[float] = field(default_factory=list)
    """Arrival time of every chunk carrying content."""
    texts: list[str] = field(default_factory=list)
    reported_tokens: list[int] = field(default_factory=list)
    """Cumulative completion tokens the server reported with each content chunk
    (vLLM's `continuous_usage_stats`); empty when the server does not report them."""
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    error: str | None = None
    done: bool = False
    disconnected: bool = False
    ended: float = 0.0

    @property
    def completed(self) -> bool:
        return self.done and self.error is None and self.usage is not None

    def wall(self, at: float) -> float:
        """`at` (perf_counter) as epoch seconds."""
        return self.wall_started + (at - self.started)

    @property
    def ttft(self) -> float | None:
        return self.times[0] - self.started if self.times else None


def chat_body(model: str, prompt: str, max_tokens: int) -> bytes:
    """The request every benchmark sends: fixed prompt, fixed length (ignore_eos)."""
    return conversation_body(model, [{"role": "user", "content": prompt}], max_tokens)


def conversation_body(model: str, messages: Sequence[dict[str, str]], max_tokens: int) -> bytes:
    """A streamed chat request over `messages`, of a fixed length (ignore_eos)."""
    return orjson.dumps(
        {
            "model": model,
            "messages": list(messages),
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 1.0,
            "top_p": 1.0,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
    )


async def stream_chat(
    target: Target, body: bytes, disconnect_after: int | None = None, timeout_s: float = 300
) -> StreamRecord:
    """Stream one completion; with `disconnect_after`, hang up after that many content chunks."""
    record = StreamRecord(started=time.perf_counter(), wall_started=time.time())
    try:
        async with asyncio.timeout(timeout_s):
            await _exchange(
                target, "/v1/chat/completions", body, record, _on_event, disconnect_after
            )
    except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    record.ended = time.perf_counter()
    return record


async def _exchange(
    target: Target,
    path: str,
    body: bytes,
    record: StreamRecord,
    on_event: Callable[[StreamRecord, SSEMessage, float], None],
    disconnect_after: int | None = None,
) -> None:
    """One streamed request: every SSE event to `on_event` with the time its read
    returned; hangs up after `disconnect_after` content chunks."""
    reader, writer = await asyncio.open_connection(target.host, target.port)
    try:
        writer.write(_head(target, path, len(body), "text/event-stream") + body)
        head = await reader.readuntil(b"\r\n\r\n")
        record.status = int(head.split(b" ", 2)[1])
        if record.status != 200:
            record.error = f"HTTP {record.status}: {(await reader.read())[:300]!r}"
            return
        events = SSEReader()
        while not record.done:
            data = await reader.read(1 << 16)
            if not data:
                break
            now = time.perf_counter()
            for event in events.feed_bytes(data):
                on_event(record, event, now)
            if disconnect_after is not None and len(record.times) >= disconnect_after:
                record.disconnected = True
                return
        if not record.done and record.error is None:
            record.error = "stream ended without [DONE]"
    finally:
        writer.close()


def _on_event(record: StreamRecord, event: SSEMessage, now: float) -> None:
    if event.is_done:
        record.done = True
    else:
        _on_chunk(record, event.json(), now)


def _on_chunk(record: StreamRecord, chunk: dict[str, Any], now: float) -> None:
    if "error" in chunk:
        record.error = str(chunk["error"])
        return
    if record.request_id is None and "id" in chunk:
        record.request_id = str(chunk["id"]).removeprefix("chatcmpl-")
    usage = chunk.get("usage")
    choices = chunk.get("choices") or []
    if not choices:
        record.usage = usage or record.usage
        return
    choice = choices[0]
    record.finish_reason = choice.get("finish_reason") or record.finish_reason
    content = (choice.get("delta") or {}).get("content")
    if content:
        record.times.append(now)
        record.texts.append(content)
        if usage:
            record.reported_tokens.append(int(usage["completion_tokens"]))


# --- the native API (`POST /v1/conversations/{id}/messages`) -------------------------


async def native_turn(
    target: Target, content: str, max_tokens: int, timeout_s: float = 300
) -> StreamRecord:
    """Create a conversation, post one message and stream its answer (native SSE:
    `event: delta` … `event: done`, then `data: [DONE]`). `times`/`texts` hold the
    deltas; `usage` comes from the done event."""
    record = StreamRecord(started=time.perf_counter(), wall_started=time.time())
    try:
        async with asyncio.timeout(timeout_s):
            status, reply = await _post_json(target, "/v1/conversations", b"{}")
            if status != 201:
                record.status, record.error = status, f"HTTP {status}: {reply[:300]!r}"
                return record
            path = f"/v1/conversations/{orjson.loads(reply)['conversation_id']}/messages"
            body = orjson.dumps({"content": content, "max_tokens": max_tokens, "ignore_eos": True})
            record.started, record.wall_started = time.perf_counter(), time.time()
            await _exchange(target, path, body, record, _on_native_event)
    except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    record.ended = time.perf_counter()
    return record


async def _post_json(target: Target, path: str, body: bytes) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection(target.host, target.port)
    try:
        writer.write(_head(target, path, len(body), "application/json") + body)
        head = await reader.readuntil(b"\r\n\r\n")
        return int(head.split(b" ", 2)[1]), await reader.read()
    finally:
        writer.close()


def _head(target: Target, path: str, length: int, accept: str) -> bytes:
    return (
        f"POST {path} HTTP/1.0\r\nHost: {target.host}:{target.port}\r\n"
        f"Authorization: Bearer {target.api_key}\r\nContent-Type: application/json\r\n"
        f"Accept: {accept}\r\nContent-Length: {length}\r\n\r\n"
    ).encode()


def _on_native_event(record: StreamRecord, event: SSEMessage, now: float) -> None:
    if event.is_done:
        record.done = True
    elif event.event == "delta":
        record.times.append(now)
        record.texts.append(event.json()["delta"])
    elif event.event == "done":
        done = event.json()
        record.usage, record.finish_reason = done["usage"], done["finish_reason"]
    elif event.event == "request":
        record.request_id = event.json()["request_id"]
    elif event.event == "error":
        record.error = event.data
