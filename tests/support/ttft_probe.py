"""A chat client in a process of its own that times streamed answers: run as a script
(`python tests/support/ttft_probe.py BASE_URL EVERY_S KEY...`), it asks for one
40-token native answer after another, each at least `EVERY_S` apart and each with the
next key in turn, and prints a JSON line per answer: its time to first token and its
longest gap between two deltas, in seconds. It stops when its stdin closes.

Its own process, so a gateway that holds its event loop (or its GIL) shows in what it
measures: a client in the gateway's process would stall with it and time nothing.
Only the standard library and httpx: it imports nothing of the checkout.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import time

import httpx


async def timed_turn(client: httpx.AsyncClient, key: str) -> dict[str, float]:
    headers = {"Authorization": f"Bearer {key}"}
    created = await client.post("/v1/conversations", json={}, headers=headers)
    created.raise_for_status()
    cid = created.json()["conversation_id"]
    started = time.monotonic()
    arrivals: list[float] = []
    body = {"content": "[[sim:length=40]] go", "max_tokens": 40}
    path = f"/v1/conversations/{cid}/messages"
    async with client.stream("POST", path, json=body, headers=headers) as response:
        if response.status_code != 200:
            raise SystemExit(f"{response.status_code}: {(await response.aread()).decode()}")
        async for line in response.aiter_lines():
            if line == "event: delta":
                arrivals.append(time.monotonic())
    if not arrivals:
        raise SystemExit("an answer streamed no delta")
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    return {"ttft": arrivals[0] - started, "gap": max(gaps, default=0.0)}


async def probe(base_url: str, every_s: float, keys: list[str]) -> None:
    loop = asyncio.get_running_loop()
    closed = loop.run_in_executor(None, sys.stdin.read)  # returns at EOF
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        for key in itertools.cycle(keys):
            started = time.monotonic()
            print(json.dumps(await timed_turn(client, key)), flush=True)
            await asyncio.sleep(max(0.0, every_s - (time.monotonic() - started)))
            if closed.done():
                return


if __name__ == "__main__":
    asyncio.run(probe(sys.argv[1], float(sys.argv[2]), sys.argv[3:]))
