"""The SSE wire format of both APIs (DESIGN §4), and a small reader for clients.

Native stream of `POST /v1/conversations/{id}/messages`:

    event: request      data: {"request_id", "message_id", "user_message_id"}
    id: 3               (every event carrying a delivery seq, for Last-Event-ID)
    event: delta        data: {"delta": "Hello"}
    event: queued       data: {"position": 12, "eta_ms": 3400}
    event: retract      data: {"message_id", "reason", "replacement"}
    event: error        data: {"code", "message", "retry_after"}
    event: done         data: {"finish_reason", "status", "usage"}
    data: [DONE]        (after done or error: the stream ends)

OpenAI stream of `POST /v1/chat/completions`: one `data: <ChatCompletionChunk>`
per chunk, `data: {"error": {...}}` on failure, then `data: [DONE]`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass

import orjson
from pydantic import BaseModel, Field

from schemas.api import ChatCompletionChunk, ErrorBody, ErrorDetail
from schemas.events import (
    DeliverEvent,
    DeliveryDone,
    DeliveryError,
    Delta,
    Queued,
    Retract,
    Routed,
    Usage,
)
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


def delta_event(text: str, seq: int) -> bytes:
    """`event: delta` (`DeltaPayload`), built without a model: the stream's hot path."""
    return b"id: %d\nevent: delta\ndata: {\"delta\":%b}\n\n" % (seq, orjson.dumps(text))


def native_event(event: DeliverEvent) -> bytes:
    """A delivery event as the native stream sends it (`event:` = the event type)."""
    match event:
        case Delta():
            return delta_event(event.text, event.seq)
        case Queued():
            # Queue updates come before any output: no id, so resuming never skips text.
            return _event(QueuedPayload(position=event.position, eta_ms=event.eta_ms), "queued")
        case Routed():
            payload = RoutedPayload(model=event.model, requested_model=event.requested_model,
                                    reason=event.reason)
            return _event(payload, "model")
        case Retract():
            payload = RetractPayload(
                message_id=event.message_id, reason=event.reason, replacement=event.replacement
            )
            return _event(payload, event.type, event.seq)
        case DeliveryError():
            payload = ErrorPayload(
                code=event.code, message=event.message, retry_after=event.retry_after
            )
            return _event(payload, event.type, event.seq)
        case DeliveryDone():
            payload = DonePayload(
                finish_reason=event.status.openai_finish_reason,
                status=event.status,
                usage=event.usage,
            )
            return _event(payload, event.type, event.seq)
    raise TypeError(f"not a delivery event: {event!r}")


def error_event(code: str, message: str, retry_after: float | None = None) -> bytes:
    """An error the gateway itself raises in a native stream (no delivery seq)."""
    return _event(ErrorPayload(code=code, message=message, retry_after=retry_after), "error")


def done_marker() -> bytes:
    return _event(DONE_MARKER)


PING = b": ping\n\n"
"""A comment line: keeps idle connections open through proxies; readers skip it."""


def openai_chunk(chunk: ChatCompletionChunk) -> bytes:
    return _event(chunk)


def openai_error(detail: ErrorDetail) -> bytes:
    return _event(ErrorBody(error=detail))


# --- reading (clients, tests, benchmarks) ---------------------------------------------


@dataclass(frozen=True, slots=True)
class SSEMessage:
    event: str | None
    data: str
    id: str | None = None

    @property
    def is_done(self) -> bool:
        return self.data == DONE_MARKER


class SSEReader:
    """Turns lines (without their line ending) into messages; comments are skipped."""

    def __init__(self) -> None:
        self._event: str | None = None
        self._id: str | None = None
        self._data: list[str] = []

    def feed(self, line: str) -> SSEMessage | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            self._id = value
        return None

    def _dispatch(self) -> SSEMessage | None:
        if not self._data and self._event is None:
            return None
        message = SSEMessage(event=self._event, data="\n".join(self._data), id=self._id)
        self._event, self._id, self._data = None, None, []
        return message


def parse_messages(text: str | Iterable[str]) -> list[SSEMessage]:
    """All messages of a complete stream body (or of its lines)."""
    lines = text.splitlines() if isinstance(text, str) else text
    reader = SSEReader()
    return [m for line in [*lines, ""] if (m := reader.feed(line)) is not None]


async def aiter_messages(lines: AsyncIterator[str]) -> AsyncIterator[SSEMessage]:
    """Messages as they arrive, e.g. from `httpx.Response.aiter_lines()`."""
    reader = SSEReader()
    async for line in lines:
        if (message := reader.feed(line)) is not None:
            yield message
