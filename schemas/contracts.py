"""Published event contracts: a JSON Schema per event version and an AsyncAPI 3 document.

`chatpipe schemas export contracts` writes them from the models in `schemas/events.py`
(`contracts/events/<Event>.v<N>.json`, `contracts/asyncapi.yaml`), so a consumer in
any language reads the contract without running chatpipe. Channels are topics,
messages are events (with their Kafka key and headers), operations are what each
stage sends and receives. An event's published version is never rewritten with an
incompatible schema (`schemas.compatibility`): bump its `schema_version` instead, and
the old version's file stays beside the new one.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from schemas import topics
from schemas.codec import EVENT_TYPE_HEADER, SCHEMA_VERSION_HEADER
from schemas.compatibility import incompatibilities
from schemas.events import (
    SCHEMA_VERSION,
    AnswerEvent,
    AnswerStarted,
    AttemptStarted,
    Cancel,
    ControlEvent,
    DeadLetter,
    DeliveredToolCall,
    DeliveredToolResult,
    DeliveryDone,
    DeliveryError,
    Delta,
    Event,
    FeedbackEvent,
    GatewayEvent,
    GatewayHeartbeat,
    GenerationDone,
    GenerationError,
    GenerationRequest,
    ModerationEvent,
    Preempt,
    Queued,
    Reroute,
    Retract,
    RolloutSet,
    Routed,
    SchedulerClaim,
    SchedulerEvent,
    SchedulerStatus,
    TokenChunk,
    TokenEvent,
    ToolCallsMade,
    ToolResult,
    ToolRound,
    Unserved,
    UsageEvent,
    WorkAssignment,
    WorkerHeartbeat,
    WorkEvent,
)

ASYNCAPI_FILE = "asyncapi.yaml"
EVENTS_DIR = "events"
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
PAYLOAD_FORMAT = "application/schema+json;version=draft-2020-12"
KAFKA_BINDING = "0.5.0"
TRACEPARENT_HEADER = "traceparent"
TRACEPARENT_PATTERN = "^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"
TRACESTATE_HEADER = "tracestate"
REGENERATE = "chatpipe schemas export contracts"


def members(union: Any) -> tuple[type[Event], ...]:
    """The event classes of a discriminated union (`TokenEvent`, …)."""
    inner = typing.get_args(union)[0] if typing.get_origin(union) is typing.Annotated else union
    return typing.get_args(inner) or (inner,)


@dataclass(frozen=True)
class Channel:
    """A topic (or a family of topics, with `parameters`) and the events it carries."""

    id: str
    address: str
    key: str
    messages: tuple[type[Event], ...]
    description: str
    parameters: dict[str, tuple[str, ...] | None] = field(default_factory=dict)
    """Address parameter -> its values (None: any, named at run time)."""

    def example_address(self) -> str:
        """The address with each parameter filled (its first value, or `x`)."""
        return self.address.format(
            **{name: (values or ("x",))[0] for name, values in self.parameters.items()}
        )


CHANNELS: tuple[Channel, ...] = (
    Channel(
        "requests",
        topics.REQUESTS_PREFIX + "{tier}",
        "conversation_id",
        (GenerationRequest,),
        "Chat turns to generate, one topic per tier.",
        {"tier": tuple(t.value for t in topics.Tier)},
    ),
    Channel(
        "work",
        topics.WORK,
        "conversation_id (a worker's explicit partition; scheduler_id for a claim)",
        members(WorkEvent),
        "Dispatch to the worker owning a partition, and the scheduler's journal.",
    ),
    Channel(
        "work_shard",
        topics.WORK_SHARD_PREFIX + "{shard}",
        "as chat.work",
        members(WorkEvent),
        "chat.work of a named scheduler shard (its models' workers "
        "read it): CHATPIPE_SCHEDULER_SHARDS.",
        {"shard": None},
    ),
    Channel(
        "workers", topics.WORKERS, "worker_id", (WorkerHeartbeat,), "Workers' capacity reports."
    ),
    Channel(
        "scheduler",
        topics.SCHEDULER,
        "scheduler stage name (scheduler_id for a claim)",
        members(SchedulerEvent),
        "The scheduler's view of each tier, and its claims.",
    ),
    Channel(
        "tokens",
        topics.TOKENS,
        "conversation_id",
        members(TokenEvent),
        "Each generation's output in order per conversation: an attempt's marker, "
        "chunks, then its end.",
    ),
    Channel(
        "deliver",
        topics.DELIVER_PREFIX + "{gateway_id}.{start}",
        "conversation_id (request_id for a reroute)",
        members(GatewayEvent),
        "What one gateway's clients may see, once checked; a gateway's own topic, new at "
        "each start of its process.",
        {"gateway_id": None, "start": None},
    ),
    Channel(
        "answers",
        topics.ANSWERS,
        "conversation_id",
        members(AnswerEvent),
        "Stored answers: a marker, then every event their client may see.",
    ),
    Channel(
        "control",
        topics.CONTROL,
        "request_id (a gateway heartbeat: its delivery topic)",
        members(ControlEvent),
        "Cancel, reroute and gateway heartbeats.",
    ),
    Channel(
        "usage",
        topics.USAGE,
        "user_id",
        (UsageEvent,),
        "Tokens and GPU time of each attempt: billing and analytics.",
    ),
    Channel(
        "moderation",
        topics.MODERATION,
        "conversation_id",
        (ModerationEvent,),
        "Every block and retraction with its reason.",
    ),
    Channel(
        "rollout",
        topics.ROLLOUT,
        "alias",
        (RolloutSet,),
        "Model aliases' weights: every gateway reads it all, the last record of each alias wins.",
    ),
    Channel(
        "feedback",
        topics.FEEDBACK,
        "conversation_id",
        (FeedbackEvent,),
        "Users' thumbs up or down on answers, with the version that answered.",
    ),
    Channel(
        "dlq",
        topics.DLQ,
        "the original record's key",
        (DeadLetter,),
        "Records a stage could not parse or process, with the error.",
    ),
    Channel(
        "tools",
        topics.TOOLS,
        "conversation_id",
        (ToolRound,),
        "Server-tools rounds that called tools: the tools stage runs the calls, "
        "writes the results on chat.tokens and queues the next round.",
    ),
)


@dataclass(frozen=True)
class Operation:
    """A stage sends to or receives from a channel; `messages` empty: all of the channel's."""

    stage: str
    action: Literal["send", "receive"]
    channel: str
    messages: tuple[type[Event], ...] = ()

    @property
    def id(self) -> str:
        return f"{self.stage}-{self.action}-{self.channel}"


