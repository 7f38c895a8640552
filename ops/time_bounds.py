"""TIME arguments of the replay commands, and when a broker's answer to "which offset
has this time" can be believed (pure)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import NamedTuple

_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


def parse_time(text: str, now_ms: int) -> int:
    """Epoch milliseconds of `text`: a span back from now (`90s`, `10m`, `2h`, `1d`,
    `1w`, `500ms`), or an ISO 8601 time (`2026-11-30T16:00:00Z`; UTC when it gives no
    offset), or epoch milliseconds. ValueError for anything else."""
    if match := _RELATIVE.match(text):
        return now_ms - round(float(match.group(1)) * _UNIT_MS[match.group(2)])
    stripped = text.strip()
    if stripped.isdigit() and len(stripped) >= 12:
        return int(stripped)
    try:
        moment = datetime.fromisoformat(stripped.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"not a time: {text!r} (give e.g. 10m, 2h, 1d or 2026-11-30T16:00:00Z)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return round(moment.timestamp() * 1000)


class TimeAnswer(NamedTuple):
    """A broker's answer for one partition to "the first offset at or after a time", and
    what reading the partition there found."""

    offset: int
    timestamp: int
    """The record timestamp the broker reported."""
    found_ms: int | None
    """The timestamp of the record at `offset`, as read (None: no record there)."""
    before_ms: int | None
    """The timestamp of the record before it (None: it is the first)."""


def time_offsets_believable(answers: Iterable[TimeAnswer | None], target_ms: int) -> bool:
    """A broker's `offsets_for_times` answer (per partition, None: no record that late)
    is right only if each offset's record has the reported timestamp, at or after the
    target, and the record before it is earlier than the target. Tansu answers offset 0
    with its own clock's time (or -1) whatever is asked: such an answer
    sends the reader back to scanning from the start."""
    return all(answer is None or _right(TimeAnswer(*answer), target_ms) for answer in answers)


def _right(a: TimeAnswer, target_ms: int) -> bool:
    return (
        a.offset >= 0
        and a.timestamp >= target_ms
        and a.found_ms == a.timestamp
        and (a.before_ms is None or a.before_ms < target_ms)
    )
