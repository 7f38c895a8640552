"""Overload scenario: more demand than capacity, three tiers, many users.

Runs the whole pipeline in this process with the sim engine (few slots), offers
a fixed schedule of requests from users of every tier at a rate above capacity,
and reports time to first token per tier, Jain's fairness index across the
free users' completed requests, and the shed rate.

    .venv/bin/python -m bench.overload
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from chatpipe.dev_stack import running_sim_stack, stack_settings
from conversations.store import ApiKey
from schemas.sse import read_messages
from schemas.topics import Tier

SLOTS = 4
TOKENS_PER_S = 50.0
MAX_TOKENS = 25  # 0.5 s of engine time per request
USERS = {Tier.ENTERPRISE: 2, Tier.PRO: 4, Tier.FREE: 8}
DURATION_S = 40.0
OFFERED_PER_S = 14.0  # capacity is SLOTS / 0.5 s = 8 requests/s


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index: 1 when every user got the same, 1/n when one got all."""
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values)) if values else 1.0


async def one_request(
    client: httpx.AsyncClient, tier: Tier, user: str, results: list[dict]
) -> None:
    started = time.monotonic()
    conversation = (await client.post("/v1/conversations", json={})).json()
    async with client.stream(
        "POST",
        f"/v1/conversations/{conversation['conversation_id']}/messages",
        json={"content": f"hello from {user}", "max_tokens": MAX_TOKENS, "ignore_eos": True},
    ) as response:
        if response.status_code != 200:
            await response.aread()
            results.append(dict(tier=tier, user=user, outcome=f"http {response.status_code}"))
            return
        events = await read_messages(response.aiter_lines())
    deltas = [e for e in events if e.event == "delta"]
    errors = [e.json()["code"] for e in events if e.event == "error"]
    outcome = "served" if deltas else (errors[0] if errors else "empty")
    results.append(
        dict(
            tier=tier, user=user, outcome=outcome, ttft=(deltas[0].at - started) if deltas else None
        )
    )


async def run() -> str:
    tmp = Path(tempfile.mkdtemp(prefix="overload-"))
    settings = stack_settings(
        tmp,
        engine="sim",
        max_slots=SLOTS,
        sim_tokens_per_s=TOKENS_PER_S,
        auto_titles=False,
        tier_max_wait_s={"enterprise": 30.0, "pro": 10.0, "free": 4.0},
        user_requests_per_minute=100_000,
        org_requests_per_minute=100_000,
        user_tokens_per_minute=100_000_000,
        org_tokens_per_minute=100_000_000,
        sim_prompt_tokens_per_s=1e6,
    )
    results: list[dict] = []
    async with running_sim_stack(settings) as stack:
        users = [(tier, f"{tier}-{i}") for tier, n in USERS.items() for i in range(n)]
        for tier, user in users:
            await stack.store.add_api_key(user, ApiKey(user, f"org-{user}", tier))
        clients = {
            user: httpx.AsyncClient(
                base_url=stack.base_url, timeout=120, headers={"Authorization": f"Bearer {user}"}
            )
            for _, user in users
        }
        tasks = []
        count = int(DURATION_S * OFFERED_PER_S)
        for i in range(count):
            tier, user = users[i % len(users)]
            tasks.append(asyncio.create_task(one_request(clients[user], tier, user, results)))
            await asyncio.sleep(1 / OFFERED_PER_S)
        await asyncio.gather(*tasks)
        for client in clients.values():
            await client.aclose()
    return report(results)


def report(results: list[dict]) -> str:
    lines = [
        "| tier | offered | served | shed | TTFT p50 ms | TTFT p99 ms |",
        "|---|---|---|---|---|---|",
    ]
    for tier in Tier:
        mine = [r for r in results if r["tier"] == tier]
        served = [r["ttft"] for r in mine if r["outcome"] == "served"]
        shed = [r for r in mine if r["outcome"] in ("http 503", "overloaded")]
        lines.append(
            f"| {tier} | {len(mine)} | {len(served)} | {len(shed)} "
            f"({len(shed) / max(1, len(mine)):.0%}) | "
            f"{percentile(served, 0.5) * 1000:.0f} | {percentile(served, 0.99) * 1000:.0f} |"
        )
    free_users = sorted({r["user"] for r in results if r["tier"] == Tier.FREE})
    per_user = [
        sum(1 for r in results if r["user"] == u and r["outcome"] == "served") for u in free_users
    ]
    ttfts = [
        statistics.median(
            [r["ttft"] for r in results if r["user"] == u and r["outcome"] == "served"] or [0.0]
        )
        for u in free_users
    ]
    shed_total = sum(1 for r in results if r["outcome"] in ("http 503", "overloaded"))
    other = sorted({r["outcome"] for r in results} - {"served", "http 503", "overloaded"})
    lines += [
        "",
        f"- Jain's fairness index over the {len(free_users)} free users' served requests: "
        f"{jain(per_user):.3f} (served per user: {per_user})",
        f"- Jain's index over their median TTFT: {jain(ttfts):.3f}",
        f"- shed rate overall: {shed_total / max(1, len(results)):.1%} "
        f"of {len(results)} requests; other outcomes: {other or 'none'}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(asyncio.run(run()))