def _sends(stage: str, channel: str, *messages: type[Event]) -> Operation:
    return Operation(stage, "send", channel, messages)


def _receives(stage: str, *channels: str) -> tuple[Operation, ...]:
    return tuple(Operation(stage, "receive", channel) for channel in channels)


GROUPS: dict[str, str] = {
    "scheduler": "chatpipe-scheduler",
    "worker": "chatpipe-workers",
    "safety": "chatpipe-safety",
    "recorder": "chatpipe-recorder",
    "billing": "chatpipe-billing",
    "analytics": "chatpipe-analytics",
    "tools": "chatpipe-tools",
}
"""Each stage's consumer group (the gateway reads its topics with `assign()`)."""

_DELIVERED = (Delta, Retract, DeliveryError, DeliveryDone, DeliveredToolCall, DeliveredToolResult)
OPERATIONS: tuple[Operation, ...] = (
    _sends("gateway", "requests", GenerationRequest),
    _sends("gateway", "answers", AnswerStarted, Delta, DeliveryDone),  # + a cached answer's
    _sends("gateway", "usage", UsageEvent),  # an answer replayed from the response cache
    _sends("gateway", "control", Cancel, Reroute, GatewayHeartbeat),
    _sends("gateway", "deliver", Reroute),
    _sends("gateway", "moderation", ModerationEvent),
    _sends("gateway", "feedback", FeedbackEvent),
    _sends("gateway", "dlq", DeadLetter),
    *_receives("gateway", "deliver", "scheduler", "answers", "rollout"),
    _sends("operator", "rollout", RolloutSet),
    _sends("scheduler", "work", WorkAssignment, Unserved, SchedulerClaim),
    _sends("scheduler", "work_shard", WorkAssignment, Unserved, SchedulerClaim),
    _sends("scheduler", "tokens", AttemptStarted, GenerationDone, GenerationError),
    _sends("scheduler", "deliver", Queued, Routed),
    _sends("scheduler", "answers", Queued, Routed),
    _sends("scheduler", "control", Cancel, Preempt),
    _sends("scheduler", "scheduler", SchedulerStatus, SchedulerClaim),
    _sends("scheduler", "dlq", DeadLetter),
    *_receives("scheduler", "requests", "control", "workers", "scheduler", "work", "work_shard"),
    _sends("worker", "tokens", TokenChunk, GenerationDone, GenerationError, ToolCallsMade),
    _sends("worker", "tools", ToolRound),
    _sends("worker", "usage", UsageEvent),
    _sends("worker", "workers", WorkerHeartbeat),
    _sends("worker", "dlq", DeadLetter),
    *_receives("worker", "work", "work_shard", "control", "tokens"),
    _sends("safety", "deliver", *_DELIVERED),
    _sends("safety", "answers", *_DELIVERED),
    _sends("safety", "control", Cancel),
    _sends("safety", "moderation", ModerationEvent),
    _sends("safety", "dlq", DeadLetter),
    *_receives("safety", "tokens"),
    _sends("recorder", "dlq", DeadLetter),
    *_receives("recorder", "answers"),
    _sends("billing", "dlq", DeadLetter),
    *_receives("billing", "usage"),
    _sends("tools", "tokens", ToolResult),
    _sends("tools", "requests", GenerationRequest),
    _sends("tools", "dlq", DeadLetter),
    *_receives("tools", "tools"),
    _sends("analytics", "dlq", DeadLetter),
    Operation("analytics", "receive", "requests", (GenerationRequest,)),
    Operation("analytics", "receive", "tokens", (TokenChunk, GenerationDone, GenerationError)),
    *_receives("analytics", "usage", "moderation", "feedback"),
)


