"""The response cache: hit ratio, and time to first token of a hit against a
miss, on the sim engine with every stage in process.

    .venv/bin/python -m bench response_cache [--requests 120] [--prompts 30] [--clients 4]

The dev org opts in; `--clients` clients send `--requests` first turns (native API,
temperature 0, a new conversation each), each prompt drawn from `--prompts` distinct
ones with a Zipf-like skew (seeded), so early requests miss and repeats hit. TTFT is the
client's: from sending the request to the first delta. The sim engine streams at the
replay's pace (50 tokens/s), so a hit and a miss take about as long to read; what a hit
saves is the queue, the prompt's processing and the engine slot.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client import REGISTRY

from bench.overload import percentile
from chatpipe.dev_stack import API_KEY, running_sim_stack, stack_settings
from chatpipe.wiring import DEV_USER
from conversations.store import OrgSettings
from schemas.sse import read_messages

TOKENS_PER_S = 50.0


@dataclass(frozen=True, slots=True)
class Turn:
    cache: str
    ttft_s: float
    total_s: float


def prompts(requests: int, distinct: int, seed: int = 0) -> list[str]:
    """`requests` prompts from `distinct` ones, the i-th drawn with weight 1/(i+1)."""
    rng = random.Random(seed)
    pool = [f"[[sim:length=48]] question {i}: what does a cache keep?" for i in range(distinct)]
    weights = [1 / (i + 1) for i in range(distinct)]
    return rng.choices(pool, weights, k=requests)


async def ask(client: httpx.AsyncClient, prompt: str) -> Turn:
    cid = (await client.post("/v1/conversations", json={})).json()["conversation_id"]
    started = time.monotonic()
    async with client.stream(
        "POST",
        f"/v1/conversations/{cid}/messages",
        json={"content": prompt, "temperature": 0, "max_tokens": 64},
    ) as response:
        events = await read_messages(response.aiter_lines())
    first = next(e.at for e in events if e.event == "delta")
    done = next(e.json() for e in events if e.event == "done")
    return Turn(done.get("cache", "none"), first - started, events[-1].at - started)


def dispatched() -> float:
    return sum(sample.value for metric in REGISTRY.collect()
               if metric.name == "chatpipe:request_queue_time_seconds"
               for sample in metric.samples if sample.name.endswith("_count"))  # fmt: skip


async def run(requests: int, distinct: int, clients: int) -> str:
    settings = stack_settings(Path(tempfile.mkdtemp(prefix="cache-bench-")), engine="sim",
                              sim_tokens_per_s=TOKENS_PER_S, auto_titles=False, max_slots=4,
                              response_cache_tokens_per_s=TOKENS_PER_S,
                              user_requests_per_minute=100_000)  # fmt: skip
    queue = list(prompts(requests, distinct))
    turns: list[Turn] = []
    async with (
        running_sim_stack(settings) as stack,
        httpx.AsyncClient(
            base_url=stack.base_url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120
        ) as client,
    ):
        await stack.store.set_org_settings(OrgSettings(DEV_USER, response_cache=True))
        before = dispatched()

        async def one_client() -> None:
            while queue:
                turns.append(await ask(client, queue.pop(0)))

        started = time.monotonic()
        await asyncio.gather(*(one_client() for _ in range(clients)))
        elapsed = time.monotonic() - started
        sent = dispatched() - before
    return report(turns, sent, elapsed, requests, distinct, clients)


def report(
    turns: list[Turn], sent: float, elapsed: float, requests: int, distinct: int, clients: int
) -> str:
    lines = [
        f"{requests} first turns from {distinct} prompts (Zipf-like), {clients} clients, "
        f"sim engine at {TOKENS_PER_S:.0f} tokens/s, 4 slots, replay at "
        f"{TOKENS_PER_S:.0f} tokens/s; {elapsed:.1f} s in all",
        "",
        "| outcome | requests | TTFT p50 / p99 ms | whole answer p50 ms |",
        "|---|---|---|---|",
    ]
    for outcome in ("hit", "miss"):
        picked = [t for t in turns if t.cache == outcome]
        if picked:
            ttft = [t.ttft_s for t in picked]
            lines.append(
                f"| {outcome} | {len(picked)} | {percentile(ttft, 0.5) * 1000:.0f} / "
                f"{percentile(ttft, 0.99) * 1000:.0f} | "
                f"{percentile([t.total_s for t in picked], 0.5) * 1000:.0f} |"
            )
    hits = sum(t.cache == "hit" for t in turns)
    lines += [
        "",
        f"- hit ratio {hits / len(turns):.0%} ({hits} of {len(turns)}); "
        f"requests dispatched to the engine: {sent:.0f}",
    ]
    return "\n".join(lines)


def cli(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench response_cache",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--requests", type=int, default=120)
    parser.add_argument("--prompts", type=int, default=30)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args(argv)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    print(asyncio.run(run(args.requests, args.prompts, args.clients)))


if __name__ == "__main__":
    import sys

    cli(sys.argv[1:])
