"""Metrics scraped from a stack."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(url: str) -> Samples:
    async with httpx.AsyncClient(timeout=10) as http:
        response = await http.get(url)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def at(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name` over every series with at least these labels."""
    wanted = set(labels.items())
    return sum(v for (n, series), v in samples.items() if n == name and wanted <= series)


async def eventually(
    url: str,
    check: Callable[[Samples], bool],
    timeout_s: float = 20.0,
) -> Samples:
    """Scrape until `check` holds (gauges sampled every few seconds, background steps)."""
    deadline = time.monotonic() + timeout_s
    while True:
        samples = await scrape(url)
        if check(samples) or time.monotonic() > deadline:
            return samples
        await asyncio.sleep(0.5)
