"""Queue-position ETA under a backlog: how far the `eta_ms` of a request's first
`queued` event is from the wait the client then had until its first token.

Streams arrive at random (Poisson), each answer of a random length: first for
`warm_s` at less than the workers' slots serve, then for `offer_s` at more, so a
backlog builds from a short queue and its head keeps moving. Only the requests of the
second spell are counted: the scheduler's ETA is its recent rate of ends, which a
pipeline that has just started does not know yet.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

from bench.differentiators.turns import Turn, native_turn
from bench.fault_scenarios import body
from bench.metrics import percentile
from bench.process_pipeline import Pipeline

TARGET = 0.20
"""Median |predicted − actual| / actual at most this."""


@dataclass(frozen=True, slots=True)
class QueuedWait:
    """One request's first `queued` event and its first token, on the client's clock
    (seconds)."""

    position: int
    eta_ms: int | None
    queued_at: float
    first_token_at: float

    @property
    def actual_ms(self) -> float:
        return (self.first_token_at - self.queued_at) * 1000

    @property
    def error(self) -> float | None:
        """|predicted − actual| / actual; None without a prediction or a wait."""
        if self.eta_ms is None or self.actual_ms <= 0:
            return None
        return abs(self.eta_ms - self.actual_ms) / self.actual_ms


def queued_wait(turn: Turn) -> QueuedWait | None:
    """The wait of a turn that was queued and then streamed; None for any other."""
    queued, first_delta = turn.first("queued"), turn.first("delta")
    if queued is None or first_delta is None:
        return None
    shown = queued.json()
    return QueuedWait(shown["position"], shown["eta_ms"], queued.at, first_delta.at)


@dataclass(frozen=True)
class Backlog:
    """The streams offered: `warm_rate_per_s` a second for `warm_s`, then `rate_per_s`
    for `offer_s`, answers of `tokens` (min, max) tokens."""

    warm_rate_per_s: float = 1.5
    warm_s: float = 10.0
    rate_per_s: float = 3.0
    offer_s: float = 16.0
    tokens: tuple[int, int] = (20, 60)
    seed: int = 7

    def plan(self) -> tuple[list[float], list[int]]:
        """When each stream is sent (seconds after the start) and its answer's length."""
        rng = random.Random(self.seed)
        sent = [
            *arrivals(self.warm_rate_per_s, 0.0, self.warm_s, rng),
            *arrivals(self.rate_per_s, self.warm_s, self.warm_s + self.offer_s, rng),
        ]
        return sent, [rng.randint(*self.tokens) for _ in sent]


@dataclass(frozen=True)
class EtaStats:
    backlog: Backlog
    offered: int
    """Streams sent after the warm-up."""
    slots: int
    waits: list[QueuedWait] = field(default_factory=list)
    """Of those, the ones that were queued and streamed."""
    refused: int = 0
    """Streams (warm-up included) that got no answer (a refusal or an error)."""

    @property
    def errors(self) -> list[float]:
        return [e for w in self.waits if (e := w.error) is not None]

    @property
    def without_eta(self) -> int:
        return sum(w.eta_ms is None for w in self.waits)

    def error_at(self, q: float, head: bool | None = None) -> float:
        """The q-th percentile error; `head`: of the positions the free slots reach
        first (True) or of those behind them (False)."""
        waits = self.waits
        if head is not None:
            waits = [w for w in waits if (w.position <= self.slots) == head]
        return percentile([e for w in waits if (e := w.error) is not None], q)

    @property
    def met(self) -> bool:
        return self.error_at(50) <= TARGET

    def max_position(self) -> int:
        return max((w.position for w in self.waits), default=0)


def arrivals(rate_per_s: float, start_s: float, end_s: float, rng: random.Random) -> list[float]:
    """Seconds after the start at which Poisson arrivals at `rate_per_s` come between
    `start_s` and `end_s`."""
    at, times = start_s + rng.expovariate(rate_per_s), []
    while at < end_s:
        times.append(at)
        at += rng.expovariate(rate_per_s)
    return times


async def measure(pipe: Pipeline, slots: int, backlog: Backlog = Backlog()) -> EtaStats:
    """Offer `backlog`'s streams on both gateways; the waits of the second spell's."""
    plan, lengths = backlog.plan()
    async with pipe.http("g1") as g1, pipe.http("g2") as g2:
        started = time.monotonic()

        async def one(i: int) -> Turn:
            await asyncio.sleep(max(0.0, started + plan[i] - time.monotonic()))
            return await native_turn((g1, g2)[i % 2], body(lengths[i], f"eta {i}"))

        turns = await asyncio.gather(*(one(i) for i in range(len(plan))))
    counted = [t for t in turns if t.sent_at - started >= backlog.warm_s]
    waits = [w for t in counted if (w := queued_wait(t)) is not None]
    refused = sum(t.status != 200 or t.first("done") is None for t in turns)
    return EtaStats(backlog, offered=len(counted), slots=slots, waits=waits, refused=refused)