def events() -> list[type[Event]]:
    """Every event some channel carries, by name."""
    found = {event for channel in CHANNELS for event in channel.messages}
    return sorted(found, key=lambda event: event.__name__)


def event_version(event: type[Event]) -> int:
    return int(event.model_fields["schema_version"].default)


def event_type(event: type[Event]) -> str:
    """The `type` literal: the event's `event-type` header."""
    return str(event.model_fields["type"].default)


def schema_path(event: type[Event]) -> str:
    """Where the event's JSON Schema lies, relative to the contracts directory."""
    return f"{EVENTS_DIR}/{event.__name__}.v{event_version(event)}.json"


def event_schema(event: type[Event]) -> dict[str, Any]:
    """The JSON Schema (2020-12) of what a consumer of this version accepts."""
    schema = event.model_json_schema(mode="validation")
    return {"$schema": JSON_SCHEMA_DIALECT, "$id": schema_path(event).split("/")[-1], **schema}


def _headers(event: type[Event]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            EVENT_TYPE_HEADER: {
                "type": "string",
                "const": event_type(event),
                "description": "the event's `type`",
            },
            SCHEMA_VERSION_HEADER: {
                "type": "string",
                "const": str(event_version(event)),
                "description": "the event's `schema_version`",
            },
            TRACEPARENT_HEADER: {
                "type": "string",
                "pattern": TRACEPARENT_PATTERN,
                "description": "W3C trace context, when the record was sent inside a traced span",
            },
            TRACESTATE_HEADER: {
                "type": "string",
                "description": "W3C trace state, beside a traceparent",
            },
        },
        "required": [EVENT_TYPE_HEADER, SCHEMA_VERSION_HEADER],
    }


def _message(event: type[Event], key: str) -> dict[str, Any]:
    message: dict[str, Any] = {
        "name": event.__name__,
        "title": f"{event.__name__} (type {event_type(event)!r}, v{event_version(event)})",
        "contentType": "application/json",
        "headers": _headers(event),
        "payload": {"schemaFormat": PAYLOAD_FORMAT, "schema": {"$ref": schema_path(event)}},
        "bindings": {
            "kafka": {
                "key": {"type": "string", "description": key},
                "bindingVersion": KAFKA_BINDING,
            }
        },
    }
    if event.__doc__:
        message["summary"] = " ".join(event.__doc__.split())
    return message


