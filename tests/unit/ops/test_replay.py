"""Replay's pure parts: records decoded per topic, merged into one order, shown as JSON;
a request's (and a conversation's) life picked out of them, with t_ms."""

from __future__ import annotations

import base64

from ops.bus_records import decoded, in_order, iso_time, record_line, window
from ops.request_life import (
    answer_requests,
    conversation_requests,
    life_lines,
    life_topics,
    owner,
)
from schemas import topics
from schemas.codec import encode
from schemas.events import (
    Cancel,
    DeadLetter,
    Delta,
    TokenChunk,
    UsageEvent,
    WorkAssignment,
)
from schemas.lifecycle import RequestStatus
from tests.support.records import DELIVER, rec, request


def chunk(seq: int, rid: str = "r1", attempt: int = 0) -> TokenChunk:
    return TokenChunk(
        request_id=rid,
        attempt=attempt,
        seq=seq,
        conversation_id="c1",
        message_id=f"m-{rid}",
        model="tiny-random",
        reply_to=DELIVER,
        text=f"t{seq}",
        token_count=1,
        completion_tokens=seq + 1,
    )


def usage(rid: str = "r1") -> UsageEvent:
    return UsageEvent(
        request_id=rid,
        conversation_id="c1",
        user_id="u",
        org_id="o",
        tier="free",
        model="tiny-random",
        worker_id="w",
        status=RequestStatus.FINISHED_STOPPED,
        prompt_tokens=3,
        completion_tokens=2,
        cached_tokens=0,
        gpu_ms=1.0,
    )


def test_each_topic_decodes_as_its_events_and_garbage_stays_raw():
    queued = request()
    assert decoded(rec("chat.requests.free", 0, 1, queued)).event == queued
    assert decoded(rec(topics.TOKENS, 0, 1, chunk(0))).event == chunk(0)
    assert decoded(rec(DELIVER, 0, 1, Delta(request_id="r1", seq=0, text="a"))).event.text == "a"
    garbage = decoded(rec(topics.TOKENS, 5, 1, b"{oops"))
    assert garbage.event is None and garbage.error
    line = record_line(garbage)
    assert (line["raw"], line["raw_encoding"], line["event"]) == ("{oops", "text", None)
    binary = record_line(decoded(rec(topics.USAGE, 0, 1, b"\xff\x00")))
    assert binary["raw_encoding"] == "base64"
    assert base64.b64decode(binary["raw"]) == b"\xff\x00"
    unknown = decoded(rec("someone.elses", 0, 1, encode(usage())))
    assert unknown.event is None and "no event schema" in unknown.error


def test_record_line_says_where_and_when():
    line = record_line(
        decoded(rec(topics.USAGE, 7, 1_700_000_000_123, usage(), partition=2)),
        since_ms=1_700_000_000_000,
    )
    assert line["topic"] == topics.USAGE and (line["partition"], line["offset"]) == (2, 7)
    assert line["timestamp"] == "2023-11-14T22:13:20.123Z" == iso_time(1_700_000_000_123)
    assert (line["timestamp_ms"], line["t_ms"], line["key"]) == (1_700_000_000_123, 123, "c1")
    assert line["event"]["type"] == "usage" and line["event"]["request_id"] == "r1"


def test_in_order_merges_by_time_and_never_reorders_a_partition():
    a0 = decoded(rec(topics.TOKENS, 0, 100, chunk(0)))
    a1 = decoded(rec(topics.TOKENS, 1, 90, chunk(1)))  # a clock that went back: stays after
    same_ms_request = decoded(rec("chat.requests.free", 3, 100, request()))
    usage_late = decoded(rec(topics.USAGE, 0, 105, usage()))
    ordered = in_order([a1, usage_late, a0, same_ms_request, a0])
    assert [(r.record.topic, r.record.offset) for r in ordered] == [
        ("chat.requests.free", 3),
        (topics.TOKENS, 0),
        (topics.TOKENS, 1),
        (topics.USAGE, 0),
    ]


def test_window_filters_time_key_and_limit():
    reads = [
        decoded(rec(topics.USAGE, i, 1000 + i * 10, usage(), key=b"k%d" % (i % 2)))
        for i in range(10)
    ]
    assert [r.record.offset for r in window(reads, since_ms=1030, until_ms=1060)] == [3, 4, 5, 6]
    assert [r.record.offset for r in window(reads, key="k1", limit=3)] == [1, 3, 5]
    assert window(reads, since_ms=5000) == []


