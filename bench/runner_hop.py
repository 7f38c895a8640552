"""One hop's latency, side by side: our StageRunner vs a FastStream subscriber+publisher.

    pip install 'faststream[kafka]==0.7.8'   # not a dependency of chatpipe
    .venv/bin/python -m bench.runner_hop     # ~1 min: two runs of each, printed

Why chatpipe has its own runner (docs/architecture/index.md) is its commit rules; this
checks that FastStream would not be faster either.

Each relays records from an input topic to an output topic (read, then send); a probe
sends N records at a steady rate with its send time in the value and a plain consumer
reads the output. Same broker (embedded Tansu), same aiokafka, same fetch wait (20 ms).
"""

from __future__ import annotations

import asyncio
import statistics
import struct
import time

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import ConsumerRecord

from bus.broker import EmbeddedBroker
from bus.clients import KafkaConfig
from bus.stage_runner import RunnerOptions, Stage, StageRunner
from bus.topics import create_topics

N = 400
RATE = 100.0


async def probe(bootstrap: str, into: str, out: str) -> list[float]:
    reader = AIOKafkaConsumer(
        out,
        bootstrap_servers=bootstrap,
        auto_offset_reset="latest",
        fetch_max_wait_ms=5,
        group_id=None,
    )
    await reader.start()
    await asyncio.sleep(1.0)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
    await producer.start()
    latencies: list[float] = []

    async def read() -> None:
        while len(latencies) < N:
            batch = await reader.getmany(timeout_ms=100)
            now = time.perf_counter()
            for records in batch.values():
                for r in records:
                    latencies.append(now - struct.unpack("d", r.value[:8])[0])

    reading = asyncio.create_task(read())
    for _ in range(N):
        await producer.send(into, struct.pack("d", time.perf_counter()) + b"x" * 200)
        await asyncio.sleep(1 / RATE)
    await asyncio.wait_for(reading, 30)
    await producer.stop()
    await reader.stop()
    return latencies


def summary(name: str, lat: list[float]) -> str:
    ms = sorted(x * 1000 for x in lat)
    return (
        f"{name:12s} n={len(ms)} p50={statistics.median(ms):.1f} ms "
        f"p90={ms[int(len(ms) * 0.9)]:.1f} ms p99={ms[int(len(ms) * 0.99)]:.1f} ms"
    )


async def ours(bootstrap: str) -> list[float]:
    kafka = KafkaConfig(bootstrap_servers=bootstrap, fetch_max_wait_ms=20)

    class Hop(Stage):
        async def handle(self, record: ConsumerRecord) -> None:
            await runner.publisher.producer.send("out1", record.value)

    runner = StageRunner(kafka, "hop", "hop-ours", ["in1"], Hop(), RunnerOptions(poll_ms=100))
    task = asyncio.create_task(runner.run())
    await asyncio.sleep(3.0)  # joined its group
    try:
        return await probe(bootstrap, "in1", "out1")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def faststream(bootstrap: str) -> list[float]:
    from faststream import AckPolicy
    from faststream.kafka import KafkaBroker

    broker = KafkaBroker(bootstrap)

    @broker.subscriber(
        "in2",
        group_id="hop-faststream",
        auto_offset_reset="earliest",
        fetch_max_wait_ms=20,
        ack_policy=AckPolicy.ACK,
    )
    @broker.publisher("out2")
    async def handle(body: bytes) -> bytes:
        return body

    await broker.start()
    await asyncio.sleep(3.0)
    try:
        return await probe(bootstrap, "in2", "out2")
    finally:
        await broker.stop()


async def main() -> None:
    async with EmbeddedBroker() as broker:
        await create_topics(
            broker.bootstrap_servers, {t: 1 for t in ("in1", "out1", "in2", "out2")}
        )
        for _ in range(2):
            print(summary("StageRunner", await ours(broker.bootstrap_servers)), flush=True)
            print(summary("FastStream", await faststream(broker.bootstrap_servers)), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
