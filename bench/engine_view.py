"""The engine's own view of a benchmark level: vLLM's request histograms, read from a
server's `/metrics` before and after the level.

vLLM's front end times each request from its arrival at the engine client
(`AsyncLLM`): `vllm:time_to_first_token_seconds` to its first token,
`vllm:request_queue_time_seconds` waiting for the engine's scheduler,
`vllm:request_prefill_time_seconds` from being scheduled to its first token. vLLM's
server serves them at `/metrics`; `chatpipe up` serves its worker's beside its own
(`ops.metrics`). A client's time to first token less the engine's is what the side
adds before and after the engine: for vLLM's server its HTTP and API server (it stamps
a request's arrival before rendering its prompt, so the rendering counts as the
engine's), for chatpipe the pipeline's hops and the worker's intake, its prompt build
included (the worker hands vLLM token ids).

Histograms give sums and counts, so these are means over the level's requests, not
percentiles.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
}
"""What the engine measures of each request, by the name a report gives it."""


@dataclass(frozen=True)
class EngineTotals:
    """Each histogram's sum (seconds) and count over every label set, at one moment."""

    sums: dict[str, float]
    counts: dict[str, float]


def totals(exposition: str) -> EngineTotals:
    """The `HISTOGRAMS` in a Prometheus text exposition (missing ones count zero)."""
    wanted = {name: key for key, name in HISTOGRAMS.items()}
    sums = dict.fromkeys(HISTOGRAMS, 0.0)
    counts = dict.fromkeys(HISTOGRAMS, 0.0)
    for family in text_string_to_metric_families(exposition):
        key = wanted.get(family.name)
        if key is None:
            continue
        for sample in family.samples:
            if sample.name == f"{family.name}_sum":
                sums[key] += sample.value
            elif sample.name == f"{family.name}_count":
                counts[key] += sample.value
    return EngineTotals(sums, counts)


def means_ms(before: EngineTotals, after: EngineTotals) -> dict[str, float]:
    """Each histogram's mean in ms over the requests observed between two reads; a
    histogram with none is left out."""
    means = {}
    for key in HISTOGRAMS:
        count = after.counts[key] - before.counts[key]
        if count > 0:
            means[key] = (after.sums[key] - before.sums[key]) / count * 1000
    return means


async def read_totals(port: int, host: str = "127.0.0.1") -> EngineTotals:
    """The server's histograms now (its `/metrics`, Prometheus text)."""
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(f"http://{host}:{port}/metrics")
        response.raise_for_status()
    return totals(response.text)
