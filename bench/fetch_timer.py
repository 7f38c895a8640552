"""How long a record waits for a consumer on the embedded broker, per fetch wait.

    .venv/bin/python -m bench.fetch_timer        # ~30 s; prints a Markdown table

One producer, one consumer per `fetch_max_wait_ms`, records sent at scattered
moments: the delay from `send_and_wait` to `getmany` returning it. A broker
that answers a fetch as soon as a record arrives gives a delay near the round
trip whatever the wait; one that answers on the timer gives up to the wait.
"""

from __future__ import annotations

import asyncio
import time

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from bench.metrics import percentile
from bus.broker import EmbeddedBroker

WAITS_MS = (500, 100, 20, 5)
SENDS = 20
TOPIC = "bench.fetch-timer"


async def delays(bootstrap: str, producer: AIOKafkaProducer, wait_ms: int) -> list[float]:
    consumer = AIOKafkaConsumer(
        TOPIC,
        bootstrap_servers=bootstrap,
        fetch_max_wait_ms=wait_ms,
        auto_offset_reset="latest",
        group_id=f"fetch-timer-{wait_ms}",
    )
    await consumer.start()
    try:
        await consumer.getmany(timeout_ms=1000)  # joined, positioned at the end
        found = []
        for i in range(SENDS):
            await asyncio.sleep((0.037 * i) % 0.2)  # scattered against the fetch cycle
            sent = time.monotonic()
            await producer.send_and_wait(TOPIC, b"x")
            while not await consumer.getmany(timeout_ms=2000):
                pass
            found.append((time.monotonic() - sent) * 1000)
        return found
    finally:
        await consumer.stop()


async def measure(bootstrap: str, wait_ms: int) -> list[float]:
    """The delays at one fetch wait, on a running broker."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(TOPIC, b"x")
        return await delays(bootstrap, producer, wait_ms)
    finally:
        await producer.stop()


async def run() -> dict[int, list[float]]:
    async with EmbeddedBroker() as broker:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers)
        await producer.start()
        try:
            await producer.send_and_wait(TOPIC, b"x")
            return {
                wait: await delays(broker.bootstrap_servers, producer, wait) for wait in WAITS_MS
            }
        finally:
            await producer.stop()


def main() -> None:
    results = asyncio.run(run())
    print("| fetch_max_wait_ms | delay p50 ms | p90 | max |")
    print("|---|---|---|---|")
    for wait, found in results.items():
        print(
            f"| {wait} | {percentile(found, 50):.0f} | {percentile(found, 90):.0f} | "
            f"{max(found):.0f} |"
        )


if __name__ == "__main__":
    main()
