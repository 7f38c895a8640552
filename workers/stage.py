"""The worker loop: consume `chat.work`, run every request in the engine at once,
stream token chunks to `chat.tokens`, abort on cancel, heartbeat capacity, drain.

Commit policy: an assignment's offset is committed only after its request has
ended (or was handed back) and its last events are acknowledged, so work a dead
worker held is read again by the partition's next owner. An assignment names its
worker and carries its scheduler's epoch: another worker's, a duplicate of one
running or just finished, and one from a scheduler fenced by a newer claim are
skipped, so no attempt ever runs twice. A rebalance does not wait for running
requests: they keep streaming, and the partition's next owner skips their
assignments because they name this worker.

Drain (`drain`, on SIGTERM): no new work; running answers get `drain_timeout_s` to
finish; the rest are aborted without an end event and handed back in a last
heartbeat, and the scheduler dispatches each again as the next attempt, which
continues the answer where this one stopped.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka.structs import ConsumerRecord, TopicPartition

from bus.clients import KafkaConfig
from bus.fetch_pace import NO_RECORDS
from bus.offsets import OffsetTracker
from bus.produce_failures import RecordRejected, RetryingPublisher
from bus.subscriber import consume, decode_record
from ops import tracing
from ops.metrics import watch_worker
from schemas import topics
from schemas.answer import UNKNOWN_END_SEQ
from schemas.codec import CONTROL_EVENT, WORK_EVENT
from schemas.events import (
    Cancel,
    GenerationRequest,
    SchedulerClaim,
    UsageEvent,
    WorkAssignment,
    WorkerHeartbeat,
)
from schemas.lifecycle import RequestStatus
from workers.coalesce import ChunkPacing, Coalescer
from workers.engine import Continuation, Engine, EngineOutput
from workers.failures import client_error
from workers.resume import PriorOutput, read_prior_output
from workers.streams import StreamWriter, usage_of

log = logging.getLogger(__name__)

STAGE = "worker"
GROUP = "chatpipe-workers"
RECENT = 10_000
SHUTDOWN_S = 5.0


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, stage: WorkerStage) -> None:
        self.stage = stage

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.stage.release(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.stage.partitions = tuple(sorted(tp.partition for tp in assigned))
        self.stage.heartbeat_now.set()


@dataclass(slots=True)
class _Running:
    task: asyncio.Task[None]
    tp: TopicPartition
    offset: int


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
        self.incarnation = uuid.uuid4().hex[:12]
        """This process: assignments for another one under the same worker id are not ours."""
        self.pacing = pacing
        self.heartbeat_interval_s = heartbeat_interval_s
        self.ready_file = ready_file
        self.partitions: tuple[int, ...] = ()
        self.heartbeat_now = asyncio.Event()
        self.started = asyncio.Event()
        self.tracker = OffsetTracker()
        self._running: dict[str, _Running] = {}
        self._finished: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._cancelled: OrderedDict[str, None] = OrderedDict()
        self._epochs: dict[int, int] = {}
        self._handed_back: dict[str, tuple[int, int]] = {}
        """Requests given back unfinished -> (chat.work partition, offset) of their assignment."""
        self._stopping = False

    async def run(self) -> None:
        producer = self.kafka.producer()
        await producer.start()
        self.publisher = RetryingPublisher(producer)
        self.work = self.kafka.consumer(group_id=GROUP)
        self.work.subscribe([topics.WORK], listener=_Rebalance(self))
        # Not a quiet consumer: when work comes after a quiet spell, this consumer's
        # fetch in flight is an idle one, and a cancel waits it out (GPU time wasted).
        control = self.kafka.consumer()
        # Cancels matter only while answers run; new work wakes the work consumer too.
        self.work.busy_while(lambda: bool(self._running))
        control.busy_while(lambda: bool(self._running), wakes=NO_RECORDS)
        await self.work.start()
        await control.start()
        control.assign(await _all_partitions(control, topics.CONTROL))
        self.started.set()
        watch_worker(self.engine)
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
        """Stopping without a drain (the stage failed, or is being replaced): what still
        runs is handed back at once, for the scheduler to continue elsewhere."""
        self._stopping = True
        running = [r.task for r in self._running.values()]
        for request_id in list(self._running):
            self._hand_back(request_id)
        await asyncio.gather(*running, return_exceptions=True)
        try:
            # A broker that is gone must not hold the stop up, nor get a commit much later.
            async with asyncio.timeout(SHUTDOWN_S):
                await self.publisher.flush()  # what they streamed, before they are handed on
                await self._send_heartbeat(wait=True)
                await self._commit()
        except TimeoutError:
            log.warning("stopping without a last heartbeat and commit: the bus does not answer")
        finally:
            await self.work.stop()
            await control.stop()
            await self.publisher.producer.stop()

    async def drain(self, timeout_s: float) -> list[str]:
        """Stop taking work, let running answers finish for `timeout_s`, then hand the
        rest back to the scheduler; returns the ids handed back. Call while `run` runs."""
        await self.started.wait()
        self._stopping = True
        self.heartbeat_now.set()
        running = {rid: r.task for rid, r in self._running.items()}
        log.info("draining: %d answers running, up to %.0f s", len(running), timeout_s)
        if running:
            await asyncio.wait(running.values(), timeout=timeout_s)
        unfinished = [rid for rid, task in running.items() if not task.done()]
        for request_id in unfinished:
            self._hand_back(request_id)
        await asyncio.gather(*(running[rid] for rid in unfinished), return_exceptions=True)
        # Everything those attempts streamed is on the bus before anyone continues them.
        await self.publisher.flush()
        handed_back = list(self._handed_back)
        await self._send_heartbeat(wait=True)
        await self._commit()
        log.info("drained: %d answers handed back", len(handed_back))
        return handed_back

    # --- assignments ----------------------------------------------------------------

    async def _on_work(self, record: ConsumerRecord) -> None:
        tp = TopicPartition(record.topic, record.partition)
        event = decode_record(WORK_EVENT, record)
        if isinstance(event, SchedulerClaim):
            self._epochs[tp.partition] = max(self._epochs.get(tp.partition, 0), event.epoch)
        if not isinstance(event, WorkAssignment) or not self._takes(event, tp):
            self.tracker.seen(tp, record.offset)
            return
        request = event.request
        self.tracker.started(tp, record.offset)
        if self._stopping:
            # Dispatched before the scheduler saw this worker stop: give it back unrun.
            self._handed_back[request.request_id] = (tp.partition, record.offset)
            self.tracker.done(tp, record.offset)
            self.heartbeat_now.set()
            return
        task = asyncio.create_task(tracing.in_span(
            STAGE, "generate", self._generate(request, tp, record.offset),
            request_id=request.request_id, attempt=request.attempt, model=request.model))
        self._running[request.request_id] = _Running(task, tp, record.offset)

    def _takes(self, assignment: WorkAssignment, tp: TopicPartition) -> bool:
        """Run it? Only this worker's, from an unfenced scheduler, and only once."""
        request = assignment.request
        epoch = self._epochs.get(tp.partition, 0)
        if assignment.epoch < epoch:
            log.warning("skipping %s: dispatched by a fenced scheduler", request.request_id)
            return False
        self._epochs[tp.partition] = assignment.epoch
        if assignment.worker_id != self.worker_id:
            return False  # read after its partition moved: it belongs to another worker
        if assignment.incarnation and assignment.incarnation != self.incarnation:
            return False  # for this worker's previous process: the scheduler redispatches it
        return (request.request_id not in self._running
                and (request.request_id, request.attempt) not in self._finished)

    async def _generate(self, request: GenerationRequest, tp: TopicPartition, offset: int) -> None:
        started = time.monotonic()
        stream = StreamWriter(self.publisher, request, UNKNOWN_END_SEQ)
        prior: PriorOutput | None = None
        last: EngineOutput | None = None
        status = RequestStatus.FINISHED_ABORTED
        try:
            prior = await read_prior_output(self.kafka, request)
            if prior.finished:
                self._end(request, tp, offset)
                return
            stream.seq = prior.next_seq
            if request.request_id not in self._cancelled:
                last, status = await self._stream_engine(request, prior, stream)
            await stream.done(status, usage_of(last, prior.tokens))
        except asyncio.CancelledError:
            # Shutting down or handed back: no end event, the next attempt continues.
            await self.engine.abort(request.request_id)
            self._running.pop(request.request_id, None)
            if request.request_id in self._handed_back:
                self.tracker.done(tp, offset)
            raise
        except Exception as exc:  # noqa: BLE001 - reported on the stream, the worker goes on
            status = RequestStatus.FINISHED_ERROR
            await self._failed(request, stream, exc)
        tracing.add_event("finish", status=status.value)
        self._end(request, tp, offset)
        try:
            await self._report_usage(request, last, prior, status, started)
        except RecordRejected:
            log.exception("usage of %s not reported", request.request_id)

    async def _failed(self, request: GenerationRequest, stream: StreamWriter,
                      exc: Exception) -> None:
        """End a generation that raised: the engine stops it, the client gets a code
        and a fixed message (`client_error`), the log gets the exception."""
        log.error("request %s failed", request.request_id, exc_info=exc)
        await self.engine.abort(request.request_id)
        error = client_error(exc)
        try:
            await stream.error(error.code, error.message)
        except RecordRejected:
            log.exception("could not end %s", request.request_id)

    async def _stream_engine(self, request: GenerationRequest, prior: PriorOutput,
                             stream: StreamWriter) -> tuple[EngineOutput | None, RequestStatus]:
        continuation = (Continuation(prior.text, prior.tokens, prior.token_ids)
                        if prior.streamed else None)
        coalescer = Coalescer(self.pacing.interval_s)
        last: EngineOutput | None = None
        status = RequestStatus.FINISHED_ABORTED
        first_output = tracing.event_once("first_token")
        async for output in self.engine.generate(request, continuation):
            first_output()
            last = output
            coalescer.interval_s = self.pacing.interval(len(self._running))
            chunk = coalescer.add(output.text, output.new_tokens, time.monotonic(),
                                  output.token_ids)
            if chunk is not None:
                await stream.chunk(chunk.text, chunk.tokens, output.completion_tokens,
                                   chunk.token_ids)
            status = output.status or status
        tail = coalescer.flush(time.monotonic())
        if tail is not None and last is not None:
            await stream.chunk(tail.text, tail.tokens, last.completion_tokens, tail.token_ids)
        return last, status

    async def _report_usage(self, request: GenerationRequest, last: EngineOutput | None,
                            prior: PriorOutput | None, status: RequestStatus,
                            started: float) -> None:
        inherited = prior.tokens if prior is not None else 0
        usage = usage_of(last, inherited)
        await self.publisher.send(
            topics.USAGE,
            UsageEvent(
                request_id=request.request_id, attempt=request.attempt,
                conversation_id=request.conversation_id, user_id=request.user_id,
                org_id=request.org_id, tier=request.tier, model=request.model,
                requested_model=request.requested_model, worker_id=self.worker_id,
                status=status, prompt_tokens=usage.prompt_tokens,
                completion_tokens=max(0, usage.completion_tokens - inherited),
                prior_completion_tokens=inherited, cached_tokens=usage.cached_tokens,
                gpu_ms=(time.monotonic() - started) * 1000,
            ),
            key=request.user_id,
        )

    def _end(self, request: GenerationRequest, tp: TopicPartition, offset: int) -> None:
        self._running.pop(request.request_id, None)
        self._finished[(request.request_id, request.attempt)] = None
        while len(self._finished) > RECENT:
            self._finished.popitem(last=False)
        self.tracker.done(tp, offset)
        self.heartbeat_now.set()

    def _hand_back(self, request_id: str) -> None:
        running = self._running.get(request_id)
        if running is not None:
            self._handed_back[request_id] = (running.tp.partition, running.offset)
            running.task.cancel()

    async def _on_control(self, record: ConsumerRecord) -> None:
        event = decode_record(CONTROL_EVENT, record)
        if not isinstance(event, Cancel) or event.held_by is not None:
            return  # a conditional cancel is the scheduler's to pass on
        self._cancelled[event.request_id] = None
        while len(self._cancelled) > RECENT:
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
        """Partitions move: commit what is done and let go at once. Requests still
        running keep streaming; the next owner skips their assignments (they name
        this worker), and the scheduler learns their end from heartbeats."""
        try:
            await self._commit()
        except Exception:
            log.warning("commit before a rebalance failed", exc_info=True)
        self.tracker.forget(revoked)

    async def _heartbeats(self) -> None:
        while True:
            try:
                await self._send_heartbeat()
            except RecordRejected:  # the next one may fit (fewer answers running)
                log.exception("heartbeat not sent")
            self.heartbeat_now.clear()
            try:
                await asyncio.wait_for(self.heartbeat_now.wait(), self.heartbeat_interval_s)
            except TimeoutError:
                pass

    async def _send_heartbeat(self, wait: bool = False) -> None:
        stats = self.engine.stats()
        heartbeat = WorkerHeartbeat(
            worker_id=self.worker_id,
            incarnation=self.incarnation,
            model=self.engine.model,
            partitions=self.partitions,
            max_slots=self.engine.max_slots,
            active=tuple(self._running),
            consumed={tp.partition: offset for tp, offset in self.tracker.next_offsets().items()},
            assignments={**self._handed_back,
                         **{rid: (r.tp.partition, r.offset) for rid, r in self._running.items()}},
            handed_back=tuple(self._handed_back),
            running=stats.running,
            waiting=stats.waiting,
            peak_running=getattr(self.engine, "peak_running", 0),
            free_kv_blocks=stats.free_kv_blocks,
            stopping=self._stopping,
        )
        if wait:
            await self.publisher.send_and_wait(topics.WORKERS, heartbeat, key=self.worker_id)
        else:
            await self.publisher.send(topics.WORKERS, heartbeat, key=self.worker_id)
        if self.ready_file is not None and not self._stopping:
            self.ready_file.touch()  # liveness/readiness probes read its age


async def _all_partitions(consumer: AIOKafkaConsumer, topic: str) -> list[TopicPartition]:
    await consumer.topics()  # refreshes metadata
    partitions = consumer.partitions_for_topic(topic) or set()
    return [TopicPartition(topic, p) for p in sorted(partitions)]
