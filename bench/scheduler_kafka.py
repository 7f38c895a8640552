"""The scheduler's Kafka stage at load, for `python -m bench scheduler_sim`: the real
`chatpipe.cli scheduler` process on the embedded broker, with simulated workers here
(one `chat.work` partition each, heartbeats on every end and every second) and requests
from the sim's mix published to `chat.requests.<tier>`, the waiting set held at a size.
It counts the assignments the workers read: decisions per second end to end, through
decoding, the core, the journal and the bus. With `shards` > 1, each shard decides for
one model (`m0`, `m1`, ...) in its own scheduler process on its own `chat.work.<shard>`,
with its share of the workers; requests go to the models in turn.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from bench.process_pipeline import running_pipeline
from bench.scheduler_sim import BIG, SLOT_CHOICES, Arrivals, SimWorker
from bus.clients import Publisher
from bus.subscriber import decode_record
from bus.topics import create_topics
from schemas import topics
from schemas.codec import WORK_EVENT
from schemas.events import WorkAssignment

REPLY_TO = "chat.deliver.bench"
SERVICE_S = 2.0
"""Mean answer time: slots free at (slots / SERVICE_S) a second, more than the stage
carries on this machine, so the run measures what it carries."""
WARMUP_S = 5.0
SERIAL = itertools.count()
"""Orders answers ending at the same time."""


@dataclass
class Counts:
    """Requests published, assignments read (and at the measured window's start), the
    waiting set's size at each step."""

    published: int = 0
    decided: int = 0
    measured: int = 0
    waiting: list[int] = field(default_factory=list)


def kafka_run(
    workers: int, seconds: float, seed: int = 15, waiting: int = 1000, shards: int = 1
) -> str:
    """One run; the line to print."""
    return asyncio.run(_run(workers, seconds, seed, waiting, shards))


@dataclass(frozen=True)
class Layout:
    """Which model and journal each simulated worker has: with one shard, every worker
    serves BIG on `chat.work`; else worker i serves model m(i % shards) of shard
    s(i % shards), on partition i // shards of its `chat.work.<shard>`."""

    workers: int
    shards: int

    def model(self, shard: int) -> str:
        return BIG if self.shards == 1 else f"m{shard}"

    def topic(self, shard: int) -> str:
        return topics.WORK if self.shards == 1 else topics.work_topic(f"s{shard}")

    def settings(self) -> dict[str, dict[str, list[str]]]:
        if self.shards == 1:
            return {}
        return {"scheduler_shards": {f"s{i}": [self.model(i)] for i in range(self.shards)}}

    def partitions(self) -> int:
        return -(-self.workers // self.shards)

    def place(self, worker: int) -> tuple[str, int]:
        """(topic, partition) of worker `worker`."""
        return self.topic(worker % self.shards), worker // self.shards


async def _run(workers: int, seconds: float, seed: int, waiting: int, shards: int) -> str:
    rng = random.Random(seed)
    tmp = Path(tempfile.mkdtemp(prefix="chatpipe-scheduler-sim-"))
    layout = Layout(workers, shards)
    async with running_pipeline(
        tmp,
        work_partitions=layout.partitions(),
        tier_max_wait_s={},
        worker_lost_after_s=10.0,
        **layout.settings(),
    ) as pipe:
        await create_topics(pipe.kafka, {REPLY_TO: 1})
        if shards == 1:
            await pipe.start("scheduler")
        for shard in range(shards if shards > 1 else 0):
            await pipe.start(f"scheduler-s{shard}", "scheduler", scheduler_shard=f"s{shard}")
        producer = pipe.kafka.producer()
        await producer.start()
        publisher = Publisher(producer)
        sim = [
            SimWorker(
                f"kw{i}", layout.model(i % shards), rng.choice(SLOT_CHOICES), layout.place(i)[1]
            )
            for i in range(workers)
        ]
        placed = {layout.place(i): worker for i, worker in enumerate(sim)}
        for worker in sim:
            await publisher.send(
                topics.WORKERS, worker.heartbeat(time.time()), key=worker.worker_id
            )
        counts = Counts()
        reader = AIOKafkaConsumer(
            bootstrap_servers=pipe.broker.bootstrap_servers,
            group_id=None,
            enable_auto_commit=False,
            fetch_max_wait_ms=20,
        )
        await reader.start()
        reader.assign([TopicPartition(*place) for place in placed])
        await reader.seek_to_beginning()
        try:
            started = time.monotonic()
            ends: list[tuple[float, int, SimWorker, str]] = []
            loops = asyncio.gather(
                _read_work(reader, placed, ends, counts, rng),
                _drive(publisher, sim, ends, counts, rng, waiting, layout),
            )
            measured_from = started + WARMUP_S
            task = asyncio.ensure_future(loops)
            await asyncio.sleep(WARMUP_S)
            counts.measured = counts.decided
            counts.waiting.clear()
            await asyncio.sleep(seconds)
            decided = counts.decided - counts.measured
            elapsed = time.monotonic() - measured_from
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        finally:
            await reader.stop()
            await producer.stop()
        for name, stage in pipe.stages.items():
            if not stage.running:
                raise RuntimeError(f"{name} exited:\n" + pipe.log_tail(name))
    mean_waiting = sum(counts.waiting) / len(counts.waiting) if counts.waiting else 0
    processes = f"{shards} shard processes" if shards > 1 else "chatpipe.cli scheduler"
    return (
        f"kafka stage ({processes} on the embedded broker), {workers} "
        f"simulated workers, ~{mean_waiting:,.0f} waiting: {decided} assignments read "
        f"in {elapsed:.1f} s: {decided / elapsed:,.0f} decisions/s end to end"
    )


async def _read_work(
    reader: AIOKafkaConsumer,
    placed: dict[tuple[str, int], SimWorker],
    ends: list[tuple[float, int, SimWorker, str]],
    counts: Counts,
    rng: random.Random,
) -> None:
    """Each worker reads its partition: an assignment starts, to end after its time."""
    while True:
        batches = await reader.getmany(timeout_ms=100)
        now = time.monotonic()
        for tp, records in batches.items():
            worker = placed[tp.topic, tp.partition]
            for record in records:
                worker.consumed = record.offset + 1
                event = decode_record(WORK_EVENT, record)
                if not isinstance(event, WorkAssignment) or event.worker_id != worker.worker_id:
                    continue
                rid = event.request.request_id
                worker.running[rid] = (tp.partition, record.offset)
                heapq.heappush(
                    ends, (now + rng.expovariate(1 / SERVICE_S), next(SERIAL), worker, rid)
                )
                counts.decided += 1


async def _drive(
    publisher: Publisher,
    sim: list[SimWorker],
    ends: list[tuple[float, int, SimWorker, str]],
    counts: Counts,
    rng: random.Random,
    waiting: int,
    layout: Layout,
) -> None:
    """Every 10 ms: answers end (their workers heartbeat), the waiting set is topped up
    (the shards' models in turn); every worker heartbeats at least once a second."""
    arrivals = Arrivals(rng)
    beat_at = {w.worker_id: 0.0 for w in sim}
    while True:
        now = time.monotonic()
        dirty: dict[str, SimWorker] = {}
        while ends and ends[0][0] <= now:
            _, _, ended, rid = heapq.heappop(ends)
            if ended.running.pop(rid, None) is not None:
                dirty[ended.worker_id] = ended
        dirty |= {w.worker_id: w for w in sim if now - beat_at[w.worker_id] >= 1.0}
        for worker in dirty.values():
            beat_at[worker.worker_id] = now
            await publisher.send(
                topics.WORKERS, worker.heartbeat(time.time()), key=worker.worker_id
            )
        counts.waiting.append(counts.published - counts.decided)
        for _ in range(max(0, waiting - (counts.published - counts.decided))):
            request = arrivals.next(now, time.time()).model_copy(
                update={
                    "reply_to": REPLY_TO,
                    "deadline": None,
                    "model": layout.model(arrivals.serial % layout.shards),
                }
            )
            await publisher.send(
                topics.requests_topic(request.tier), request, key=request.conversation_id
            )
            counts.published += 1
        await asyncio.sleep(0.01)
