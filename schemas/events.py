"""Versioned events carried on the Kafka topics.

Every event has a `type` literal (also sent as the `event-type` header) and a
`schema_version`. Consumers ignore fields they do not know, so producers can
add optional fields without a version bump. Duplicates are dropped by
`(request_id, attempt, seq)`.
"""

from __future__ import annotations

import math
import time
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from schemas.bounds import Finite
from schemas.lifecycle import RequestStatus
from schemas.tools import ServerToolTurn, ToolCall, ToolCalls, ToolUse
from schemas.topics import Tier

SCHEMA_VERSION = 1
SAMPLING_DEFAULTS_VERSION = 2
"""The events carrying `SamplingOptions`: since version 2 an unset temperature or top_p
is the model's default (version 1 defaulted them to 0.7 and 1.0)."""


def now() -> float:
    """Wall-clock seconds since the epoch: the timestamp of every event."""
    return time.time()


def _unset(value: object) -> bool:
    """Left out of the JSON when unset: a field most events never use costs no bytes."""
    return value is None or value == ()


def _unset_flag(value: bool) -> bool:
    return not value


class Event(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    schema_version: int = SCHEMA_VERSION


class Role(StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = Field(
        (), description="an assistant's calls of tools", exclude_if=_unset
    )
    tool_call_id: str | None = Field(
        None, description="a tool's result: the call it answers", exclude_if=_unset
    )


class SamplingOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    max_tokens: int = Field(256, ge=1)
    # The sampling parameters, each with vLLM's meaning; unset, the model's default (its
    # generation_config.json, as vLLM reads it) or else vLLM's, and left out of the JSON.
    # Every float finite (`schemas.bounds`): the bus would carry infinity as null.
    temperature: Finite | None = Field(None, ge=0.0, le=2.0, exclude_if=_unset)
    top_p: Finite | None = Field(None, gt=0.0, le=1.0, exclude_if=_unset)
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    presence_penalty: Finite | None = Field(None, ge=-2.0, le=2.0, exclude_if=_unset)
    frequency_penalty: Finite | None = Field(None, ge=-2.0, le=2.0, exclude_if=_unset)
    repetition_penalty: Finite | None = Field(None, gt=0.0, exclude_if=_unset)
    min_p: Finite | None = Field(None, ge=0.0, le=1.0, exclude_if=_unset)
    top_k: int | None = Field(None, ge=-1, description="-1 or 0: every token", exclude_if=_unset)
    logit_bias: dict[int, Finite] | None = Field(
        None, description="token id -> bias added to its logit (-100 to 100)", exclude_if=_unset
    )
    logprobs: int | None = Field(
        None,
        ge=0,
        le=20,
        description="return each output token's log probability, and "
        "this many of the likeliest tokens at its place",
        exclude_if=_unset,
    )
    json_object: bool = Field(
        False, description="the output is held to be one JSON object", exclude_if=_unset_flag
    )
    json_schema: dict[str, Any] | None = Field(
        None, description="the output is held to this JSON schema", exclude_if=_unset
    )

    @property
    def structured(self) -> bool:
        """The output is held to a JSON format."""
        return self.json_object or self.json_schema is not None


CacheOutcome = Literal["hit", "miss"]
"""The response cache's answer for a request it looked up: `hit`, replayed from the cache
(no GPU time); `miss`, generated (and cached if it ends well)."""


class Usage(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cache: CacheOutcome | None = Field(
        None,
        description="response cache: hit (replayed, no GPU time) or miss (looked up, "
        "generated); unset: not looked up",
    )


# --- chat.requests.<tier> and chat.work ---------------------------------------------


class StreamPosition(BaseModel):
    """Where a request's stream lies on `chat.tokens`, set by the scheduler at each dispatch.

    Before it hands out an attempt the scheduler writes that attempt's `AttemptStarted`
    marker on the request's `chat.tokens` partition. A continuation (attempt > 0) reads
    `[start_offset, attempt_offset)`: every earlier attempt's output, up to a known end.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    partition: int
    start_offset: int = Field(description="the first attempt's marker: where the stream starts")
    attempt_offset: int = Field(description="this attempt's marker: where its reading ends")


class GenerationRequest(Event):
    """A chat turn to generate: what the gateway queues and the worker runs."""

    type: Literal["request"] = "request"
    schema_version: int = SAMPLING_DEFAULTS_VERSION
    request_id: str
    attempt: int = 0
    conversation_id: str
    message_id: str = Field(description="id the assistant message is stored under")
    parent_id: str | None = Field(None, description="the user message being answered")
    user_id: str
    org_id: str
    tier: Tier
    model: str
    messages: tuple[ChatMessage, ...]
    sampling: SamplingOptions = SamplingOptions()
    reply_to: str = Field(description="delivery topic of the gateway holding the stream")
    deadline: float | None = Field(None, description="epoch seconds; dropped if still waiting")
    cache_salt: str | None = None
    store: bool = Field(True, description="persist the answer in the conversation store")
    requested_model: str | None = Field(
        None, description="the model the client asked for, when the router chose another"
    )
    alias: str | None = Field(
        None,
        description="the model alias the client asked for; `model` is the version "
        "(a served model) the gateway picked for it (chat.rollout)",
    )
    stream: StreamPosition | None = Field(
        None, description="set at dispatch: where the stream lies on chat.tokens"
    )
    tool_use: ToolUse | None = Field(
        None, description="tools the model is shown, and how it may call them", exclude_if=_unset
    )
    server_tools: ServerToolTurn | None = Field(
        None,
        description="a native turn whose tool calls chatpipe runs (chat.tools)",
        exclude_if=_unset,
    )
    file_ids: tuple[str, ...] = Field(
        (),
        description="the user's files a native turn named (`file_ids`): their excerpts, "
        "if any were found, are in `messages`",
        exclude_if=_unset,
    )
    created_at: float = Field(default_factory=now)
    # --- text completions (/v1/completions) -------------------------------------------
    prompt: str | None = Field(
        None,
        description="a text completion's prompt, tokenized as it is (no chat "
        "template); `messages` is then empty",
        exclude_if=_unset,
    )
    # --- end of text completions ------------------------------------------------------

    @property
    def answer_id(self) -> str:
        """The request id the answer's stream events carry: the first tool round's for
        a turn with server tools, else this request's own."""
        return self.server_tools.answer_id if self.server_tools else self.request_id

    @property
    def last_user_message(self) -> str:
        """The text of the newest user message, or a text completion's prompt: what this
        turn asks ("" if none)."""
        if self.prompt is not None:
            return self.prompt
        return next((m.content for m in reversed(self.messages) if m.role is Role.USER), "")


class WorkAssignment(Event):
    """The scheduler hands a request to the worker owning a `chat.work` partition."""

    type: Literal["work"] = "work"
    schema_version: int = SAMPLING_DEFAULTS_VERSION
    worker_id: str
    incarnation: str = Field(
        "",
        description="the worker process it is for: a restarted process with the same "
        "worker id skips it (the scheduler dispatches its requests again); empty: any",
    )
    request: GenerationRequest
    epoch: int = Field(0, description="the dispatching scheduler's claim: older ones are fenced")
    dispatched_at: float = Field(default_factory=now)


class SchedulerClaim(Event):
    """A scheduler takes over: written on every `chat.work` partition and on
    `chat.scheduler` before it dispatches anything. Workers ignore assignments of an
    older epoch from then on, and an older scheduler of the same shard that reads it
    stops."""

    type: Literal["claim"] = "claim"
    scheduler_id: str
    epoch: int
    shard: str = Field(
        "",
        description="the scheduler shard claimed (its own chat.work."
        "<shard>); empty: the unnamed one",
    )
    sent_at: float = Field(default_factory=now)


class Unserved(Event):
    """The scheduler's record on `chat.work` of a request it ended without a worker
    (cancelled, expired or refused), so a restarted scheduler keeps it ended."""

    type: Literal["unserved"] = "unserved"
    request_id: str
    attempt: int = 0
    code: str


WorkEvent = Annotated[WorkAssignment | SchedulerClaim | Unserved, Field(discriminator="type")]


# --- chat.workers ---------------------------------------------------------------------


class WorkerHeartbeat(Event):
    """A worker's capacity report, sent periodically and whenever a request ends."""

    type: Literal["heartbeat"] = "heartbeat"
    worker_id: str
    incarnation: str = Field(
        "",
        description="random per worker process: a new one means "
        "the process restarted and what the old one ran is lost",
    )
    model: str
    partitions: tuple[int, ...]
    max_slots: int
    active: tuple[str, ...] = Field((), description="request ids in the engine")
    consumed: dict[int, int] = Field(
        default_factory=dict, description="chat.work partition -> next offset to read"
    )
    assignments: dict[str, tuple[int, int]] = Field(
        default_factory=dict,
        description="active request id -> (chat.work partition, offset) of its assignment",
    )
    handed_back: tuple[str, ...] = Field(
        (),
        description="requests the worker gives back unfinished (draining, or preempted): "
        "dispatch them again",
    )
    handed_back_attempts: dict[str, int] = Field(
        default_factory=dict,
        description="handed-back request id -> the attempt given back: a later attempt of "
        "the same request, dispatched since, is not the one handed back",
    )
    running: int = 0
    waiting: int = 0
    peak_running: int = Field(0, description="most requests the engine ran at once")
    free_kv_blocks: int | None = None
    stopping: bool = False
    sent_at: float = Field(default_factory=now)


# --- chat.tokens ----------------------------------------------------------------------


class StreamEvent(Event):
    """Fields every event of one generation's stream carries."""

    request_id: str
    attempt: int = 0
    seq: int
    conversation_id: str
    message_id: str
    parent_id: str | None = None
    model: str
    reply_to: str
    store: bool = True
    tier: Tier | None = None


def stream_fields(request: GenerationRequest, seq: int) -> dict[str, object]:
    """The `StreamEvent` fields of event `seq` of `request`'s stream."""
    return dict(
        request_id=request.answer_id,
        attempt=request.attempt,
        seq=seq,
        conversation_id=request.conversation_id,
        message_id=request.message_id,
        parent_id=request.parent_id,
        model=request.model,
        reply_to=request.reply_to,
        store=request.store,
        tier=request.tier,
    )


class TopLogprob(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    token: str
    logprob: float


class TokenLogprob(TopLogprob):
    """One output token's log probability, with the likeliest tokens at its place (as
    many as the request's `SamplingOptions.logprobs`)."""

    top: tuple[TopLogprob, ...] = ()


Logprobs = tuple[TokenLogprob, ...]
"""The log probabilities of a run of output tokens, in order."""


class TokenChunk(StreamEvent):
    """Coalesced output text; `completion_tokens` counts all tokens so far."""

    type: Literal["chunk"] = "chunk"
    text: str
    token_count: int
    completion_tokens: int
    token_ids: tuple[int, ...] = Field(
        (),
        description="the chunk's tokens (where the engine has them): what a "
        "continuation gives the engine back",
    )
    logprobs: Logprobs = Field(
        (),
        description="the chunk's tokens' log probabilities, when the request asked for them",
        exclude_if=_unset,
    )


class GenerationDone(StreamEvent):
    type: Literal["done"] = "done"
    status: RequestStatus
    usage: Usage
    tool_calls: ToolCalls | None = Field(
        None,
        description="the tools the answer called: its text, parsed at its end",
        exclude_if=_unset,
    )


class GenerationError(StreamEvent):
    type: Literal["error"] = "error"
    code: str
    message: str
    retry_after: float | None = None


class AttemptStarted(Event):
    """The scheduler's marker on `chat.tokens` before it hands out an attempt: it fences
    every older attempt (their later events are dropped), and its offset is where a
    continuation stops reading earlier output."""

    type: Literal["attempt"] = "attempt"
    request_id: str
    attempt: int
    conversation_id: str
    worker_id: str
    sent_at: float = Field(default_factory=now)


# --- server-side tools: chat.tokens and chat.tools -------------------------------------


class ToolCallsMade(StreamEvent):
    """A round of a server-tools turn ended in tool calls (the worker freed its slot).

    It holds `calls_span(len(calls))` positions from `seq`: the safety stage's last text
    and one per call; the results follow, then the next round's output."""

    type: Literal["tool_calls"] = "tool_calls"
    calls: tuple[ToolCall, ...] = Field(min_length=1)
    completion_tokens: int = Field(0, description="tokens the answer has generated so far")


class ToolResult(StreamEvent):
    """What a call returned (or its error), written by the tools stage."""

    type: Literal["tool_result"] = "tool_result"
    call_id: str
    name: str
    content: str = Field(description='JSON text: the tool\'s result, or {"error": ...}')
    error: bool = False


def calls_span(calls: int) -> int:
    """Positions a `ToolCallsMade` of `calls` calls takes: text before them, then each."""
    return 1 + calls


TokenEvent = Annotated[
    TokenChunk | GenerationDone | GenerationError | AttemptStarted | ToolCallsMade | ToolResult,
    Field(discriminator="type"),
]


class ToolRound(Event):
    """On `chat.tools` (keyed by conversation): run `calls` for the round `request`
    generated, whose `ToolCallsMade` lies at `seq`; then queue the next round."""

    type: Literal["tool_round"] = "tool_round"
    schema_version: int = SAMPLING_DEFAULTS_VERSION
    request: GenerationRequest
    calls: ToolCalls
    seq: int
    completion_tokens: int = 0
    created_at: float = Field(default_factory=now)


# --- chat.deliver.<gateway_id> --------------------------------------------------------


class DeliveryEvent(Event):
    request_id: str
    attempt: int = 0
    seq: int = 0


class Delta(DeliveryEvent):
    type: Literal["delta"] = "delta"
    text: str
    logprobs: Logprobs = Field(
        (),
        description="log probabilities of the tokens whose text ends in this delta, "
        "when the request asked for them",
        exclude_if=_unset,
    )


class Queued(DeliveryEvent):
    type: Literal["queued"] = "queued"
    position: int
    eta_ms: int | None = None


class Routed(DeliveryEvent):
    """The router runs the request on another model than the one asked for."""

    type: Literal["routed"] = "routed"
    model: str
    requested_model: str
    reason: str


class Retract(DeliveryEvent):
    type: Literal["retract"] = "retract"
    message_id: str
    reason: str
    replacement: str = ""


class DeliveryError(DeliveryEvent):
    type: Literal["error"] = "error"
    code: str
    message: str
    retry_after: float | None = None


class DeliveryDone(DeliveryEvent):
    type: Literal["done"] = "done"
    status: RequestStatus
    usage: Usage
    model: str | None = Field(None, description="the model that answered")
    tool_calls: ToolCalls | None = Field(
        None,
        description="the tools the answer called (from the generation's done event)",
        exclude_if=_unset,
    )


class AnswerStarted(DeliveryEvent):
    """The gateway's marker on `chat.answers` before it queues a stored request: its
    offset is where the answer starts there (kept in the store), and it says what the
    answer is, for the recorder and for a gateway that resumes the stream."""

    type: Literal["started"] = "started"
    conversation_id: str
    message_id: str
    parent_id: str | None = None
    user_id: str
    model: str
    reply_to: str
    created_at: float = Field(default_factory=now)


class DeliveredToolCall(DeliveryEvent):
    """A server tool the model called: the stream's `event: tool_call`."""

    type: Literal["tool_call"] = "tool_call"
    call: ToolCall


class DeliveredToolResult(DeliveryEvent):
    """What a server tool returned: the stream's `event: tool_result`."""

    type: Literal["tool_result"] = "tool_result"
    call_id: str
    name: str
    content: str
    error: bool = False


ToolDelivery = DeliveredToolCall | DeliveredToolResult

DeliverEvent = Annotated[
    Delta | Queued | Routed | Retract | DeliveryError | DeliveryDone | ToolDelivery,
    Field(discriminator="type"),
]
AnswerEvent = Annotated[
    AnswerStarted | Delta | Queued | Routed | Retract | DeliveryError | DeliveryDone | ToolDelivery,
    Field(discriminator="type"),
]
"""What `chat.answers` carries: a stored answer's marker, then its delivery events."""


# --- chat.scheduler -------------------------------------------------------------------


class TierStatus(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    waiting: int
    expected_wait_s: float | None
    shedding: bool
    retry_after_s: float | None = None


class SchedulerStatus(Event):
    """The scheduler's view of each tier for the gateways: every second while it changes,
    every 10 s while it does not, at once when a tier starts or stops shedding."""

    type: Literal["scheduler_status"] = "scheduler_status"
    tiers: dict[Tier, TierStatus]
    shard: str = Field("", description="the scheduler shard speaking; empty: the unnamed one")
    models: tuple[str, ...] = Field(
        (), description="the models it decides for; empty: every model no named shard decides for"
    )
    workers: dict[str, int] = Field(
        default_factory=dict,
        description="model -> live workers serving it that take work (heartbeating, "
        "holding chat.work partitions, not draining)",
    )
    sent_at: float = Field(default_factory=now)


SchedulerEvent = Annotated[SchedulerStatus | SchedulerClaim, Field(discriminator="type")]


# --- chat.control ---------------------------------------------------------------------


class Cancel(Event):
    type: Literal["cancel"] = "cancel"
    request_id: str
    reason: str = "client_disconnected"
    held_by: str | None = Field(
        None,
        description="a conditional cancel: only while the gateway with this delivery "
        "topic still relays the stream (no other resumed it). The scheduler decides, and "
        "sends the cancel on; workers ignore it",
    )
    sent_at: float = Field(default_factory=now)


class Preempt(Event):
    """The scheduler takes a running request's slot back for a tenant kept waiting: the
    worker running `attempt` stops it and hands it back, and its next attempt continues
    the stream where it stopped."""

    type: Literal["preempt"] = "preempt"
    request_id: str
    worker_id: str
    attempt: int
    reason: str = "fair_share"
    sent_at: float = Field(default_factory=now)


class Reroute(Event):
    """A gateway resumed a stream: it relays it now, through `reply_to`."""

    type: Literal["reroute"] = "reroute"
    request_id: str
    reply_to: str


class GatewayHeartbeat(Event):
    """A gateway is alive: every second on `chat.control`, keyed by its delivery topic."""

    type: Literal["gateway"] = "gateway"
    gateway_id: str
    reply_to: str
    sent_at: float = Field(default_factory=now)


ControlEvent = Annotated[Cancel | Preempt | Reroute | GatewayHeartbeat, Field(discriminator="type")]
GatewayEvent = Annotated[
    Delta | Queued | Routed | Retract | DeliveryError | DeliveryDone | Reroute | ToolDelivery,
    Field(discriminator="type"),
]
"""What a gateway's own `chat.deliver.<gateway_id>` carries: its streams' delivery events,
and `Reroute` when another gateway resumed a stream it held."""


# --- chat.usage, chat.moderation, chat.dlq --------------------------------------------


class UsageEvent(Event):
    type: Literal["usage"] = "usage"
    request_id: str
    attempt: int = 0
    conversation_id: str
    user_id: str
    org_id: str
    tier: Tier
    model: str
    requested_model: str | None = None
    alias: str | None = Field(None, description="the alias asked for; `model` is its version")
    worker_id: str
    status: RequestStatus
    prompt_tokens: int
    completion_tokens: int = Field(description="tokens this attempt generated")
    prior_completion_tokens: int = Field(
        0, description="tokens earlier attempts streamed that this attempt continued"
    )
    cached_tokens: int
    gpu_ms: float = Field(description="wall time the request held an engine slot")
    cache: CacheOutcome | None = Field(
        None,
        description="hit: the gateway replayed a cached answer (worker_id "
        "`response-cache`, gpu_ms 0; its tokens are billed as the answer's)",
    )
    created_at: float = Field(default_factory=now)


class ModerationEvent(Event):
    type: Literal["moderation"] = "moderation"
    request_id: str | None = None
    conversation_id: str | None = None
    user_id: str | None = None
    message_id: str | None = None
    action: Literal["block_input", "retract"]
    category: str
    reason: str
    replacement: str = Field("", description="text stored in place of a retracted answer")
    created_at: float = Field(default_factory=now)


class RolloutSet(Event):
    """An alias's weights from now on, on `chat.rollout` keyed by the alias. Every
    gateway reads the topic from its start and the last record of each alias wins (Tansu
    never compacts; Kafka may, by this key)."""

    type: Literal["rollout"] = "rollout"
    alias: str = Field(min_length=1, max_length=128)
    weights: dict[str, float] = Field(
        description="version (a served model) -> weight: each >= 0, together > 0"
    )
    action: Literal["set", "rollback"] = "set"
    created_at: float = Field(default_factory=now)

    @field_validator("weights")
    @classmethod
    def _weights_pick_something(cls, weights: dict[str, float]) -> dict[str, float]:
        if any(not math.isfinite(w) or w < 0 for w in weights.values()):
            raise ValueError("every weight is a finite number >= 0")
        if not sum(weights.values()) > 0:
            raise ValueError("the weights sum to more than 0")
        return weights


Rating = Literal["up", "down"]


class FeedbackEvent(Event):
    """A user's thumbs up or down on an answer, on `chat.feedback` keyed by conversation."""

    type: Literal["feedback"] = "feedback"
    message_id: str
    conversation_id: str
    request_id: str | None = None
    user_id: str
    org_id: str
    model: str | None = Field(None, description="the version that answered")
    alias: str | None = Field(None, description="the alias it was picked for")
    rating: Rating
    text: str = ""
    created_at: float = Field(default_factory=now)


class DeadLetter(Event):
    """An event a stage could not parse or process, kept with the error."""

    type: Literal["dead_letter"] = "dead_letter"
    stage: str
    topic: str
    partition: int
    offset: int
    key: str | None
    value: str = Field(description="the original bytes, decoded as UTF-8 with replacement")
    truncated: bool = Field(False, description="value keeps only the first MiB of the original")
    error: str
    failed_at: float = Field(default_factory=now)
    value_base64: str | None = Field(
        None,
        description="the original bytes, base64, when they are not UTF-8 (value "
        "replaced what it could not decode); unset: value is the original exactly",
    )
    headers: tuple[tuple[str, str], ...] = Field(
        (), description="the original record's headers: (name, value as base64)"
    )
    timestamp_ms: int | None = Field(None, description="the original record's timestamp")
