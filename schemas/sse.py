"""The SSE wire format of both APIs, and a small reader for clients.

Native stream of `POST /v1/conversations/{id}/messages`:

    event: request      data: {"request_id", "message_id", "user_message_id"}
    event: citations    data: {"citations": [{"file_id", "filename", "chunk_index",
                        "score", "snippet"}]}  (a turn with file_ids that found excerpts)
    id: 3               (every event carrying a delivery seq, for Last-Event-ID)
    event: delta        data: {"delta": "Hello"}
    event: queued       data: {"position": 12, "eta_ms": 3400}
    event: retract      data: {"message_id", "reason", "replacement"}
    event: error        data: {"code", "message", "retry_after"}
    event: tool_call    data: {"id", "name", "arguments"}  (a turn with server tools:
                        the model called one; arguments: JSON text)
    event: tool_result  data: {"id", "name", "content", "error"}  (what it returned:
                        content is JSON text, {"error": ...} when it failed)
    event: done         data: {"finish_reason", "status", "usage", "cache"?}
                        (cache: "hit" | "miss", only when the response cache was asked)
    data: [DONE]        (after done or error: the stream ends)

OpenAI stream of `POST /v1/chat/completions`: one `data: <ChatCompletionChunk>`
per chunk, `data: {"error": {...}}` on failure, then `data: [DONE]`.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Iterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import BaseModel, Field

from schemas.api import ChatCompletionChunk, ErrorBody, ErrorDetail, TextCompletion
from schemas.events import (
    CacheOutcome,
    DeliveredToolCall,
    DeliveredToolResult,
    DeliverEvent,
    DeliveryDone,
    DeliveryError,
    Delta,
    Queued,
    Retract,
    Routed,
    Usage,
)
from schemas.files import Citation, CitationsPayload
from schemas.lifecycle import RequestStatus

SEP = "\n"
DONE_MARKER = "[DONE]"


class RequestPayload(BaseModel):
    """First event of a native stream: the ids a client refers back to."""

    request_id: str
    message_id: str = Field(description="id the assistant message is stored under")
    user_message_id: str


class DeltaPayload(BaseModel):
    delta: str


class RoutedPayload(BaseModel):
    model: str
    requested_model: str
    reason: str


class QueuedPayload(BaseModel):
    position: int
    eta_ms: int | None


class RetractPayload(BaseModel):
    message_id: str
    reason: str
    replacement: str


class ErrorPayload(BaseModel):
    code: str
    message: str
    retry_after: float | None


class DonePayload(BaseModel):
    finish_reason: str | None
    status: RequestStatus
    usage: Usage
    cache: CacheOutcome | None = Field(
        None,
        description="the response cache's answer (`usage.cache`); absent when the "
        "request was not looked up",
    )
    model: str | None = Field(
        None,
        description="the model that answered (an alias's version); "
        "left out when the pipeline did not say",
    )


class ToolCallPayload(BaseModel):
    """A server tool the model called (`event: tool_call`)."""

    id: str
    name: str
    arguments: str = Field(description="the arguments object as JSON text")


class ToolResultPayload(BaseModel):
    """What a server tool returned (`event: tool_result`), for the call `id`."""

    id: str
    name: str
    content: str = Field(description='JSON text; {"error": ...} when the tool failed')
    error: bool = False


def frame(data: str | bytes, event: str | None = None, seq: int | None = None) -> bytes:
    """One SSE message on the wire (`data` is one line: JSON never holds a raw newline)."""
    head = b"" if seq is None else b"id: %d\n" % seq
    if event is not None:
        head += b"event: " + event.encode() + b"\n"
    return head + b"data: " + (data if isinstance(data, bytes) else data.encode()) + b"\n\n"


def _event(payload: BaseModel | str, event: str | None = None, seq: int | None = None) -> bytes:
    data = payload if isinstance(payload, str) else payload.model_dump_json()
    return frame(data, event, seq)


def request_event(payload: RequestPayload) -> bytes:
    return _event(payload, "request")


def citations_event(citations: list[Citation]) -> bytes:
    """The sources of the answer, before its first delta (no id: resuming sends it again)."""
    return _event(CitationsPayload(citations=citations), "citations")


def delta_event(text: str, seq: int) -> bytes:
    """`event: delta` (`DeltaPayload`), built without a model: the stream's hot path."""
    return b'id: %d\nevent: delta\ndata: {"delta":%b}\n\n' % (seq, orjson.dumps(text))


