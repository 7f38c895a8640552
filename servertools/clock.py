"""The `clock` server tool: the current time in UTC, and in an IANA time zone if asked."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from schemas.tools import FunctionSpec, ToolSpec

SPEC = ToolSpec(
    function=FunctionSpec(
        name="clock",
        description="The current date and time in UTC, and in an IANA time zone if one is "
        "given (e.g. Europe/Paris).",
        parameters={
            "type": "object",
            "properties": {"timezone": {"type": "string", "maxLength": 64}},
        },
    )
)


def now_in(timezone: str | None, now: dt.datetime) -> dict[str, Any]:
    """`now` (aware, any zone) as the tool answers: UTC, and local time in `timezone`."""
    utc = now.astimezone(dt.UTC)
    answer: dict[str, Any] = {
        "utc": utc.isoformat(timespec="seconds"),
        "unix": int(utc.timestamp()),
    }
    if timezone:
        try:
            zone = ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {timezone!r}") from None
        answer |= {
            "timezone": timezone,
            "local": utc.astimezone(zone).isoformat(timespec="seconds"),
        }
    return answer


class Clock:
    """The tool, reading the time from `now` (a test passes its own)."""

    spec = SPEC

    def __init__(self, now: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> None:
        self._now = now

    async def __call__(self, arguments: dict[str, Any], _caller: object) -> dict[str, Any]:
        timezone = arguments.get("timezone")
        if timezone is not None and not isinstance(timezone, str):
            raise ValueError("timezone: a string is required")
        return now_in(timezone, self._now())
