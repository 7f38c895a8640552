"""Every event round-trips through the wire encoding; bad bytes raise one error type."""

from __future__ import annotations

import pytest

from schemas.codec import (
    CONTROL_EVENT,
    DELIVER_EVENT,
    TOKEN_EVENT,
    EventDecodeError,
    decode,
    encode,
    headers,
)
from schemas.events import (
    Cancel,
    ChatMessage,
    DeadLetter,
    DeliveryDone,
    DeliveryError,
    Delta,
    GenerationDone,
    GenerationError,
    GenerationRequest,
    ModerationEvent,
    Queued,
    Reroute,
    Retract,
    Role,
    TokenChunk,
    Usage,
    UsageEvent,
    WorkAssignment,
    WorkerHeartbeat,
)
from schemas.lifecycle import RequestStatus
from schemas.topics import (
    Tier,
    deliver_topic,
    delivering_gateway,
    requests_topic,
    shared_topics,
)

REQUEST = GenerationRequest(
    request_id="r1",
    conversation_id="c1",
    message_id="m1",
    parent_id="p1",
    user_id="u",
    org_id="o",
    tier=Tier.PRO,
    model="tiny-random",
    messages=(
        ChatMessage(role=Role.SYSTEM, content="be nice"),
        ChatMessage(role=Role.USER, content="héllo ✓"),
    ),
    reply_to="chat.deliver.gw1",
    deadline=123.5,
    cache_salt="o",
)
STREAM = dict(
    request_id="r1",
    seq=1,
    conversation_id="c1",
    message_id="m1",
    model="tiny-random",
    reply_to="chat.deliver.gw1",
)

CASES = [
    (GenerationRequest, REQUEST),
    (WorkAssignment, WorkAssignment(worker_id="w", request=REQUEST)),
    (
        WorkerHeartbeat,
        WorkerHeartbeat(
            worker_id="w",
            model="tiny-random",
            partitions=(0, 3),
            max_slots=4,
            active=("r1",),
            consumed={0: 7},
        ),
    ),
    (TOKEN_EVENT, TokenChunk(**STREAM, text="hi", token_count=1, completion_tokens=1)),
    (
        TOKEN_EVENT,
        GenerationDone(
            **STREAM,
            status=RequestStatus.FINISHED_LENGTH,
            usage=Usage(prompt_tokens=3, completion_tokens=2),
        ),
    ),
    (TOKEN_EVENT, GenerationError(**STREAM, code="engine_error", message="boom")),
    (DELIVER_EVENT, Delta(request_id="r1", seq=1, text="hi")),
    (DELIVER_EVENT, Queued(request_id="r1", position=3, eta_ms=1200)),
    (DELIVER_EVENT, Retract(request_id="r1", message_id="m1", reason="pii")),
    (
        DELIVER_EVENT,
        DeliveryError(request_id="r1", code="overloaded", message="busy", retry_after=5),
    ),
    (
        DELIVER_EVENT,
        DeliveryDone(request_id="r1", status=RequestStatus.FINISHED_STOPPED, usage=Usage()),
    ),
    (CONTROL_EVENT, Cancel(request_id="r1")),
    (CONTROL_EVENT, Reroute(request_id="r1", reply_to="chat.deliver.gw2")),
    (
        UsageEvent,
        UsageEvent(
            request_id="r1",
            conversation_id="c1",
            user_id="u",
            org_id="o",
            tier=Tier.FREE,
            model="tiny-random",
            worker_id="w",
            status=RequestStatus.FINISHED_ABORTED,
            prompt_tokens=1,
            completion_tokens=2,
            cached_tokens=0,
            gpu_ms=3.5,
        ),
    ),
    (
        ModerationEvent,
        ModerationEvent(
            request_id="r1", conversation_id="c1", action="retract", category="pii", reason="email"
        ),
    ),
    (
        DeadLetter,
        DeadLetter(stage="s", topic="t", partition=0, offset=1, key=None, value="{", error="bad"),
    ),
]


@pytest.mark.parametrize("kind,event", CASES, ids=lambda v: type(v).__name__)
def test_round_trip(kind, event):
    assert decode(kind, encode(event)) == event
    assert dict(headers(event))["schema-version"] == str(event.schema_version).encode()


def test_event_type_header_names_the_event():
    assert dict(headers(Cancel(request_id="r")))["event-type"] == b"cancel"


def test_unknown_fields_are_ignored_for_forward_compatibility():
    raw = encode(Cancel(request_id="r"))[:-1] + b',"added_later":1}'
    assert decode(CONTROL_EVENT, raw) == Cancel(
        request_id="r", sent_at=decode(CONTROL_EVENT, raw).sent_at
    )


@pytest.mark.parametrize("raw", [None, b"", b"{", b"[]", b'{"type":"nope"}', b"\xff\xfe"])
def test_bad_bytes_raise_decode_error(raw):
    with pytest.raises(EventDecodeError):
        decode(TOKEN_EVENT, raw)


def test_topic_names():
    assert requests_topic("pro") == "chat.requests.pro"
    assert deliver_topic("gw1", "a1b2c3") == "chat.deliver.gw1.a1b2c3"
    assert delivering_gateway(deliver_topic("gateway-7d4b.x2x5q", "a1b2c3")) == "gateway-7d4b.x2x5q"
    assert len(set(shared_topics())) == len(shared_topics()) == 15
    with pytest.raises(ValueError):
        requests_topic("platinum")


def test_finish_reason_map_covers_every_terminal_state():
    terminal = [s for s in RequestStatus if s.is_finished]
    assert {s.openai_finish_reason for s in terminal} == {
        "stop",
        "length",
        "content_filter",
        "error",
    }
    assert RequestStatus.RUNNING.openai_finish_reason is None
