"""The load around one gateway for `python -m bench gateway` (`bench.gateway_streams`),
each its own process so its CPU is not the gateway's:

    python -m bench.gateway_load feed BOOTSTRAP TOKENS_PER_S CHUNK_MS
    python -m bench.gateway_load read PORT TOTAL INDEX READERS RAMP_S START_AT MAX_TOKENS OUT

The feeder stands in for scheduler, workers and safety; a reader opens its share of
the streams through the native API and writes what it saw (JSON).
"""

from __future__ import annotations

import asyncio
import heapq
import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import psutil
from aiokafka import AIOKafkaProducer
from aiokafka.producer.message_accumulator import BatchBuilder

from bench.sse_client import StreamRecord
from chatpipe.tiny_model import TINY_MODEL_DIR

API_KEY = "bench-key"
TICK_S = 0.02
"""The feeder sends what is due this often: one produce request per partition and tick
(the broker is not under test), each delta at most this late."""


# --- the feeder: scheduler, worker and safety in one ---------------------------------


@dataclass(order=True)
class _FedStream:
    due: float
    request_id: str = field(compare=False)
    attempt: int = field(compare=False)
    key: bytes = field(compare=False)
    reply_to: str = field(compare=False)
    model: str = field(compare=False)
    tokens: int = field(compare=False)
    sent: int = field(default=0, compare=False)
    seq: int = field(default=0, compare=False)

    def next_events(self, per_chunk: int) -> list[tuple[bytes, list[tuple[str, bytes]]]]:
        """The next delta (the safety stage's delivery form), and `done` after the last."""
        text_tokens = min(per_chunk, self.tokens - self.sent)
        self.sent += text_tokens
        events = [
            (
                orjson.dumps(
                    {
                        "type": "delta",
                        "request_id": self.request_id,
                        "attempt": self.attempt,
                        "seq": self.seq,
                        "text": "w " * text_tokens,
                    }
                ),
                DELTA_HEADERS,
            )
        ]
        self.seq += 1
        if self.sent >= self.tokens:
            events.append(
                (
                    orjson.dumps(
                        {
                            "type": "done",
                            "request_id": self.request_id,
                            "attempt": self.attempt,
                            "seq": self.seq,
                            "status": "finished_length",
                            "model": self.model,
                            "usage": {"prompt_tokens": 8, "completion_tokens": self.sent},
                        }
                    ),
                    DONE_HEADERS,
                )
            )
        return events


DELTA_HEADERS = [("event-type", b"delta"), ("schema-version", b"1")]
DONE_HEADERS = [("event-type", b"done"), ("schema-version", b"1")]


async def feed(bootstrap: str, tokens_per_s: float, chunk_ms: float) -> None:
    """Answer every request on `chat.requests.*` on its `reply_to` topic, until killed."""
    from aiokafka.structs import TopicPartition

    from bus.clients import KafkaConfig, keyed_partition
    from schemas import topics
    from schemas.topics import Tier

    kafka = KafkaConfig(bootstrap)
    consumer, producer = kafka.consumer(), kafka.producer()
    await consumer.start()
    await producer.start()
    requests = [topics.requests_topic(tier) for tier in Tier]
    await consumer.topics()
    consumer.assign(
        [
            TopicPartition(topic, p)
            for topic in requests
            for p in consumer.partitions_for_topic(topic) or ()
        ]
    )
    interval = chunk_ms / 1000
    per_chunk = max(1, round(tokens_per_s * interval))
    heap: list[_FedStream] = []
    partitions: dict[str, list[int]] = {}
    stats = {"late_ms": 0.0, "events": 0, "streams": 0, "at": time.time()}

    async def take_requests() -> None:
        while True:
            batch = await consumer.getmany(timeout_ms=100, max_records=1000)
            for records in batch.values():
                for record in records:
                    request = orjson.loads(record.value)
                    topic = request["reply_to"]
                    if topic not in partitions:
                        partitions[topic] = sorted(await producer.partitions_for(topic))
                    heapq.heappush(
                        heap,
                        _FedStream(
                            time.monotonic(),
                            request["request_id"],
                            request.get("attempt", 0),
                            request["conversation_id"].encode(),
                            topic,
                            request["model"],
                            request["sampling"]["max_tokens"],
                        ),
                    )

    async def send_due() -> None:
        while True:
            now = time.monotonic()
            batches: dict[tuple[str, int], BatchBuilder] = {}
            while heap and heap[0].due <= now:
                stream = heapq.heappop(heap)
                stats["late_ms"] = max(stats["late_ms"], (now - stream.due) * 1000)
                partition = keyed_partition(stream.key, partitions[stream.reply_to], ())
                for value, headers in stream.next_events(per_chunk):
                    await _append(
                        producer, batches, stream.reply_to, partition, stream.key, value, headers
                    )
                    stats["events"] += 1
                if stream.sent < stream.tokens:
                    stream.due += interval
                    heapq.heappush(heap, stream)
            for (topic, partition), batch in batches.items():
                await producer.send_batch(batch, topic, partition=partition)
            if time.time() - stats["at"] >= 1.0:
                stats.update(at=time.time(), streams=len(heap))
                print("feeder " + json.dumps(stats), flush=True)
                stats.update(late_ms=0.0, events=0)
            await asyncio.sleep(TICK_S)

    try:
        await asyncio.gather(take_requests(), send_due())
    finally:
        await consumer.stop()
        await producer.stop()


