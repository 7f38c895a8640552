"""The worker's Kafka adapter: consume `chat.work`, run every request in the engine at
once, stream token chunks to `chat.tokens`, abort on cancel, heartbeat capacity, drain.
The decisions are `workers.core`'s; the consume/commit/rebalance loop of `chat.work`
is the stage runner's (`bus.stage_runner`).

Commit policy: an assignment's offset is committed only after its request has
ended (or was handed back) and its last events are acknowledged, so work a dead
worker held is read again by the partition's next owner. An assignment names its
worker and carries its scheduler's epoch: another worker's, a duplicate of one
running or just finished, and one from a scheduler fenced by a newer claim are
skipped, so no attempt ever runs twice. A later attempt of a request running here
(the scheduler took this worker for lost while its heartbeats were cut off) replaces
the running one, which stops without an end. A rebalance does not wait for running
requests: they keep streaming, and the partition's next owner skips their
assignments because they name this worker.

Drain (`drain`, on SIGTERM): no new work; running answers get `drain_timeout_s` to
finish; the rest are aborted without an end event and handed back in a last
heartbeat, and the scheduler dispatches each again as the next attempt, which
continues the answer where this one stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord, TopicPartition

from bus.clients import KafkaConfig
from bus.fetch_pace import NO_RECORDS, PacedConsumer
from bus.produce_failures import RecordRejected
from bus.stage_runner import RunnerOptions, Stage, StageRunner
from bus.subscriber import consume, decode_record
from bus.topics import topic_partitions
from ops import tracing
from ops.metrics import watch_worker
from schemas import topics
from schemas.codec import CONTROL_EVENT, WORK_EVENT
from schemas.events import (
    Cancel,
    GenerationDone,
    GenerationError,
    GenerationRequest,
    Preempt,
    SchedulerClaim,
    TokenChunk,
    ToolCallsMade,
    WorkAssignment,
)
from schemas.tools import ToolCalls
from workers.core import Attempt, Take, WorkerBook, WorkerConfig
from workers.engine import Engine
from workers.failures import client_error
from workers.resume import read_prior_output

log = logging.getLogger(__name__)

STAGE = "worker"
GROUP = "chatpipe-workers"
SHUTDOWN_S = 5.0


class WorkerStage(Stage):
    def __init__(self, kafka: KafkaConfig, engine: Engine, config: WorkerConfig) -> None:
        self.kafka = kafka
        self.engine = engine
        self.config = config
        self.book = WorkerBook(config.worker_id, uuid.uuid4().hex[:12], time.time)
        self.heartbeat_now = asyncio.Event()
        self.started = asyncio.Event()
        self.runner = StageRunner(
            kafka,
            STAGE,
            f"{GROUP}-{config.shard}" if config.shard else GROUP,
            [topics.work_topic(config.shard)],
            self,
            RunnerOptions(poll_ms=100, commit_on_revoke=True),
        )
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._control: PacedConsumer | None = None  # set by `run`

    @property
    def worker_id(self) -> str:
        return self.book.worker_id

    @property
    def partitions(self) -> tuple[int, ...]:
        """The chat.work partitions this worker holds (empty until it joined its group)."""
        return self.book.partitions

    @property
    def work(self) -> AIOKafkaConsumer:
        return self.runner.consumer

    async def run(self) -> None:
        # Cancels matter only while answers run: while none does, this consumer does not
        # fetch at all (`_follow_cancels`), and its first fetch when work comes has the
        # short wait. New work wakes the work consumer, not this one.
        control = self.kafka.consumer()
        control.busy_while(lambda: len(self.book.running), wakes=NO_RECORDS)
        async with contextlib.AsyncExitStack() as starting:  # what started stops if one fails
            await self.runner.start()
            starting.push_async_callback(self.runner.stop)
            await control.start()
            starting.push_async_callback(control.stop)
            control.assign(await topic_partitions(control, topics.CONTROL))
            starting.pop_all()
        self._control = control
        self._follow_cancels()
        self.publisher = self.runner.publisher
        self.started.set()
        watch_worker(self.engine)
        loops = [
            asyncio.create_task(self.runner.consume()),
            asyncio.create_task(
                consume(control, STAGE, self.publisher, self._on_control, poll_ms=100)
            ),
            asyncio.create_task(self._heartbeats()),
        ]
        try:
            await asyncio.gather(*loops)
        finally:
            for task in loops:
                task.cancel()
            await self._shutdown(control)

    async def _shutdown(self, control: AIOKafkaConsumer) -> None:
        """Stopping without a drain (the stage failed, or is being replaced): what still
        runs is handed back at once, for the scheduler to continue elsewhere."""
        self.book.stopping = True
        running = list(self._tasks.values())
        for request_id in list(self._tasks):
            self._hand_back(request_id)
        await asyncio.gather(*running, return_exceptions=True)
        try:
            # A broker that is gone must not hold the stop up, nor get a commit much later.
            async with asyncio.timeout(SHUTDOWN_S):
                await self.publisher.flush()  # what they streamed, before they are handed on
                await self._send_heartbeat(wait=True)
                await self.runner.commit()
        except TimeoutError:
            log.warning("stopping without a last heartbeat and commit: the bus does not answer")
        finally:
            try:
                await control.stop()
            finally:
                await self.runner.stop()

    async def drain(self, timeout_s: float) -> list[str]:
        """Stop taking work, let running answers finish for `timeout_s`, then hand the
        rest back to the scheduler; returns the ids handed back. Call while `run` runs."""
        await self.started.wait()
        self.book.stopping = True
        self.heartbeat_now.set()
        running = dict(self._tasks)
        log.info("draining: %d answers running, up to %.0f s", len(running), timeout_s)
        if running:
            await asyncio.wait(running.values(), timeout=timeout_s)
        unfinished = [rid for rid, task in running.items() if not task.done()]
        for request_id in unfinished:
            self._hand_back(request_id)
        await asyncio.gather(*(running[rid] for rid in unfinished), return_exceptions=True)
        # Everything those attempts streamed is on the bus before anyone continues them.
        await self.publisher.flush()
        handed_back = list(self.book.handed_back)
        await self._send_heartbeat(wait=True)
        await self.runner.commit()
        log.info("drained: %d answers handed back", len(handed_back))
        return handed_back

    # --- assignments ----------------------------------------------------------------

    def busy(self) -> int:
        return len(self.book.running)

    async def handle(self, record: ConsumerRecord) -> None:
        """A record of chat.work."""
        event = decode_record(WORK_EVENT, record)
        if isinstance(event, SchedulerClaim):
            self.book.claimed(record.partition, event.epoch)
        if not isinstance(event, WorkAssignment):
            return
        take = self.book.take(event, record.partition, record.offset)
        request = event.request
        if take is Take.SUPERSEDE:
            await self._supersede(request.request_id)
            take = self.book.take(event, record.partition, record.offset)
        if take is Take.SKIP:
            return
        if take is Take.HAND_BACK:
            # Dispatched before the scheduler saw this worker stop: give it back unrun.
            self.heartbeat_now.set()
            return
        tp = TopicPartition(record.topic, record.partition)
        self.runner.tracker.started(tp, record.offset)
        task = asyncio.create_task(
            tracing.in_span(
                STAGE,
                "generate",
                self._generate(request, tp, record.offset),
                request_id=request.request_id,
                attempt=request.attempt,
                model=request.model,
            )
        )
        self._tasks[request.request_id] = task
        task.add_done_callback(lambda _: self._follow_cancels())
        self._follow_cancels()

    async def _generate(self, request: GenerationRequest, tp: TopicPartition, offset: int) -> None:
        attempt = Attempt(request, self.worker_id, self.config.pacing, time.monotonic, time.time)
        try:
            prior = await read_prior_output(self.kafka, request)
            if prior.finished:
                self._end(request, tp, offset)
                return
            continuation = attempt.resume(prior)
            if not self.book.cancelled(request.answer_id):
                first_output = tracing.event_once("first_token")
                async for output in self.engine.generate(request, continuation):
                    first_output()
                    await self._send(attempt, attempt.output(output, len(self.book.running)))
            calls = attempt.pause()
            if calls is not None:
                await self._pause(attempt, calls)
            else:
                await self._send(attempt, attempt.tail())
                await self._send(attempt, attempt.done())
        except asyncio.CancelledError:
            # Shutting down or handed back: no end event, the next attempt continues.
            await self.engine.abort(request.request_id)
            self._tasks.pop(request.request_id, None)
            if self.book.stopped(request.request_id) is not None:
                self.runner.tracker.done(tp, offset)
            raise
        except Exception as exc:  # noqa: BLE001 - reported on the stream, the worker goes on
            await self._failed(attempt, exc)
        tracing.add_event("finish", status=attempt.status.value)
        self._end(request, tp, offset)
        try:
            await self.publisher.send(topics.USAGE, attempt.usage(), key=request.user_id)
        except RecordRejected:
            log.exception("usage of %s not reported", request.request_id)

    async def _pause(self, attempt: Attempt, calls: ToolCalls) -> None:
        """A server-tools round called tools: its slot is free now; the calls go on the
        stream, then (once the stream has them) to `chat.tools`, which runs them and
        queues the next round."""
        await self._send(attempt, attempt.content(calls))
        made = attempt.calls_made(calls)
        await self._send(attempt, made)
        await self.publisher.flush()
        await self.publisher.send_and_wait(
            topics.TOOLS, attempt.tool_round(calls, made), key=attempt.request.conversation_id
        )

    async def _send(
        self,
        attempt: Attempt,
        event: TokenChunk | GenerationDone | GenerationError | ToolCallsMade | None,
    ) -> None:
        if event is None:
            return
        await self.publisher.send(topics.TOKENS, event, key=attempt.request.conversation_id)
        attempt.sent()

    async def _failed(self, attempt: Attempt, exc: Exception) -> None:
        """End a generation that raised: the engine stops it, the client gets a code
        and a fixed message (`client_error`), the log gets the exception."""
        request_id = attempt.request.request_id
        log.error("request %s failed", request_id, exc_info=exc)
        await self.engine.abort(request_id)
        error = client_error(exc)
        try:
            await self._send(attempt, attempt.error(error.code, error.message))
        except RecordRejected:
            log.exception("could not end %s", request_id)

    def _end(self, request: GenerationRequest, tp: TopicPartition, offset: int) -> None:
        self._tasks.pop(request.request_id, None)
        self.book.ended(request)
        self.runner.tracker.done(tp, offset)
        self.heartbeat_now.set()

    async def _preempted(self, preempt: Preempt) -> None:
        """The scheduler takes the slot of a request running here back (a tenant over its
        share): stop it without an end, put what it streamed on the bus, then hand it
        back; its next attempt continues the stream."""
        request_id = preempt.request_id
        task = self._tasks.get(request_id)
        if preempt.worker_id != self.worker_id or task is None:
            return
        if not self.book.hand_back(request_id, attempt=preempt.attempt, until_released=True):
            return
        log.info("preempted %s (attempt %d): %s", request_id, preempt.attempt, preempt.reason)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        try:
            await self.publisher.flush()
        finally:
            self.book.released(request_id)
            self.heartbeat_now.set()

    async def _supersede(self, request_id: str) -> None:
        """Stop the running attempt of `request_id` without an end: a later attempt of it
        was assigned here, and continues from what this one streamed before that
        attempt's marker (what it streams after is not the answer's)."""
        task = self._tasks.get(request_id)
        self.book.supersede(request_id)
        log.info("%s: a later attempt replaces the one running here", request_id)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _hand_back(self, request_id: str) -> None:
        task = self._tasks.get(request_id)
        if task is not None and self.book.hand_back(request_id):
            task.cancel()

    async def _on_control(self, record: ConsumerRecord) -> None:
        event = decode_record(CONTROL_EVENT, record)
        if isinstance(event, Preempt):
            await self._preempted(event)
            return
        if not isinstance(event, Cancel):
            return
        running = self.book.cancel(event)
        if running is not None:
            log.info("cancel %s: %s", running, event.reason)
            await self.engine.abort(running)

    def _follow_cancels(self) -> None:
        """Read `chat.control` while answers run, not while none does (an idle worker's
        fetches cost it and the broker; the cancels for answers that start later are
        read when they start: its records wait on the bus meanwhile)."""
        if self._control is not None:
            self._control.listen(self._control.assignment(), bool(self.book.running))

    # --- rebalances, heartbeats --------------------------------------------------------

    def on_assign(self, assigned: set[TopicPartition]) -> None:
        self.book.partitions = tuple(sorted(tp.partition for tp in assigned))
        self.heartbeat_now.set()

    async def _heartbeats(self) -> None:
        while True:
            try:
                await self._send_heartbeat()
            except RecordRejected:  # the next one may fit (fewer answers running)
                log.exception("heartbeat not sent")
            self.heartbeat_now.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.heartbeat_now.wait(), self.config.heartbeat_interval_s)

    async def _send_heartbeat(self, wait: bool = False) -> None:
        heartbeat = self.book.heartbeat(
            self.engine.model,
            self.engine.max_slots,
            self.engine.stats(),
            getattr(self.engine, "peak_running", 0),
            {tp.partition: offset for tp, offset in self.runner.tracker.next_offsets().items()},
        )
        if wait:
            await self.publisher.send_and_wait(topics.WORKERS, heartbeat, key=self.worker_id)
        else:
            await self.publisher.send(topics.WORKERS, heartbeat, key=self.worker_id)
        if self.config.ready_file is not None and not self.book.stopping:
            self.config.ready_file.touch()  # liveness/readiness probes read its age
