"""Budget periods: the UTC calendar day or month an instant falls in."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

Period = Literal["day", "month"]
PERIODS: tuple[Period, ...] = ("day", "month")


@dataclass(frozen=True, slots=True)
class PeriodWindow:
    """One period: [start, end) in UTC, named by `key` ("2025-03-07" or "2025-03")."""

    period: Period
    start: datetime
    end: datetime

    @property
    def key(self) -> str:
        return self.start.strftime("%Y-%m-%d" if self.period == "day" else "%Y-%m")

    def seconds_left(self, at: float) -> float:
        return max(0.0, self.end.timestamp() - at)


def period_of(at: float, period: Period) -> PeriodWindow:
    """The `period` containing epoch second `at`."""
    moment = datetime.fromtimestamp(at, UTC)
    if period == "day":
        start = moment.replace(hour=0, minute=0, second=0, microsecond=0)
        return PeriodWindow(period, start, start + timedelta(days=1))
    start = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    following = (
        start.replace(year=start.year + 1, month=1)
        if start.month == 12
        else start.replace(month=start.month + 1)
    )
    return PeriodWindow(period, start, following)
