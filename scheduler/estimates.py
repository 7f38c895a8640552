"""Throughput from recent completions, for queue ETAs and shedding."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable


class Throughput:
    """Requests finished per second over a sliding window.

    `seconds_for(n)` is how long until n more requests have started, assuming
    slots keep freeing at the recent rate; None until anything has finished.
    """

    def __init__(self, clock: Callable[[], float], window_s: float = 30.0) -> None:
        self.window_s = window_s
        self._clock = clock
        self._finished: deque[float] = deque()
        self._service_s: float | None = None

    def finished(self, service_s: float) -> None:
        now = self._clock()
        self._finished.append(now)
        self._service_s = (
            service_s if self._service_s is None else (0.8 * self._service_s + 0.2 * service_s)
        )
        self._trim(now)

    def rate(self) -> float | None:
        now = self._clock()
        self._trim(now)
        if not self._finished:
            return None
        span = max(now - self._finished[0], self._service_s or 0.0, 1.0)
        return len(self._finished) / span

    def seconds_for(self, count: int, busy: int | None = None) -> float | None:
        """With `busy` (slots running now): at most as long as those slots take to free
        `count` at the recent service time. After a quiet spell the window holds few
        ends, which says nothing of how fast a full set of slots frees."""
        if count <= 0:
            return 0.0
        rate = self.rate()
        if rate is None:
            return None
        seconds = count / rate
        if busy and self._service_s is not None:
            seconds = min(seconds, count * self._service_s / busy)
        return seconds

    def seconds_each(self) -> float | None:
        """Seconds per started request at the recent rate (`seconds_for(n)` is n times
        this), for many estimates at once."""
        rate = self.rate()
        return None if rate is None else 1.0 / rate

    def _trim(self, now: float) -> None:
        while self._finished and now - self._finished[0] > self.window_s:
            self._finished.popleft()
