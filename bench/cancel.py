"""Cancellation waste: tokens generated after a client hung up.

Clients hang up after 2 to 16 content chunks. For chatpipe, the tokens a
client had received are counted exactly from `chat.tokens` (the token counts
of the chunks it got) and the tokens generated from the request's usage event
on `chat.usage`; waste = generated − received. This counts every token the
client did not get: the ones still in the pipeline when it hung up as well as
the ones generated before the cancel reached the engine.

vLLM's server is not measured: it publishes no per-request usage for an
aborted stream, and its token counters are off with `--disable-log-stats`
(which chatpipe's engine runs with too).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bench.load import disconnects, fixed_prompts
from bench.metrics import percentile
from bench.sse_client import StreamRecord, Target
from bench.topic_log import (
    LoggedChunk,
    cancels,
    content_chunk_tokens,
    token_chunks,
    usage_events,
)
from schemas.lifecycle import RequestStatus

if TYPE_CHECKING:
    from bench.compare import Workload


@dataclass(frozen=True)
class CancelStats:
    disconnects: int
    measured: int
    """Disconnects whose waste could be counted."""
    waste_median: float | None
    waste_max: float | None
    waste_mean: float | None
    interval_tokens: float | None
    """Tokens one stream receives in one coalescing interval (median over streams)."""
    aborted: int = 0
    """Usage events that report the request as aborted."""
    cancels_sent: int = 0
    """Hang-ups for which the gateway published a Cancel on chat.control."""
    cancel_ms_median: float | None = None
    """Hang-up to the Cancel record on chat.control (the gateway noticing and publishing)."""
    in_flight_median: float | None = None
    """Of the waste: tokens already published on chat.tokens when the client hung up."""
    after_median: float | None = None
    """Of the waste: tokens published after the hang-up, or never (held, then aborted).
    An upper bound of the tokens generated after the hang-up: it also counts tokens the
    coalescer held when the client left."""
    generated_after_median: float | None = None
    generated_after_max: float | None = None
    """Tokens generated after the hang-up (the issue's cancellation waste): the usage
    count minus the tokens made by the hang-up, which are those published by then plus
    what the stream's rate made since its last publish (at most one interval's worth)."""


@dataclass(frozen=True)
class HangUp:
    received: int
    published_before: int
    generated: int
    held_estimate: float = 0.0
    """Tokens made since the last publish before the hang-up (held by the coalescer)."""

    @property
    def generated_after(self) -> float:
        return max(0.0, self.generated - self.published_before - self.held_estimate)

    @property
    def waste(self) -> int:
        return self.generated - self.received


async def chatpipe_waste(
    target: Target, bootstrap: str, workload: Workload, coalesce_s: float
) -> CancelStats:
    records = await _hang_ups(target, workload)
    ids = [r.request_id for r in records if r.request_id]
    logged = await token_chunks(bootstrap, ids)
    usage = await usage_events(bootstrap, ids)
    cancelled_at = await cancels(bootstrap, ids)
    hang_ups, rates, cancel_ms = [], [], []
    for record in records:
        rid = record.request_id
        counts = content_chunk_tokens(logged.get(rid or "", []))
        if rid is None or rid not in usage or len(counts) < len(record.times):
            continue
        received = counts[: len(record.times)]
        hung_up_ms = record.wall(record.ended) * 1000
        if rid in cancelled_at:
            cancel_ms.append(cancelled_at[rid] * 1000 - hung_up_ms)
        before = [c for c in logged[rid] if c.published_ms <= hung_up_ms]
        published = max((c.completion_tokens for c in before), default=0)
        rate = _publish_rate(before)
        held = 0.0
        if before and rate is not None:
            held = min(rate * (hung_up_ms - before[-1].published_ms) / 1000, rate * coalesce_s)
        hang_ups.append(HangUp(sum(received), published, usage[rid].completion_tokens, held))
        if len(record.times) > 1 and record.times[-1] > record.times[0]:
            rates.append(sum(received[1:]) / (record.times[-1] - record.times[0]))
    waste = [h.waste for h in hang_ups]
    after = [h.generated_after for h in hang_ups]
    return CancelStats(
        disconnects=len(records),
        measured=len(waste),
        waste_median=_median(waste),
        waste_max=float(max(waste)) if waste else None,
        waste_mean=sum(waste) / len(waste) if waste else None,
        interval_tokens=percentile(rates, 50) * coalesce_s if rates else None,
        aborted=sum(1 for e in usage.values() if e.status is RequestStatus.FINISHED_ABORTED),
        cancels_sent=len(cancelled_at),
        cancel_ms_median=_median(cancel_ms),
        in_flight_median=_median([h.published_before - h.received for h in hang_ups]),
        after_median=_median([h.generated - h.published_before for h in hang_ups]),
        generated_after_median=_median(after),
        generated_after_max=max(after, default=None),
    )


def _publish_rate(chunks: list[LoggedChunk]) -> float | None:
    """Tokens per second the worker published, from the second chunk on (the first
    carries the prompt's wait)."""
    if len(chunks) < 3 or chunks[-1].published_ms <= chunks[1].published_ms:
        return None
    made = chunks[-1].completion_tokens - chunks[1].completion_tokens
    return made / ((chunks[-1].published_ms - chunks[1].published_ms) / 1000)


def _median(values: list[int] | list[float]) -> float | None:
    return percentile(values, 50) if values else None


async def _hang_ups(target: Target, workload: Workload) -> list[StreamRecord]:
    records = await disconnects(
        target,
        workload.disconnects,
        workload.disconnect_concurrency,
        fixed_prompts(),
        workload.disconnect_max_tokens,
    )
    await asyncio.sleep(1.0)  # cancels travel, engines stop, usage is published
    return records