async def _append(
    producer: AIOKafkaProducer,
    batches: dict[tuple[str, int], BatchBuilder],
    topic: str,
    partition: int,
    key: bytes,
    value: bytes,
    headers: list[tuple[str, bytes]],
) -> None:
    """Add one record to this tick's batch for (topic, partition); a full one goes out."""
    batch = batches.get((topic, partition))
    if batch is None:
        batch = batches[(topic, partition)] = producer.create_batch()
    if batch.append(key=key, value=value, timestamp=None, headers=headers) is None:
        await producer.send_batch(batch, topic, partition=partition)
        batch = batches[(topic, partition)] = producer.create_batch()
        batch.append(key=key, value=value, timestamp=None, headers=headers)


# --- the readers ---------------------------------------------------------------------


async def read(
    port: int,
    total: int,
    index: int,
    readers: int,
    ramp_s: float,
    start_at: float,
    max_tokens: int,
    out: Path,
) -> None:
    """Streams index, index + readers, … of `total`, each opened at its place in the ramp;
    per-stream results and merged histograms to `out` (JSON)."""
    from bench.sse_client import Target, native_turn

    target = Target("gateway", port, API_KEY, TINY_MODEL_DIR.name)
    loop = asyncio.get_running_loop()
    offset = time.time() - loop.time()

    async def one(i: int) -> StreamRecord:
        await asyncio.sleep(max(0.0, start_at + ramp_s * i / total - offset - loop.time()))
        return await native_turn(
            target, f"stream {i}: tell me a story", max_tokens, timeout_s=ramp_s + max_tokens + 120
        )

    records = await asyncio.gather(*(one(i) for i in range(index, total, readers)))
    result: dict = {
        "streams": [],
        "gaps_ms": Counter(),
        "tokens_at": Counter(),
        "events_at": Counter(),
        "errors": [],
    }
    for record in records:
        result["streams"].append(_stream_summary(record, result))
        if record.error is not None:
            result["errors"].append(record.error[:200])
    cpu = psutil.Process().cpu_times()
    result["cpu_s"] = cpu.user + cpu.system
    await asyncio.to_thread(out.parent.mkdir, parents=True, exist_ok=True)
    await asyncio.to_thread(out.write_bytes, orjson.dumps(result, option=orjson.OPT_NON_STR_KEYS))


def _stream_summary(record: StreamRecord, result: dict) -> dict:
    """One stream's numbers; its gaps and arrivals go into the shared histograms."""
    walls = [record.wall(t) for t in record.times]
    counts = [len(text.split()) for text in record.texts]
    for wall, count in zip(walls, counts, strict=True):
        result["tokens_at"][int(wall)] += count
        result["events_at"][int(wall)] += 1
    for a, b in zip(record.times, record.times[1:], strict=False):
        result["gaps_ms"][int((b - a) * 1000)] += 1
    span = record.times[-1] - record.times[0] if len(record.times) > 1 else 0.0
    return {
        "completed": record.completed,
        "ttft": record.ttft,
        "rate": (sum(counts) - counts[0]) / span if span > 0 else None,
        "first": walls[0] if walls else None,
        "last": walls[-1] if walls else None,
    }


def main(argv: list[str]) -> None:
    """Entry of the feeder and reader processes the run starts."""
    role, *args = argv
    if role == "feed":
        asyncio.run(feed(args[0], float(args[1]), float(args[2])))
    elif role == "read":
        port, total, index, readers = map(int, args[:4])
        asyncio.run(
            read(
                port,
                total,
                index,
                readers,
                float(args[4]),
                float(args[5]),
                int(args[6]),
                Path(args[7]),
            )
        )
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
