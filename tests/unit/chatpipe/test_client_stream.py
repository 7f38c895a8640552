"""`replay request --as-client`: the native SSE stream rebuilt from the bus, written by
the gateway's own functions after the gateway relay's rule."""

from __future__ import annotations

import pytest

from chatpipe.client_stream import client_stream
from ops.bus_records import decoded
from schemas import topics
from schemas.events import DeliveryDone, Delta, Queued, Retract, Usage
from schemas.lifecycle import RequestStatus
from schemas.sse import parse_messages
from tests.support.records import DELIVER, rec, request


def done(seq: int, status=RequestStatus.FINISHED_STOPPED) -> DeliveryDone:
    return DeliveryDone(
        request_id="r1", seq=seq, status=status, usage=Usage(prompt_tokens=3, completion_tokens=2)
    )


def messages(stream) -> list[tuple[str | None, str | None, str]]:
    return [(m.event, m.id, m.data) for m in parse_messages(stream.body.decode())]


def test_the_stream_is_the_request_event_what_the_relay_shows_then_done():
    reads = [
        decoded(r)
        for r in [
            rec("chat.requests.free", 0, 1, request()),
            rec(DELIVER, 0, 2, Queued(request_id="r1", position=2)),
            rec(DELIVER, 1, 3, Delta(request_id="r1", seq=0, text="Hel")),
            rec(DELIVER, 2, 4, Delta(request_id="r1", seq=0, text="Hel")),  # a redelivery
            rec(DELIVER, 3, 5, Delta(request_id="r2", seq=1, text="other request")),
            rec(DELIVER, 4, 6, Delta(request_id="r1", seq=2, text="lo")),
            rec(DELIVER, 5, 7, Queued(request_id="r1", position=1)),  # after output: not shown
            rec(DELIVER, 6, 8, done(3)),
            rec(DELIVER, 7, 9, Delta(request_id="r1", seq=4, text="after the end")),
            rec(topics.ANSWERS, 0, 6, Delta(request_id="r1", seq=0, text="Hel")),
        ]
    ]
    stream = client_stream(reversed(reads), "r1")
    assert stream.ended and stream.source == DELIVER
    got = messages(stream)
    assert got[0] == (
        "request",
        None,
        '{"request_id":"r1","message_id":"m-r1","user_message_id":"u-r1"}',
    )
    assert got[1:4] == [
        ("queued", None, '{"position":2,"eta_ms":null}'),
        ("delta", "0", '{"delta":"Hel"}'),
        ("delta", "2", '{"delta":"lo"}'),
    ]
    assert got[4][:2] == ("done", "3") and '"finish_reason":"stop"' in got[4][2]
    assert got[5] == (None, None, "[DONE]") and len(got) == 6


def test_a_retracted_stream_and_chat_answers_when_the_delivery_topic_is_gone():
    reads = [
        decoded(r)
        for r in [
            rec("chat.requests.free", 0, 1, request()),
            rec(topics.ANSWERS, 1, 3, Delta(request_id="r1", seq=0, text="bob@")),
            rec(
                topics.ANSWERS,
                2,
                4,
                Retract(
                    request_id="r1", seq=1, message_id="m-r1", reason="pii", replacement="[removed]"
                ),
            ),
            rec(topics.ANSWERS, 3, 5, done(2, RequestStatus.FINISHED_FILTERED)),
        ]
    ]
    stream = client_stream(reads, "r1")
    assert stream.source == topics.ANSWERS and stream.ended
    assert [(m[0], m[1]) for m in messages(stream)] == [
        ("request", None),
        ("delta", "0"),
        ("retract", "1"),
        ("done", "2"),
        (None, None),
    ]


def test_a_stream_without_its_end_has_no_done_marker():
    reads = [
        decoded(rec("chat.requests.free", 0, 1, request())),
        decoded(rec(DELIVER, 0, 2, Delta(request_id="r1", seq=0, text="so far"))),
    ]
    stream = client_stream(reads, "r1")
    assert not stream.ended and [m[0] for m in messages(stream)] == ["request", "delta"]
    nothing = client_stream(reads[:1], "r1")
    assert nothing.source is None and [m[0] for m in messages(nothing)] == ["request"]


def test_no_request_no_stream():
    with pytest.raises(LookupError):
        client_stream([decoded(rec(DELIVER, 0, 2, Delta(request_id="r1", seq=0, text="x")))], "r1")
