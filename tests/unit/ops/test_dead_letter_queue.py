"""The dead-letter queue's pure side: a dead letter keeps its record exactly (bytes and
headers), `dlq list` rows, ids, and the record `dlq retry` sends again."""

from __future__ import annotations

import base64

import pytest
from aiokafka.structs import ConsumerRecord

from bus.dead_letters import MAX_KEPT_BYTES, dead_letter
from ops.bus_records import BusRecord, decoded
from ops.dead_letter_queue import (
    RETRY_HEADER,
    dead_letter_id,
    original_record,
    parse_dead_letter_id,
    retry_of,
    rows,
)
from schemas import topics
from schemas.codec import decode, encode
from schemas.events import DeadLetter


class CapturingPublisher:
    def __init__(self) -> None:
        self.sent: list[tuple[str, DeadLetter, str | None]] = []

    async def send_and_wait(self, topic, event, key=None, partition=None):
        self.sent.append((topic, event, key))


def consumer_record(value: bytes, headers=(), key: bytes | None = b"c1") -> ConsumerRecord:
    return ConsumerRecord(
        topic=topics.TOKENS,
        partition=2,
        offset=41,
        timestamp=1_000,
        timestamp_type=0,
        key=key,
        value=value,
        checksum=None,
        serialized_key_size=0,
        serialized_value_size=len(value),
        headers=list(headers),
    )


async def letter_of(value: bytes, headers=()) -> DeadLetter:
    publisher = CapturingPublisher()
    await dead_letter(publisher, "safety", consumer_record(value, headers), "ValueError: bad")
    [(topic, letter, key)] = publisher.sent
    assert (topic, key) == (topics.DLQ, "c1")
    return decode(DeadLetter, encode(letter))  # as a reader of chat.dlq gets it


@pytest.mark.parametrize("value", [b'{"type": "chunk"', "héllo".encode(), b"\xff\xfe{\x00", b""])
async def test_a_dead_letter_gives_back_the_exact_record(value):
    headers = [("event-type", b"chunk"), ("traceparent", b"00-abc-01"), ("bin", b"\x00\xff")]
    letter = await letter_of(value, headers)
    assert (letter.topic, letter.partition, letter.offset, letter.timestamp_ms) == (
        topics.TOKENS,
        2,
        41,
        1_000,
    )
    assert (letter.value_base64 is None) == (value.decode(errors="replace").encode() == value)
    record = original_record(letter, "chat.dlq-0-7")
    assert (record.topic, record.partition, record.key, record.value) == (
        topics.TOKENS,
        2,
        b"c1",
        value,
    )
    assert record.headers == [*headers, (RETRY_HEADER, b"chat.dlq-0-7")]


async def test_a_truncated_dead_letter_cannot_be_sent_again():
    letter = await letter_of(b"x" * (MAX_KEPT_BYTES + 10))
    assert letter.truncated and len(letter.value) == MAX_KEPT_BYTES
    with pytest.raises(ValueError, match="first MiB"):
        original_record(letter, "chat.dlq-0-1")


async def test_a_retry_of_a_retry_is_marked_with_the_newer_id_only():
    first = await letter_of(b"{", [("event-type", b"chunk"), (RETRY_HEADER, b"chat.dlq-0-1")])
    again = original_record(first, "chat.dlq-0-9")
    assert [v for n, v in again.headers if n == RETRY_HEADER] == [b"chat.dlq-0-9"]


def test_an_old_dead_letter_without_the_new_fields_still_retries():
    old = decode(
        DeadLetter,
        b'{"type": "dead_letter", "stage": "billing", "topic": "chat.usage",'
        b' "partition": 1, "offset": 3, "key": null, "value": "{x",'
        b' "error": "E"}',
    )
    record = original_record(old, "chat.dlq-0-0")
    assert (record.key, record.value, record.headers) == (
        None,
        b"{x",
        [(RETRY_HEADER, b"chat.dlq-0-0")],
    )


@pytest.mark.parametrize(
    ("text", "expected"), [("chat.dlq-0-12", (0, 12)), ("3-4", (3, 4)), (" chat.dlq-1-0 ", (1, 0))]
)
def test_ids(text, expected):
    assert parse_dead_letter_id(text) == expected
    assert parse_dead_letter_id(dead_letter_id(*expected)) == expected


@pytest.mark.parametrize("text", ["", "12", "chat.dlq-x-1", "chat.tokens-0-1", "0-1-2"])
def test_not_ids(text):
    with pytest.raises(ValueError, match="not a dead letter id"):
        parse_dead_letter_id(text)


def _letter(topic: str, failed_at: float, headers=()) -> DeadLetter:
    return DeadLetter(
        stage="s",
        topic=topic,
        partition=0,
        offset=5,
        key="k",
        value="{",
        error="ValueError: no",
        failed_at=failed_at,
        headers=tuple(headers),
    )


def test_list_rows_filter_by_topic_and_time_and_show_retries():
    retried = [(RETRY_HEADER, base64.b64encode(b"chat.dlq-0-0").decode())]
    reads = [
        decoded(BusRecord(topics.DLQ, p, o, ts, b"k", encode(letter)))
        for p, o, ts, letter in [
            (1, 0, 3000, _letter(topics.USAGE, 3.0, retried)),
            (0, 0, 1000, _letter(topics.USAGE, 1.0)),
            (0, 1, 2000, _letter(topics.TOKENS, 2.0)),
        ]
    ] + [decoded(BusRecord(topics.DLQ, 0, 2, 2500, None, b"not a dead letter"))]
    listed = rows(reads)
    assert [r["id"] for r in listed] == ["chat.dlq-0-0", "chat.dlq-0-1", "chat.dlq-1-0"]
    assert listed[0] == {
        "id": "chat.dlq-0-0",
        "when": "1970-01-01T00:00:01.000Z",
        "topic": topics.USAGE,
        "partition": 0,
        "offset": 5,
        "stage": "s",
        "key": "k",
        "error": "ValueError: no",
        "truncated": False,
        "retry_of": None,
    }
    assert listed[2]["retry_of"] == "chat.dlq-0-0"
    assert [r["id"] for r in rows(reads, topic=topics.USAGE)] == ["chat.dlq-0-0", "chat.dlq-1-0"]
    assert [r["id"] for r in rows(reads, since_ms=2000)] == ["chat.dlq-0-1", "chat.dlq-1-0"]


def test_retry_of_finds_the_record_marked_with_the_id():
    plain = BusRecord(topics.USAGE, 0, 6, 1, None, b"{")
    marked = BusRecord(topics.USAGE, 0, 9, 1, None, b"{", ((RETRY_HEADER, b"chat.dlq-0-4"),))
    assert retry_of([plain, marked], "chat.dlq-0-4") == marked
    assert retry_of([plain, marked], "chat.dlq-0-5") is None
