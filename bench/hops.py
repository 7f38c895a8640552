"""Where chatpipe's time to first token goes, hop by hop, from Kafka record timestamps,
and what the answer's end waits after the engine is done.

For each request: the client sends it → the gateway's GenerationRequest on
`chat.requests.<tier>` → the scheduler's WorkAssignment on `chat.work` → the
worker's first TokenChunk on `chat.tokens` → safety's first Delta on
`chat.deliver.<gateway>` → the client's first content chunk. Then the end: the
worker's Done on `chat.tokens` → safety's Done on `chat.deliver.<gateway>` → the
client's `[DONE]`. Each record's timestamp is its producer's clock at send (the same
machine's clock as the client's); the milliseconds between two points are the hop's
share.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import TopicPartition

from bench.metrics import percentile
from bench.sse_client import StreamRecord
from bus.clients import KafkaConfig
from schemas import topics

HOPS = ("gateway in", "scheduler", "worker + engine", "safety", "gateway out")
"""The time to first token."""
END_HOPS = ("safety, done", "gateway out, done")
"""From the worker's Done to the client's `[DONE]`."""
FIRST_TOKEN_FETCHES = len(HOPS) - 1
"""Fetches before the first token: every hop but the gateway's intake ends with one (by the
scheduler, the worker, safety and the gateway)."""
KAFKA_HOPS = FIRST_TOKEN_FETCHES + len(END_HOPS)
"""Fetches a request waits for on its way: those before its first token, and one per hop
after its last (safety's, the gateway's)."""
_REQUEST_ID = re.compile(rb'"request_id":"([^"]+)"')


async def first_seen(
    bootstrap: str, topic_names: list[str], event_type: str, wanted: set[str], timeout_s: float = 20
) -> dict[str, float]:
    """Epoch seconds of the first `event_type` record on any of `topic_names`, per request."""
    marker = f'"type":"{event_type}"'.encode()
    consumer = KafkaConfig(bootstrap).consumer()  # reads all the broker holds (bus.fetch_repair)
    await consumer.start()
    try:
        await consumer.topics()
        partitions = [
            TopicPartition(name, p)
            for name in topic_names
            for p in sorted(consumer.partitions_for_topic(name) or ())
        ]
        consumer.assign(partitions)
        for tp in partitions:
            consumer.seek(tp, 0)
        seen: dict[str, float] = {}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not wanted <= seen.keys():
            batch = await consumer.getmany(timeout_ms=200, max_records=5000)
            for records in batch.values():
                for record in records:
                    value = record.value or b""
                    match = _REQUEST_ID.search(value) if marker in value else None
                    if match is not None:
                        rid = match.group(1).decode()
                        seen[rid] = min(seen.get(rid, float("inf")), record.timestamp / 1000)
        return seen
    finally:
        await consumer.stop()


async def ttft_hops(bootstrap: str, records: list[StreamRecord]) -> dict[str, tuple[float, float]]:
    """p50 and p90 in ms of every hop (`HOPS`, then `END_HOPS`), over the requests seen at
    every point."""
    done = [r for r in records if r.request_id and r.times]
    wanted = {r.request_id for r in done if r.request_id}
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        deliver = [t for t in await admin.list_topics() if t.startswith(topics.DELIVER_PREFIX)]
    finally:
        await admin.close()
    stops = (
        (topics.request_topics(), "request"),
        ([topics.WORK], "work"),
        ([topics.TOKENS], "chunk"),
        (deliver, "delta"),
    )
    points = [await first_seen(bootstrap, names, kind, wanted) for names, kind in stops]
    ends = [
        await first_seen(bootstrap, names, "done", wanted) for names in ([topics.TOKENS], deliver)
    ]
    samples: dict[str, list[float]] = defaultdict(list)
    for record in done:
        rid = record.request_id or ""
        if all(rid in point for point in points):
            _add(
                samples,
                HOPS,
                [
                    record.wall_started,
                    *(point[rid] for point in points),
                    record.wall(record.times[0]),
                ],
            )
        if record.ended and all(rid in point for point in ends):
            _add(samples, END_HOPS, [*(point[rid] for point in ends), record.wall(record.ended)])
    return {
        hop: (percentile(samples[hop], 50), percentile(samples[hop], 90))
        for hop in (*HOPS, *END_HOPS)
    }


def _add(samples: dict[str, list[float]], hops: tuple[str, ...], times: list[float]) -> None:
    for hop, start, end in zip(hops, times, times[1:], strict=False):
        samples[hop].append((end - start) * 1000)
