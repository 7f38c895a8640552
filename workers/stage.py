"""The worker loop: consume `chat.work`, run every request in the engine at once,
stream token chunks to `chat.tokens`, abort on cancel, heartbeat capacity.

Commit policy: an assignment's offset is committed only after its request has
ended and its last events are acknowledged, so work a dead worker held is read
again by the partition's next owner. On a rebalance the worker lets requests of
revoked partitions finish before it lets the partitions go, so no request ever
runs twice.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.structs import ConsumerRecord, TopicPartition

from bus.clients import KafkaConfig, Publisher
from bus.offsets import OffsetTracker
from bus.subscriber import consume, decode_record
from schemas import topics
from schemas.codec import CONTROL_EVENT
from schemas.events import (
    Cancel,
    GenerationDone,
    GenerationError,
    GenerationRequest,
    TokenChunk,
    Usage,
    UsageEvent,
    WorkAssignment,
    WorkerHeartbeat,
    stream_fields,
)
from schemas.lifecycle import RequestStatus
from workers.coalesce import ChunkPacing, Coalescer
from workers.engine import Continuation, Engine, EngineOutput
from workers.resume import read_prior_output

log = logging.getLogger(__name__)

STAGE = "worker"
GROUP = "chatpipe-workers"
RECENT_CANCELS = 10_000


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, stage: WorkerStage) -> None:
        self.stage = stage

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.stage.release(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.stage.partitions = tuple(sorted(tp.partition for tp in assigned))
        self.stage.heartbeat_now.set()


class WorkerStage:
    def __init__(
        self,
        kafka: KafkaConfig,
        engine: Engine,
        worker_id: str,
        pacing: ChunkPacing = ChunkPacing(0.05, 0.05, 0),
        heartbeat_interval_s: float = 1.0,
        ready_file: Path | None = None,
    ) -> None:
        self.kafka = kafka
        self.engine = engine
        self.worker_id = worker_id
        self.pacing = pacing
        self.heartbeat_interval_s = heartbeat_interval_s
        self.ready_file = ready_file
        self.partitions: tuple[int, ...] = ()
        self.heartbeat_now = asyncio.Event()
        self.tracker = OffsetTracker()
        self._running: dict[str, tuple[asyncio.Task[None], TopicPartition]] = {}
        self._cancelled: OrderedDict[str, None] = OrderedDict()
        self._progress: dict[str, tuple[int, int]] = {}
        self._stopping = False

    async def run(self) -> None:
        producer = self.kafka.producer()
        await producer.start()
        self.publisher = Publisher(producer)
        self.work = self.kafka.consumer(group_id=GROUP)
        self.work.subscribe([topics.WORK], listener=_Rebalance(self))
        control = self.kafka.consumer()
        await self.work.start()
        await control.start()
        control.assign(await _all_partitions(control, topics.CONTROL))
        loops = [
            asyncio.create_task(consume(self.work, STAGE, self.publisher, self._on_work,
                                        self._commit, poll_ms=100, tracker=self.tracker)),
            asyncio.create_task(consume(control, STAGE, self.publisher, self._on_control,
                                        poll_ms=100)),
            asyncio.create_task(self._heartbeats()),
        ]
        try:
            await asyncio.gather(*loops)
        finally:
            for task in loops:
                task.cancel()
            await self._shutdown(control, producer)

    async def _shutdown(self, control: AIOKafkaConsumer, producer: object) -> None:
        self._stopping = True
        for task, _ in list(self._running.values()):
            task.cancel()
        await asyncio.gather(*(t for t, _ in self._running.values()), return_exceptions=True)
        try:
            await self._send_heartbeat()
            await self._commit()
        finally:
            await self.work.stop()
            await control.stop()
            await self.publisher.producer.stop()

    # --- assignments ----------------------------------------------------------------

    async def _on_work(self, record: ConsumerRecord) -> None:
        tp = TopicPartition(record.topic, record.partition)
        assignment = decode_record(WorkAssignment, record)
        request = assignment.request
        # An assignment is for the worker it names: one read after a partition moved
        # belongs to a worker the scheduler has already given the request's next attempt.
        if assignment.worker_id != self.worker_id or request.request_id in self._running:
            self.tracker.seen(tp, record.offset)
            return
        self.tracker.started(tp, record.offset)
        task = asyncio.create_task(self._generate(request, tp, record.offset))
        self._running[request.request_id] = (task, tp)

    async def _generate(self, request: GenerationRequest, tp: TopicPartition, offset: int) -> None:
        started = time.monotonic()
        prior = await read_prior_output(self.kafka, request)
        if prior.finished:
            self._end(request, tp, offset)
            return
        stream = _StreamWriter(self.publisher, request, prior.next_seq, self._on_stream_start)
        continuation = Continuation(prior.text, prior.tokens) if request.resume else None
        last: EngineOutput | None = None
        status = RequestStatus.FINISHED_ABORTED
        try:
            if request.request_id not in self._cancelled:
                coalescer = Coalescer(self.pacing.interval_s)
                async for output in self.engine.generate(request, continuation):
                    last = output
                    coalescer.interval_s = self.pacing.interval(len(self._running))
                    chunk = coalescer.add(output.text, output.new_tokens, time.monotonic())
                    if chunk is not None:
                        await stream.chunk(chunk.text, chunk.tokens, output.completion_tokens)
                    status = output.status or status
                tail = coalescer.flush(time.monotonic())
                if tail is not None and last is not None:
                    await stream.chunk(tail.text, tail.tokens, last.completion_tokens)
            usage = _usage(last)
            await stream.done(status, usage)
        except asyncio.CancelledError:
            # Shutting down: the offset stays uncommitted, so the work is read again.
            await self.engine.abort(request.request_id)
            self._running.pop(request.request_id, None)
            self._progress.pop(request.request_id, None)
            raise
        except Exception as exc:  # noqa: BLE001 - reported on the stream, the worker goes on
            log.exception("request %s failed", request.request_id)
            status, usage = RequestStatus.FINISHED_ERROR, _usage(last)
            await stream.error("engine_error", str(exc))
        self._end(request, tp, offset)
        await self.publisher.send(
            topics.USAGE,
            UsageEvent(
                request_id=request.request_id, attempt=request.attempt,
                conversation_id=request.conversation_id, user_id=request.user_id,
                org_id=request.org_id, tier=request.tier, model=request.model,
                requested_model=request.requested_model, worker_id=self.worker_id, status=status, prompt_tokens=usage.prompt_tokens,
                completion_tokens=usage.completion_tokens, cached_tokens=usage.cached_tokens,
                gpu_ms=(time.monotonic() - started) * 1000,
            ),
            key=request.user_id,
        )

    def _end(self, request: GenerationRequest, tp: TopicPartition, offset: int) -> None:
        self._running.pop(request.request_id, None)
        self._progress.pop(request.request_id, None)
        self.tracker.done(tp, offset)
        self.heartbeat_now.set()

    def _on_stream_start(self, request_id: str, partition: int, offset: int) -> None:
        """The first event of a request is on chat.tokens: tell the scheduler at once,
        so a redispatch after this worker dies resumes from it."""
        if request_id in self._running:
            self._progress[request_id] = (partition, offset)
            self.heartbeat_now.set()

    async def _on_control(self, record: ConsumerRecord) -> None:
        event = decode_record(CONTROL_EVENT, record)
        if not isinstance(event, Cancel):
            return
        self._cancelled[event.request_id] = None
        while len(self._cancelled) > RECENT_CANCELS:
            self._cancelled.popitem(last=False)
        if event.request_id in self._running:
            log.info("cancel %s: %s", event.request_id, event.reason)
            await self.engine.abort(event.request_id)

    # --- commits, rebalances, heartbeats ---------------------------------------------

    async def _commit(self) -> None:
        offsets = self.tracker.to_commit()
        if not offsets:
            return
        await self.publisher.flush()
        await self.work.commit(offsets)
        self.tracker.committed(offsets)

    async def release(self, revoked: set[TopicPartition]) -> None:
        """Let requests of revoked partitions finish, commit them, then let go."""
        leaving = [task for task, tp in self._running.values() if tp in revoked]
        if leaving:
            log.info("rebalance: finishing %d requests before handing over", len(leaving))
            await asyncio.gather(*leaving, return_exceptions=True)
        await self._commit()
        self.tracker.forget(revoked)

    async def _heartbeats(self) -> None:
        while True:
            await self._send_heartbeat()
            self.heartbeat_now.clear()
            try:
                await asyncio.wait_for(self.heartbeat_now.wait(), self.heartbeat_interval_s)
            except TimeoutError:
                pass

    async def _send_heartbeat(self) -> None:
        stats = self.engine.stats()
        await self.publisher.send(
            topics.WORKERS,
            WorkerHeartbeat(
                worker_id=self.worker_id,
                model=self.engine.model,
                partitions=self.partitions,
                max_slots=self.engine.max_slots,
                active=tuple(self._running),
                consumed={tp.partition: offset
                          for tp, offset in self.tracker.next_offsets().items()},
                running=stats.running,
                waiting=stats.waiting,
                peak_running=getattr(self.engine, "peak_running", 0),
                progress=dict(self._progress),
                free_kv_blocks=stats.free_kv_blocks,
                stopping=self._stopping,
            ),
            key=self.worker_id,
        )
        if self.ready_file is not None and not self._stopping:
            self.ready_file.touch()  # liveness/readiness probes read its age


class _StreamWriter:
    """Publishes one request's events on `chat.tokens` with consecutive seq numbers."""

    def __init__(self, publisher: Publisher, request: GenerationRequest, first_seq: int,
                 on_start: Callable[[str, int, int], None]) -> None:
        self.publisher = publisher
        self.request = request
        self.seq = first_seq  # gapless; the done/error event takes the next one
        self._on_start: Callable[[str, int, int], None] | None = on_start

    def _fields(self) -> dict[str, object]:
        seq, self.seq = self.seq, self.seq + 1
        return stream_fields(self.request, seq)

    async def _send(self, event: TokenChunk | GenerationDone | GenerationError) -> None:
        delivered = await self.publisher.send(topics.TOKENS, event,
                                              key=self.request.conversation_id)
        if self._on_start is not None:
            on_start, self._on_start = self._on_start, None
            metadata = await delivered
            on_start(self.request.request_id, metadata.partition, metadata.offset)

    async def chunk(self, text: str, tokens: int, completion_tokens: int) -> None:
        await self._send(TokenChunk(**self._fields(), text=text, token_count=tokens,
                                    completion_tokens=completion_tokens))

    async def done(self, status: RequestStatus, usage: Usage) -> None:
        await self._send(GenerationDone(**self._fields(), status=status, usage=usage))

    async def error(self, code: str, message: str) -> None:
        await self._send(GenerationError(**self._fields(), code=code, message=message))


def _usage(last: EngineOutput | None) -> Usage:
    if last is None:
        return Usage()
    return Usage(prompt_tokens=last.prompt_tokens, completion_tokens=last.completion_tokens,
                 cached_tokens=last.cached_tokens)


async def _all_partitions(consumer: AIOKafkaConsumer, topic: str) -> list[TopicPartition]:
    await consumer.topics()  # refreshes metadata
    partitions = consumer.partitions_for_topic(topic) or set()
    return [TopicPartition(topic, p) for p in sorted(partitions)]
