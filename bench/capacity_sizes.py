"""What one turn puts on each topic and in Cassandra, in bytes: real `schemas` events
encoded with the project's codec (`schemas.codec.encode` and `headers`), and the rows the
Cassandra store binds (`conversations.cassandra_schema`). Ids, timestamps and text are
fixed, so the sizes are repeatable."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import astuple

from bench.capacity_inputs import Inputs, mean_prompt_tokens
from conversations.cassandra_schema import message_values
from conversations.store import RequestRecord, StoredMessage
from schemas.codec import encode, headers
from schemas.events import (
    AnswerStarted,
    AttemptStarted,
    ChatMessage,
    DeliveryDone,
    Delta,
    Event,
    GatewayHeartbeat,
    GenerationDone,
    GenerationRequest,
    Role,
    SamplingOptions,
    TokenChunk,
    Usage,
    UsageEvent,
    WorkAssignment,
    WorkerHeartbeat,
)
from schemas.lifecycle import RequestStatus
from schemas.topics import Tier

CONVERSATION = "3f1c9a7e52b84d0e9c6a1b2d3e4f5a6b"
MESSAGE = "8e2d4c6b0a1f4e3d9c8b7a6f5e4d3c2b"
PARENT = "1a2b3c4d5e6f47a8b9c0d1e2f3a4b5c6"
REQUEST = "9f8e7d6c5b4a43928170f6e5d4c3b2a1"
USER, ORG, MODEL = "user-7f3a9c2e41b8", "org-5d21e9a0", "llama-3.1-70b-instruct"
GATEWAY, WORKER = "gw-4b7e2a91", "worker-a3c9e1f0"
REPLY_TO = f"chat.deliver.{GATEWAY}"
AT = 1796083200.123456


def text(tokens: float, i: Inputs) -> str:
    """English-like text of `tokens` tokens at the gateway's characters per token."""
    chars = round(tokens * i.chars_per_token)
    return ("lorem ipsum dolor sit amet " * (chars // 27 + 1))[:chars]


def record_bytes(event: Event, key: str, i: Inputs) -> int:
    """A record's bytes on the wire, uncompressed: value, key, headers, overhead."""
    head = sum(len(name) + len(value) for name, value in headers(event))
    return len(encode(event)) + len(key) + head + round(i.record_overhead_bytes)


def request_event(turn: int, i: Inputs) -> GenerationRequest:
    """The request of the conversation's `turn` (1-based): system prompt, history, message."""
    history: list[ChatMessage] = [
        ChatMessage(role=Role.SYSTEM, content=text(i.system_prompt_tokens, i))
    ]
    for _ in range(turn - 1):
        history += [
            ChatMessage(role=Role.USER, content=text(i.user_message_tokens, i)),
            ChatMessage(role=Role.ASSISTANT, content=text(i.output_tokens_per_turn, i)),
        ]
    history.append(ChatMessage(role=Role.USER, content=text(i.user_message_tokens, i)))
    return GenerationRequest(
        request_id=REQUEST,
        conversation_id=CONVERSATION,
        message_id=MESSAGE,
        parent_id=PARENT,
        user_id=USER,
        org_id=ORG,
        tier=Tier.PRO,
        model=MODEL,
        messages=tuple(history),
        sampling=SamplingOptions(max_tokens=1024),
        reply_to=REPLY_TO,
        deadline=AT + 600,
        cache_salt=ORG,
        created_at=AT,
    )


def tokens_per_chunk(i: Inputs) -> float:
    """Tokens in one chat.tokens event: a stream's rate over the coalescing interval."""
    return max(1.0, i.stream_tokens_per_s * i.coalesce_ms / 1000)


def turn_records(i: Inputs) -> dict[str, tuple[float, float]]:
    """Topic -> (events per turn, mean bytes per event) for one turn, from real events."""
    n = round(i.turns_per_conversation)
    request = sum(record_bytes(request_event(k, i), CONVERSATION, i) for k in range(1, n + 1))
    work = sum(
        record_bytes(
            WorkAssignment(
                worker_id=WORKER, incarnation=WORKER, request=request_event(k, i), dispatched_at=AT
            ),
            CONVERSATION,
            i,
        )
        for k in range(1, n + 1)
    )
    chunks = i.output_tokens_per_turn / tokens_per_chunk(i)
    usage = _usage(i)
    started = AttemptStarted(
        request_id=REQUEST, attempt=0, conversation_id=CONVERSATION, worker_id=WORKER, sent_at=AT
    )
    generated = GenerationDone(**_stream(), seq=201, status=STOPPED, usage=usage)
    done = DeliveryDone(request_id=REQUEST, seq=201, status=STOPPED, usage=usage, model=MODEL)
    marker = AnswerStarted(
        request_id=REQUEST,
        conversation_id=CONVERSATION,
        message_id=MESSAGE,
        parent_id=PARENT,
        user_id=USER,
        model=MODEL,
        reply_to=REPLY_TO,
        created_at=AT,
    )
    used = UsageEvent(
        request_id=REQUEST,
        conversation_id=CONVERSATION,
        user_id=USER,
        org_id=ORG,
        tier=Tier.PRO,
        model=MODEL,
        worker_id=WORKER,
        status=STOPPED,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        prior_completion_tokens=0,
        cached_tokens=usage.cached_tokens,
        gpu_ms=10234.5,
        created_at=AT,
    )

    def stream(per_chunk: Callable[[int], Event], *ends: Event) -> tuple[float, float]:
        """`chunks` events of `per_chunk`, then `ends`: (events, mean bytes)."""
        sizes = [record_bytes(end, CONVERSATION, i) for end in ends]
        total = chunks * _at_mean_chunk(lambda k: record_bytes(per_chunk(k), CONVERSATION, i), i)
        return chunks + len(ends), (total + sum(sizes)) / (chunks + len(ends))

    return {
        "chat.requests.<tier>": (1, request / n),
        "chat.work": (1, work / n),
        "chat.tokens": stream(lambda k: _chunk(k, i), started, generated),
        "chat.deliver.<gateway>": stream(lambda k: _delta(k, i), done),
        "chat.answers": stream(lambda k: _delta(k, i), marker, done),
        "chat.usage": (1, record_bytes(used, USER, i)),
    }


STOPPED = RequestStatus.FINISHED_STOPPED


def _usage(i: Inputs) -> Usage:
    prompt = round(mean_prompt_tokens(i))
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=round(i.output_tokens_per_turn),
        cached_tokens=round(prompt * i.prefix_cached_fraction),
    )


def _stream() -> dict:
    return {
        "request_id": REQUEST,
        "conversation_id": CONVERSATION,
        "message_id": MESSAGE,
        "parent_id": PARENT,
        "model": MODEL,
        "reply_to": REPLY_TO,
        "tier": Tier.PRO,
    }


def _chunk(tokens: int, i: Inputs) -> TokenChunk:
    return TokenChunk(
        **_stream(),
        seq=120,
        text=text(tokens, i),
        token_count=tokens,
        completion_tokens=250,
        token_ids=tuple(range(100000, 100000 + tokens)),
    )


def _delta(tokens: int, i: Inputs) -> Delta:
    return Delta(request_id=REQUEST, seq=120, text=text(tokens, i))


def _at_mean_chunk(size_of: Callable[[int], int], i: Inputs) -> float:
    """`size_of(tokens)` at the mean tokens per chunk, between its whole neighbours."""
    mean = tokens_per_chunk(i)
    low = math.floor(mean)
    return size_of(low) + (mean - low) * (size_of(low + 1) - size_of(low))


def heartbeat_bytes(streams_per_worker: float, i: Inputs) -> tuple[int, int]:
    """(worker heartbeat, gateway heartbeat) bytes; a worker's lists its active requests."""
    active = tuple(f"{k:032x}" for k in range(math.ceil(streams_per_worker)))
    worker = WorkerHeartbeat(
        worker_id=WORKER,
        incarnation=WORKER,
        model=MODEL,
        partitions=(7,),
        max_slots=256,
        active=active,
        consumed={7: 123456789},
        assignments={r: (7, 123456789) for r in active},
        running=len(active),
        peak_running=len(active),
        free_kv_blocks=12000,
        sent_at=AT,
    )
    gateway = GatewayHeartbeat(gateway_id=GATEWAY, reply_to=REPLY_TO, sent_at=AT)
    return record_bytes(worker, WORKER, i), record_bytes(gateway, GATEWAY, i)


def stored_bytes_per_turn(i: Inputs) -> float:
    """Raw bytes a turn adds to Cassandra: two message rows, their id rows, the request row,
    the ledger's charged row; the values as the stores bind them."""

    def row(values: tuple) -> float:
        size = sum(
            len(v.encode())
            if isinstance(v, str)
            else 8
            if isinstance(v, float)
            else 4
            if isinstance(v, int)
            else 0
            for v in values
        )
        return size + i.row_overhead_bytes

    usage = _usage(i)

    def message(role: Role, tokens: float) -> tuple:
        return message_values(
            StoredMessage(
                MESSAGE,
                CONVERSATION,
                11,
                role,
                text(tokens, i),
                PARENT,
                MODEL,
                usage.completion_tokens,
                STOPPED,
                REQUEST,
                AT,
                usage.prompt_tokens,
                usage.cached_tokens,
            )
        )

    messages = row(message(Role.USER, i.user_message_tokens)) + row(
        message(Role.ASSISTANT, i.output_tokens_per_turn)
    )
    ids = 2 * row((MESSAGE, CONVERSATION, 11))
    request = row(
        astuple(
            RequestRecord(REQUEST, CONVERSATION, MESSAGE, USER, 3, 123456789, REPLY_TO, AT, ORG)
        )
    )
    charge = row((REQUEST, usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens, AT))
    return messages + ids + request + charge
