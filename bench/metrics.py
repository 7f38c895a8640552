"""Latency and throughput numbers from client-side stream records (pure functions).

Inter-token latency is measured per token, not per chunk: chatpipe coalesces
tokens into ~50 ms chunks and vLLM's server also merges tokens when its output
loop falls behind. Each content chunk after the first carries k tokens that
arrived `gap` after the previous chunk; it contributes k samples of `gap / k`.
So a 50 ms chunk of 5 tokens counts as five 10 ms tokens — the rate a reader
receives text at — while the chunk gap itself (what a reader sees as a
stutter) is reported separately. Tokens of the first chunk belong to the time
to first token and give no ITL sample.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bench.sse_client import StreamRecord


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


def per_token_itl(times: Sequence[float], tokens: Sequence[int]) -> list[float]:
    """One sample per token after the first chunk: chunk gap / tokens in the chunk."""
    samples: list[float] = []
    for i in range(1, len(times)):
        k = tokens[i]
        if k > 0:
            samples.extend([(times[i] - times[i - 1]) / k] * k)
    return samples


def chunk_gaps(times: Sequence[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


def chunk_tokens(record: StreamRecord, from_pipeline: list[int] | None) -> list[int] | None:
    """Tokens in each content chunk: the server's own cumulative counts where it
    reports them, else the counts the pipeline logged; None when neither fits."""
    if record.reported_tokens and len(record.reported_tokens) == len(record.times):
        cumulative = record.reported_tokens
        return [b - a for a, b in zip([0, *cumulative], cumulative, strict=False)]
    if from_pipeline is not None and len(from_pipeline) >= len(record.times):
        return from_pipeline[: len(record.times)]
    return None


@dataclass(frozen=True)
class LevelStats:
    """One concurrency level of one side."""

    side: str
    concurrency: int
    requests: int
    completed: int
    wall_s: float
    tokens: int
    ttft_ms: tuple[float, float]
    itl_ms: tuple[float, float]
    tpot_ms: tuple[float, float]
    """Per request: (last chunk − first chunk) ÷ tokens after the first chunk."""
    chunk_gap_ms: tuple[float, float]
    tokens_per_chunk: float
    unmatched: int
    """Completed streams whose per-chunk token counts could not be established."""
    errors: dict[str, int]
    """How the streams that did not complete ended (first 120 characters of the error)."""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


def level_stats(
    side: str,
    concurrency: int,
    records: list[StreamRecord],
    wall_s: float,
    pipeline_tokens: dict[str, list[int]] | None = None,
) -> tuple[LevelStats, dict]:
    """Summary of one level, and its raw samples (for plots)."""
    done = [r for r in records if r.completed]
    ttft = [r.ttft for r in done if r.ttft is not None]
    itl: list[float] = []
    tpot: list[float] = []
    gaps: list[float] = []
    chunked_tokens = chunks = unmatched = 0
    for record in done:
        gaps.extend(chunk_gaps(record.times))
        counts = chunk_tokens(record, (pipeline_tokens or {}).get(record.request_id or ""))
        if counts is None:
            unmatched += 1
            continue
        itl.extend(per_token_itl(record.times, counts))
        if sum(counts[1:]) > 0:
            tpot.append((record.times[-1] - record.times[0]) / sum(counts[1:]))
        chunked_tokens += sum(counts)
        chunks += len(counts)
    stats = LevelStats(
        side=side,
        concurrency=concurrency,
        requests=len(records),
        completed=len(done),
        wall_s=wall_s,
        tokens=sum(int(r.usage["completion_tokens"]) for r in done if r.usage),
        ttft_ms=_p50_p99(ttft),
        itl_ms=_p50_p99(itl),
        tpot_ms=_p50_p99(tpot),
        chunk_gap_ms=_p50_p99(gaps),
        tokens_per_chunk=chunked_tokens / chunks if chunks else float("nan"),
        unmatched=unmatched,
        errors=dict(
            Counter((r.error or "no usage or [DONE]")[:120] for r in records if not r.completed)
        ),
    )
    return stats, {"ttft": ttft, "itl": itl, "chunk_gap": gaps}


def _p50_p99(values_s: list[float]) -> tuple[float, float]:
    return percentile(values_s, 50) * 1000, percentile(values_s, 99) * 1000
