"""orjson encoding of events and the Kafka headers that travel with them."""

from __future__ import annotations

from typing import TypeVar

import orjson
from pydantic import BaseModel, TypeAdapter

from ops.tracing import trace_headers
from schemas.events import (
    AnswerEvent,
    ControlEvent,
    DeliverEvent,
    Event,
    GatewayEvent,
    SchedulerEvent,
    TokenEvent,
    WorkEvent,
)

EVENT_TYPE_HEADER = "event-type"
SCHEMA_VERSION_HEADER = "schema-version"

E = TypeVar("E", bound=BaseModel)


class EventDecodeError(ValueError):
    """The bytes are not a valid event of the expected kind."""


def encode(event: Event) -> bytes:
    return orjson.dumps(event.model_dump(mode="python"), option=orjson.OPT_NON_STR_KEYS)


def headers(event: Event) -> list[tuple[str, bytes]]:
    """The event's type and version, and the trace context it is sent in (if traced)."""
    return [
        (EVENT_TYPE_HEADER, str(getattr(event, "type", type(event).__name__)).encode()),
        (SCHEMA_VERSION_HEADER, str(event.schema_version).encode()),
        *trace_headers(),
    ]


def decode(kind: type[E] | TypeAdapter[E], raw: bytes | None) -> E:
    """Parse `raw` as `kind` (a model class or a TypeAdapter of a union)."""
    if raw is None:
        raise EventDecodeError("empty message")
    try:
        payload = orjson.loads(raw)
        if isinstance(kind, TypeAdapter):
            return kind.validate_python(payload)
        return kind.model_validate(payload)
    except (orjson.JSONDecodeError, ValueError) as exc:
        raise EventDecodeError(str(exc)) from exc


TOKEN_EVENT: TypeAdapter[TokenEvent] = TypeAdapter(TokenEvent)
DELIVER_EVENT: TypeAdapter[DeliverEvent] = TypeAdapter(DeliverEvent)
CONTROL_EVENT: TypeAdapter[ControlEvent] = TypeAdapter(ControlEvent)
ANSWER_EVENT: TypeAdapter[AnswerEvent] = TypeAdapter(AnswerEvent)
WORK_EVENT: TypeAdapter[WorkEvent] = TypeAdapter(WorkEvent)
SCHEDULER_EVENT: TypeAdapter[SchedulerEvent] = TypeAdapter(SchedulerEvent)
GATEWAY_EVENT: TypeAdapter[GatewayEvent] = TypeAdapter(GatewayEvent)
