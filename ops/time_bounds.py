"""TIME arguments of the replay commands, and when a broker's answer to "which offset
has this time" can be believed (pure)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import UTC, datetime

_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)\s*$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000,
            "w": 604_800_000}


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
        raise ValueError(f"not a time: {text!r} (give e.g. 10m, 2h, 1d or "
                         "2026-11-30T16:00:00Z)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return round(moment.timestamp() * 1000)


def time_offsets_believable(answers: Iterable[tuple[int, int] | None], target_ms: int) -> bool:
    """A broker's `offsets_for_times` answer (per partition (offset, record timestamp),
    or None: no record that late) is right only if every timestamp it reports is at or
    after the target. Tansu answers offset 0 with timestamp -1 whatever is asked
    (DESIGN §11): such an answer sends the reader back to scanning from the start."""
    return all(answer is None or (answer[0] >= 0 and answer[1] >= target_ms)
               for answer in answers)
