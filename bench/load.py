"""Workloads: a closed loop at a fixed concurrency, and many streams held open at once."""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass

from bench.sse_client import StreamRecord, Target, chat_body, stream_chat

_TOPICS = (
    "a queue of requests",
    "continuous batching",
    "a conversation store",
    "streaming tokens to a browser",
    "prefix caching",
    "fair scheduling across tiers",
    "cancelling a generation",
    "a log of events",
)


def fixed_prompts(count: int = 8) -> list[str]:
    """Deterministic chat prompts of growing length (about 15 to 120 words)."""
    prompts = []
    for i in range(count):
        topic = _TOPICS[i % len(_TOPICS)]
        context = " ".join(
            f"Point {j}: {topic} matters for latency and throughput." for j in range(1 + 2 * i)
        )
        prompts.append(f"{context} Please explain {topic} to a new engineer, step by step.")
    return prompts


@dataclass
class LevelRun:
    concurrency: int
    records: list[StreamRecord]
    wall_s: float


async def closed_loop(
    target: Target, concurrency: int, requests: int, prompts: list[str], max_tokens: int
) -> LevelRun:
    """`concurrency` clients, each sending the next request when its last one ends."""
    bodies = [chat_body(target.model, prompt, max_tokens) for prompt in prompts]
    order = iter(range(requests))
    records: list[StreamRecord] = []

    async def client() -> None:
        for i in order:
            records.append(await stream_chat(target, bodies[i % len(bodies)]))

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return LevelRun(concurrency, records, time.perf_counter() - started)


async def held_streams(
    target: Target, streams: int, prompts: list[str], max_tokens: int, ramp_s: float = 1.0
) -> LevelRun:
    """`streams` requests opened over `ramp_s` and held until each ends."""
    bodies = itertools.cycle(chat_body(target.model, p, max_tokens) for p in prompts)

    async def one(i: int, body: bytes) -> StreamRecord:
        await asyncio.sleep(ramp_s * i / streams)
        return await stream_chat(target, body)

    started = time.perf_counter()
    records = await asyncio.gather(*(one(i, next(bodies)) for i in range(streams)))
    return LevelRun(streams, list(records), time.perf_counter() - started)


async def disconnects(
    target: Target,
    count: int,
    concurrency: int,
    prompts: list[str],
    max_tokens: int,
    after_chunks: tuple[int, ...] = (2, 4, 8, 16),
) -> list[StreamRecord]:
    """`count` streams that hang up after a few content chunks, `concurrency` at a time."""
    bodies = [chat_body(target.model, prompt, max_tokens) for prompt in prompts]
    order = iter(range(count))
    records: list[StreamRecord] = []

    async def client() -> None:
        for i in order:
            records.append(
                await stream_chat(
                    target,
                    bodies[i % len(bodies)],
                    disconnect_after=after_chunks[i % len(after_chunks)],
                )
            )

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return records