def _channel(channel: Channel) -> dict[str, Any]:
    document: dict[str, Any] = {
        "address": channel.address,
        "description": channel.description,
        "messages": {event.__name__: _message(event, channel.key) for event in channel.messages},
    }
    if channel.parameters:
        document["parameters"] = {
            name: {"description": f"the {name}", **({"enum": list(values)} if values else {})}
            for name, values in channel.parameters.items()
        }
    else:
        document["bindings"] = {
            "kafka": {"topic": channel.address, "bindingVersion": KAFKA_BINDING}
        }
    return document


def _operation(operation: Operation) -> dict[str, Any]:
    channel = _channel_by_id(operation.channel)
    messages = operation.messages or channel.messages
    document: dict[str, Any] = {
        "action": operation.action,
        "channel": {"$ref": f"#/channels/{channel.id}"},
        "summary": f"{operation.stage} {operation.action}s on {channel.address}",
        "messages": [
            {"$ref": f"#/channels/{channel.id}/messages/{event.__name__}"} for event in messages
        ],
    }
    group = GROUPS.get(operation.stage)
    if operation.action == "receive" and group is not None:
        document["bindings"] = {
            "kafka": {
                "groupId": {"type": "string", "enum": [group]},
                "bindingVersion": KAFKA_BINDING,
            }
        }
    return document


def _channel_by_id(channel_id: str) -> Channel:
    [channel] = [c for c in CHANNELS if c.id == channel_id]
    return channel


def asyncapi() -> dict[str, Any]:
    """The AsyncAPI 3.0.0 document of chatpipe's topics."""
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "chatpipe events",
            "version": f"{SCHEMA_VERSION}.0.0",
            "description": (
                "Topics, events and who sends and receives them. Payloads are JSON "
                "(orjson), one event per record; consumers ignore fields they do not "
                "know, so optional fields are added without a new schema_version. "
                f"Generated by `{REGENERATE}` from schemas/; do not edit."
            ),
        },
        "defaultContentType": "application/json",
        "servers": {
            "kafka": {
                "host": "localhost:9092",
                "protocol": "kafka",
                "description": "KAFKA_BOOTSTRAP_SERVERS (chatpipe up: an embedded broker)",
            }
        },
        "channels": {channel.id: _channel(channel) for channel in CHANNELS},
        "operations": {operation.id: _operation(operation) for operation in OPERATIONS},
    }


class IncompatibleChange(ValueError):
    """An event changed incompatibly without a new `schema_version`."""


def contract_files() -> dict[str, str]:
    """Relative path -> text of every file the export writes."""
    files = {schema_path(event): _json(event_schema(event)) for event in events()}
    files[ASYNCAPI_FILE] = yaml.safe_dump(
        asyncapi(), sort_keys=False, allow_unicode=True, width=100
    )
    return files


def _json(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


def check_compatible(
    directory: Path,
    published_events: Iterable[type[Event]] | None = None,
) -> list[str]:
    """Each event (default: all) whose published schema of its current version (in
    `directory`) the current model breaks, with the reasons."""
    problems = []
    for event in events() if published_events is None else published_events:
        published = directory / schema_path(event)
        if not published.exists():
            continue
        reasons = incompatibilities(json.loads(published.read_text()), event_schema(event))
        problems += [f"{event.__name__} v{event_version(event)}: {r}" for r in reasons]
    return problems


def stale(directory: Path) -> list[str]:
    """The contract files in `directory` that differ from the current export (or are
    missing). Files of older versions are kept, never stale."""
    return sorted(
        path
        for path, text in contract_files().items()
        if not (directory / path).exists() or (directory / path).read_text() != text
    )


def export(directory: Path) -> list[str]:
    """Write the contracts into `directory`; the relative paths written (changed or new).
    IncompatibleChange, writing nothing, if a published version would change
    incompatibly."""
    problems = check_compatible(directory)
    if problems:
        raise IncompatibleChange(
            "changed incompatibly without a new schema_version (bump the event's "
            "schema_version; the old version's file stays):\n  " + "\n  ".join(problems)
        )
    written = stale(directory)
    files = contract_files()
    for path in written:
        target = directory / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(files[path])
    return written


def channels_for(address: str) -> Iterable[Channel]:
    """The channels whose address (parameters filled in any way) is `address`."""
    for channel in CHANNELS:
        prefix = channel.address.split("{")[0]
        if channel.address == address or (
            channel.parameters and address.startswith(prefix) and address != prefix
        ):
            yield channel
