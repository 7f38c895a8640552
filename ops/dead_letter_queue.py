"""The dead-letter queue as an operator sees it (pure): what each dead letter says,
its id, and the original record that `chatpipe dlq retry` sends again.

A dead letter's id is where it lies on `chat.dlq`: `chat.dlq-<partition>-<offset>`.
A retry re-publishes the original record (bytes, key, headers) to its topic and
partition with one more header, `chatpipe-retry-of: <id>`: that record is the bus's
own note that the dead letter was retried (a second retry finds it and asks for
--force), and should the stage fail on it again, its new dead letter keeps the header,
so `dlq list` shows which dead letter it retries."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ops.bus_records import BusRecord, ReadRecord, iso_time
from schemas.events import DeadLetter
from schemas.topics import DLQ

RETRY_HEADER = "chatpipe-retry-of"
_ID = re.compile(r"^(?:" + re.escape(DLQ) + r"-)?(\d+)-(\d+)$")
LIST_FIELDS = ("id", "when", "topic", "partition", "offset", "stage", "key", "retry_of", "error")
"""The columns of `dlq list` (its --json gives `truncated` too)."""


def dead_letter_id(partition: int, offset: int) -> str:
    return f"{DLQ}-{partition}-{offset}"


def parse_dead_letter_id(text: str) -> tuple[int, int]:
    """(partition, offset) on chat.dlq of `chat.dlq-P-O` (or `P-O`); ValueError else."""
    match = _ID.match(text.strip())
    if match is None:
        raise ValueError(
            f"not a dead letter id: {text!r} (ids look like {DLQ}-0-12; see `chatpipe dlq list`)"
        )
    return int(match.group(1)), int(match.group(2))


def header_value(headers: Iterable[tuple[str, bytes]], name: str) -> str | None:
    return next((value.decode(errors="replace") for key, value in headers if key == name), None)


def original_headers(letter: DeadLetter) -> list[tuple[str, bytes]]:
    return [(name, base64.b64decode(value)) for name, value in letter.headers]


def dead_letter_row(read: ReadRecord) -> dict[str, Any] | None:
    """What `dlq list` shows of a record of chat.dlq; None if it is no dead letter."""
    letter = read.event
    if not isinstance(letter, DeadLetter):
        return None
    r = read.record
    return {
        "id": dead_letter_id(r.partition, r.offset),
        "when": iso_time(round(letter.failed_at * 1000)),
        "topic": letter.topic,
        "partition": letter.partition,
        "offset": letter.offset,
        "stage": letter.stage,
        "key": letter.key,
        "error": letter.error,
        "truncated": letter.truncated,
        "retry_of": header_value(original_headers(letter), RETRY_HEADER),
    }


def rows(
    reads: Iterable[ReadRecord], topic: str | None = None, since_ms: int | None = None
) -> list[dict[str, Any]]:
    """The dead letters of `reads` in chat.dlq order, of source `topic` and recorded at
    or after `since_ms` when given."""
    listed = []
    for read in sorted(
        reads, key=lambda r: (r.record.timestamp_ms, r.record.partition, r.record.offset)
    ):
        row = dead_letter_row(read)
        if row is None or (topic is not None and row["topic"] != topic):
            continue
        if since_ms is not None and read.record.timestamp_ms < since_ms:
            continue
        listed.append(row)
    return listed


@dataclass(frozen=True)
class OriginalRecord:
    """The record a dead letter keeps, as `dlq retry` sends it again."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]


def original_record(letter: DeadLetter, letter_id: str) -> OriginalRecord:
    """The original record, marked as a retry of `letter_id` (an older mark replaced);
    ValueError when the dead letter kept only the start of it."""
    if letter.truncated:
        raise ValueError(
            f"{letter_id} kept only the first MiB of its record: it cannot be sent again as it was"
        )
    value = (
        base64.b64decode(letter.value_base64)
        if letter.value_base64 is not None
        else letter.value.encode()
    )
    headers = [(n, v) for n, v in original_headers(letter) if n != RETRY_HEADER]
    return OriginalRecord(
        letter.topic,
        letter.partition,
        letter.key.encode() if letter.key is not None else None,
        value,
        [*headers, (RETRY_HEADER, letter_id.encode())],
    )


def retry_of(records: Iterable[BusRecord], letter_id: str) -> BusRecord | None:
    """The record among `records` that retried `letter_id`, if one did."""
    return next((r for r in records if header_value(r.headers, RETRY_HEADER) == letter_id), None)