def test_a_requests_life_is_its_records_in_order_with_t_ms():
    assign = WorkAssignment(worker_id="w", request=request())
    other = request("r2")
    letter = DeadLetter(
        stage="safety",
        topic=topics.TOKENS,
        partition=0,
        offset=9,
        key="c1",
        value='{"request_id": "r1", "bad": true}',
        error="ValueError: x",
    )
    reads = [
        decoded(r)
        for r in [
            rec("chat.requests.free", 0, 1000, request()),
            rec("chat.requests.free", 1, 1001, other),
            rec(topics.WORK, 0, 1003, assign, key=None),
            rec(topics.TOKENS, 0, 1010, chunk(0)),
            rec(topics.TOKENS, 1, 1011, chunk(0, rid="r2")),
            rec(topics.TOKENS, 2, 1012, b'{"request_id": "r1", "seq": "broken"'),
            rec(DELIVER, 0, 1015, Delta(request_id="r1", seq=0, text="t0")),
            rec(topics.CONTROL, 0, 1020, Cancel(request_id="r1"), key=b"r1"),
            rec(topics.USAGE, 0, 1030, usage(), key=b"u"),
            rec(topics.DLQ, 0, 1040, letter),
        ]
    ]
    lines = life_lines(reads, ["r1"])
    assert [(line["topic"], line["offset"]) for line in lines] == [
        ("chat.requests.free", 0),
        (topics.WORK, 0),
        (topics.TOKENS, 0),
        (topics.TOKENS, 2),
        (DELIVER, 0),
        (topics.CONTROL, 0),
        (topics.USAGE, 0),
        (topics.DLQ, 0),
    ]
    assert [line["t_ms"] for line in lines] == [0, 3, 10, 12, 15, 20, 30, 40]
    assert {line["request_id"] for line in lines} == {"r1"}
    assert owner(reads[1], ["r1"]) is None and owner(reads[1], ["r1", "r2"]) == "r2"


def test_a_conversation_is_its_requests_each_timed_from_its_own_start():
    reads = [
        decoded(r)
        for r in [
            rec("chat.requests.pro", 0, 2000, request("r2")),
            rec("chat.requests.free", 0, 1000, request("r1")),
            rec("chat.requests.free", 1, 1500, request("x", cid="elsewhere")),
            rec(topics.TOKENS, 0, 1100, chunk(0, rid="r1")),
            rec(topics.TOKENS, 1, 2100, chunk(0, rid="r2")),
        ]
    ]
    assert conversation_requests(reads, "c1") == ["r1", "r2"]
    lines = life_lines(reads, ["r1", "r2"])
    assert [(line["request_id"], line["t_ms"]) for line in lines] == [
        ("r1", 0),
        ("r1", 100),
        ("r2", 0),
        ("r2", 100),
    ]


def test_an_answer_is_named_by_the_requests_queued_to_write_it():
    reads = [
        decoded(r)
        for r in [
            rec("chat.requests.free", 0, 1000, request("r1")),
            rec("chat.requests.free", 1, 1200, request("r2")),
            rec(topics.TOKENS, 0, 1100, chunk(0, rid="r1")),
        ]
    ]
    assert answer_requests(reads, "m-r2") == ["r2"]
    assert answer_requests(reads, "m-r1") == ["r1"]
    assert answer_requests(reads, "m-none") == []


def test_life_topics_are_the_fixed_ones_the_broker_has_and_every_delivery_topic():
    have = [
        topics.TOKENS,
        "chat.deliver.b",
        "chat.requests.free",
        "chat.deliver.a",
        topics.WORKERS,
        topics.DLQ,
    ]
    assert life_topics(have) == [
        "chat.requests.free",
        topics.TOKENS,
        topics.DLQ,
        "chat.deliver.a",
        "chat.deliver.b",
    ]


def test_every_attempt_is_shown_even_the_fenced_one():
    """A worker lost mid-answer: the scheduler dispatches attempt 1. The replay shows both
    assignments and both attempts' chunks (a late chunk of attempt 0 too): what the bus
    holds, not what the answer rule keeps."""
    retry = request().model_copy(update={"attempt": 1})
    reads = [
        decoded(r)
        for r in [
            rec("chat.requests.free", 0, 1000, request()),
            rec(topics.WORK, 0, 1001, WorkAssignment(worker_id="w1", request=request()), key=None),
            rec(topics.TOKENS, 0, 1010, chunk(0)),
            rec(topics.WORK, 1, 1500, WorkAssignment(worker_id="w2", request=retry), key=None),
            rec(topics.TOKENS, 1, 1510, chunk(1, attempt=1)),
            rec(topics.TOKENS, 2, 1520, chunk(1, attempt=0)),
        ]
    ]
    lines = life_lines(reads, ["r1"])

    def attempt(line):
        event = line["event"]
        return event["request"]["attempt"] if event["type"] == "work" else event["attempt"]

    assert [(line["topic"], attempt(line)) for line in lines] == [
        ("chat.requests.free", 0),
        (topics.WORK, 0),
        (topics.TOKENS, 0),
        (topics.WORK, 1),
        (topics.TOKENS, 1),
        (topics.TOKENS, 0),
    ]
    assert [line["event"].get("worker_id") for line in lines if line["topic"] == topics.WORK] == [
        "w1",
        "w2",
    ]