def native_event(event: DeliverEvent) -> bytes:
    """A delivery event as the native stream sends it (`event:` = the event type)."""
    match event:
        case Delta():
            return delta_event(event.text, event.seq)
        case Queued():
            # Queue updates come before any output: no id, so resuming never skips text.
            return _event(QueuedPayload(position=event.position, eta_ms=event.eta_ms), "queued")
        case Routed():
            routed = RoutedPayload(
                model=event.model, requested_model=event.requested_model, reason=event.reason
            )
            return _event(routed, "model")
        case Retract():
            retract = RetractPayload(
                message_id=event.message_id, reason=event.reason, replacement=event.replacement
            )
            return _event(retract, event.type, event.seq)
        case DeliveryError():
            error = ErrorPayload(
                code=event.code, message=event.message, retry_after=event.retry_after
            )
            return _event(error, event.type, event.seq)
        case DeliveredToolCall():
            call = ToolCallPayload(
                id=event.call.id,
                name=event.call.function.name,
                arguments=event.call.function.arguments,
            )
            return _event(call, event.type, event.seq)
        case DeliveredToolResult():
            result = ToolResultPayload(
                id=event.call_id, name=event.name, content=event.content, error=event.error
            )
            return _event(result, event.type, event.seq)
        case DeliveryDone():
            payload = DonePayload(
                finish_reason=event.status.openai_finish_reason,
                status=event.status,
                usage=event.usage,
                cache=event.usage.cache,
                model=event.model,
            )
            # Fields a request did not use are left out: the done event as it always was.
            unsaid: dict[str, Any] = {}
            if payload.cache is None:
                unsaid = {"cache": True, "usage": {"cache"}}
            if event.model is None:
                unsaid["model"] = True
            return frame(payload.model_dump_json(exclude=unsaid or None), event.type, event.seq)
    raise TypeError(f"not a delivery event: {event!r}")


def error_event(code: str, message: str, retry_after: float | None = None) -> bytes:
    """An error the gateway itself raises in a native stream (no delivery seq)."""
    return _event(ErrorPayload(code=code, message=message, retry_after=retry_after), "error")


def done_marker() -> bytes:
    return _event(DONE_MARKER)


PING = b": ping\n\n"
"""A comment line: keeps idle connections open through proxies; readers skip it."""


def openai_chunk(chunk: ChatCompletionChunk | TextCompletion) -> bytes:
    return _event(chunk)


def openai_error(detail: ErrorDetail) -> bytes:
    return _event(ErrorBody(error=detail))


# --- reading (clients, tests, benchmarks) ---------------------------------------------


@dataclass(slots=True)
class SSEMessage:
    event: str | None
    """The `event:` field; None for a message that names none (every OpenAI chunk)."""
    data: str
    id: str | None = None
    at: float = 0.0
    """When the reader completed it, on the reader's clock (0 without one)."""

    @property
    def is_done(self) -> bool:
        return self.data == DONE_MARKER

    def json(self) -> Any:
        return orjson.loads(self.data)


class SSEReader:
    """The one client-side parser of an event stream (the SSE spec's rules): lines, or
    pieces of the body cut anywhere, in; messages out. Comments are skipped, and a
    blank line ends a message (one without `data:` is dropped, as browsers drop it).
    With a `clock`, each message is stamped with its arrival time."""

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._clock = clock
        self._lines: list[str] = []
        self._partial = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")()

    def feed(self, line: str) -> SSEMessage | None:
        """One line, without its line ending: the message it completes, if any."""
        if line:
            self._lines.append(line)
            return None
        lines, self._lines = self._lines, []
        return self._message(lines)

    def feed_bytes(self, piece: bytes) -> list[SSEMessage]:
        """The messages `piece` completes: a read of the raw body, cut anywhere (a line
        or a character split across two reads waits for the rest)."""
        text = (self._partial + self._decoder.decode(piece)).replace("\r\n", "\n")
        *blocks, self._partial = text.split("\n\n")
        message = self._message
        return [m for block in blocks if (m := message(block.split("\n"))) is not None]

    def _message(self, lines: list[str]) -> SSEMessage | None:
        """The message of one block of lines (a comment's field name is empty)."""
        event = message_id = None
        data: list[str] = []
        for line in lines:
            name, _, value = line.partition(":")
            if value[:1] == " ":
                value = value[1:]
            if name == "data":
                data.append(value)
            elif name == "event":
                event = value
            elif name == "id":
                message_id = value
        if not data:
            return None
        at = self._clock() if self._clock is not None else 0.0
        return SSEMessage(event, "\n".join(data), message_id, at)


def parse_messages(text: str | Iterable[str]) -> list[SSEMessage]:
    """All messages of a complete stream body (or of its lines)."""
    lines = text.splitlines() if isinstance(text, str) else text
    return list(iter_messages([*lines, ""], clock=None))


def iter_messages(
    lines: Iterable[str],
    clock: Callable[[], float] | None = time.monotonic,
) -> Iterator[SSEMessage]:
    """Messages as they arrive, stamped with `clock`, e.g. from
    `httpx.Response.iter_lines()`."""
    reader = SSEReader(clock)
    for line in lines:
        if (message := reader.feed(line)) is not None:
            yield message


async def aiter_messages(lines: AsyncIterator[str]) -> AsyncGenerator[SSEMessage]:
    """Messages as they arrive, stamped with `time.monotonic()`, e.g. from
    `httpx.Response.aiter_lines()`."""
    reader = SSEReader(time.monotonic)
    async for line in lines:
        if (message := reader.feed(line)) is not None:
            yield message


async def read_messages(
    lines: AsyncIterator[str], stop: Callable[[SSEMessage], bool] | None = None
) -> list[SSEMessage]:
    """The messages of `lines` (`aiter_messages`) to the stream's end, or up to and with
    the first one `stop` accepts; `lines` can then be read on by another call."""
    read: list[SSEMessage] = []
    async with aclosing(aiter_messages(lines)) as messages:
        async for message in messages:
            read.append(message)
            if stop is not None and stop(message):
                break
    return read
