"""The scheduler's Kafka adapter: feeds the core, writes its decisions to `chat.work`.

One scheduler acts at a time (per shard: `scheduler/shards.py`, each on its own
`chat.work.<shard>`). At start it claims: a `SchedulerClaim`, with an epoch above every
earlier one of its shard, goes to `chat.scheduler` and to every `chat.work` partition.
Workers skip older epochs' assignments from then on, and an older scheduler that
reads the claim stops acting (fenced) and stays idle.

`chat.work` is the scheduler's journal: assignments, `Unserved` records, claims. A
restarted scheduler replays it from its committed offset up to its own claim (a known
end: Tansu cannot say where a partition ends), so a request it reads again is never
decided twice; `JournalWindow` says which journal offset may be committed. It runs on
the stage runner by assignment (`RunnerOptions(assign=True)`): every topic read from the
group's committed offsets, no group join, so a restart never waits for a dead member's
session to time out. A request's offset is committed once it is decided (dispatched or
ended), after its events are sent; heartbeats and control events less often
(`commit_rule`); `chat.scheduler` only by the claim; the journal after them
(`_commit_journal`). Decisions are made one batch at a time, after the batch's records.

Before each attempt it writes the attempt's `AttemptStarted` marker on `chat.tokens`;
the assignment carries where the stream lies (`StreamPosition`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable

from aiokafka.structs import ConsumerRecord, TopicPartition

from bus.clients import KafkaConfig
from bus.produce_failures import PIPELINE_REJECTED, RecordRejected, RetryingPublisher
from bus.replay import read_between
from bus.stage_runner import Offsets, RunnerOptions, Stage, StageRunner
from bus.subscriber import decode_record, failed
from ops import metrics, tracing
from scheduler.claims import Claim
from scheduler.core import Dispatch, Policy, Preemption, Scheduler
from scheduler.delivery_topics import DeliveryTopicJanitor
from scheduler.gateways import GatewayWatch
from scheduler.journal import (
    CANCELLED,
    DEADLINE_EXCEEDED,
    DISPATCH_FAILED,
    JournalWindow,
    unserved_end,
    unserved_partition,
)
from scheduler.shards import HeapFreezer, Shard
from schemas import topics
from schemas.codec import CONTROL_EVENT, SCHEDULER_EVENT, WORK_EVENT, encode
from schemas.events import (
    AttemptStarted,
    Cancel,
    Event,
    GatewayHeartbeat,
    GenerationRequest,
    Preempt,
    Queued,
    Reroute,
    Routed,
    SchedulerClaim,
    SchedulerStatus,
    StreamPosition,
    TierStatus,
    Unserved,
    WorkAssignment,
    WorkerHeartbeat,
)
from schemas.topics import Tier

log = logging.getLogger(__name__)

STAGE = "scheduler"
REPLAY_TIMEOUT_S = 60.0
READ_BACK_TIMEOUT_S = 3.0
READ_BACK_TRIES = 3
STATUS_UNCHANGED_S = 10.0
BEATS_COMMIT_S = 5.0
SWEEP_S = 60.0
"""How often the delivery topics of gone gateways are looked for, at most."""
BEAT_TOPICS = frozenset({topics.WORKERS, topics.CONTROL})


class SchedulerStage(Stage):
    def __init__(
        self,
        kafka: KafkaConfig,
        policy: Policy,
        status_interval_s: float = 1.0,
        scheduler_id: str | None = None,
        deliver_topic_ttl_s: float = 0.0,
        shard: Shard = Shard(),
        gc_freeze_s: float = 0.0,
    ) -> None:
        self.kafka = kafka
        self.shard = shard
        self.work_topic = shard.work_topic
        self.core = Scheduler(policy, clock=time.monotonic, wall=time.time)
        self.worker_lost_after_s = policy.worker_lost_after_s
        self.status_interval_s = status_interval_s
        self.scheduler_id = scheduler_id or f"scheduler-{uuid.uuid4().hex[:8]}"
        self.fenced = asyncio.Event()
        # Heartbeats and status come all the time: only requests are work.
        self.runner = StageRunner(
            kafka,
            STAGE,
            shard.group,
            (
                *topics.request_topics(),
                topics.CONTROL,
                topics.WORKERS,
                topics.SCHEDULER,
                self.work_topic,
            ),
            self,
            RunnerOptions(assign=True, poll_ms=100),
        )
        self.publisher: RetryingPublisher
        self._sources: dict[str, tuple[TopicPartition, int]] = {}
        self._status_sent_at = 0.0
        self._status_sent: dict[Tier, TierStatus] = {}
        self._workers_sent: dict[str, int] = {}
        self._beats_committed_at = 0.0
        self._shedding: set[Tier] = set()
        self._read_back_failures = 0
        self.gateways = GatewayWatch(policy.gateway_grace_s, deliver_topic_ttl_s)
        self.delivery_topics = DeliveryTopicJanitor(
            kafka,
            self.gateways,
            self._delivering,
            min(SWEEP_S, deliver_topic_ttl_s / 4),
            acting=lambda: not self.fenced.is_set(),
        )
        self.traces = tracing.HeldContexts()  # a request is dispatched after its span
        self.heap = HeapFreezer(gc_freeze_s, time.monotonic)

    async def run(self) -> None:
        """Claim, replay the journal, then schedule until cancelled or fenced; a fenced
        scheduler idles until cancelled (acting again would fight the newer one)."""
        await self.runner.start()
        self.consumer = self.runner.consumer
        self.publisher = self.runner.publisher
        self.claim = Claim(
            self.publisher, self.consumer, self.kafka, self.scheduler_id, self.shard.name
        )
        metrics.watch_scheduler(self)
        janitor: asyncio.Task[None] | None = None
        try:
            await self._start()
            janitor = asyncio.create_task(self.delivery_topics.run(), name="delivery-topics")
            await self.runner.consume(until=self.fenced.is_set)
        finally:
            if janitor is not None:
                janitor.cancel()
            await self.runner.stop()
        await asyncio.Future()

    def _delivering(self) -> set[str]:
        return {request.reply_to for request in (*self.core.waiting(), *self.core.running())}

    def wakes(self, topic: str) -> bool:
        return topic.startswith(topics.REQUESTS_PREFIX)

    async def after_batch(self) -> None:
        await self._decide()

    async def after_commit(self, committed: Offsets) -> None:
        await self._commit_journal(committed)

    def busy(self) -> int:
        """Requests waiting or in flight: the streams this scheduler carries."""
        return self.core.waiting_count + sum(
            len(worker.in_flight) for worker in self.core.registry.workers.values()
        )

    # --- start: claim and replay ------------------------------------------------------

    async def _start(self) -> None:
        """The runner has assigned every partition at its committed offset."""
        started = time.monotonic()
        committed = self.runner.committed
        [claims_tp] = self.runner.partitions(topics.SCHEDULER)
        first_claim = await self.claim.take(committed[claims_tp])
        work = self.runner.partitions(self.work_topic)
        self.work_partitions = len(work)
        claimed = await self.claim.on_journal(work)
        replay_from = {tp.partition: committed[tp] for tp in work}
        records = await read_between(
            self.kafka,
            self.work_topic,
            {p: (replay_from[p], offset) for p, offset in claimed.items()},
            WORK_EVENT,
            timeout_s=REPLAY_TIMEOUT_S,
        )
        for partition, offset, event in records:
            self.core.restore(partition, offset, event)
        self.journal = JournalWindow({p: offset + 1 for p, offset in claimed.items()}, replay_from)
        for tp, offset in committed.items():
            if tp.topic.startswith(topics.REQUESTS_PREFIX):
                self.journal.hold_until_read(tp, offset)
        self.consumer.seek(claims_tp, first_claim + 1)
        self.consumer.pause(*work)  # assigned only to commit the journal's offsets
        log.info(
            "scheduler %s%s: epoch %d, %d journal records replayed, started in %.2f s",
            self.claim.scheduler_id,
            f" (shard {self.shard.name})" if self.shard.name else "",
            self.claim.epoch,
            len(records),
            time.monotonic() - started,
        )

    # --- records ----------------------------------------------------------------------

    async def handle(self, record: ConsumerRecord) -> None:
        """One record; the runner marks it done unless it is a request left waiting."""
        if self.fenced.is_set():
            return
        if record.topic == topics.SCHEDULER:
            self._on_scheduler_event(decode_record(SCHEDULER_EVENT, record))
        elif record.topic == topics.WORKERS:
            heartbeat = decode_record(WorkerHeartbeat, record)
            # Heartbeats read again after a restart may be old: only recent ones count.
            if heartbeat.sent_at >= time.time() - self.worker_lost_after_s and self.shard.decides(
                heartbeat.model
            ):
                self.core.on_heartbeat(heartbeat)
        elif record.topic == topics.CONTROL:
            event = decode_record(CONTROL_EVENT, record)
            if isinstance(event, Cancel):
                await self._on_cancel(event)
            elif isinstance(event, Reroute):
                self.gateways.rerouted(event.request_id, event.reply_to)
            elif isinstance(event, GatewayHeartbeat) and self.gateways.fresh(
                event.sent_at, time.time()
            ):  # not an old one; a `Preempt` is the workers'
                self.gateways.heartbeat(event.reply_to, time.monotonic())
        else:
            request = decode_record(GenerationRequest, record)
            if self.shard.decides(request.model):  # else another shard's
                await self._admit(
                    request, TopicPartition(record.topic, record.partition), record.offset
                )

    async def _on_cancel(self, cancel: Cancel) -> None:
        """A cancel ends a waiting request here, and any later tool round of its answer
        when that comes (`Scheduler.cancel_answer`). A conditional one (a gateway's
        resume grace ran out) counts only while that gateway still relays the stream,
        and for a running request is passed on to the workers as a plain cancel."""
        if cancel.held_by is not None:
            request = self.core.request(cancel.request_id)
            asked_through = request.reply_to if request is not None else None
            if not self.gateways.holds(cancel.held_by, cancel.request_id, asked_through):
                log.info(
                    "request %s resumed elsewhere: %s's cancel is dropped",
                    cancel.request_id,
                    cancel.held_by,
                )
                return
        request = self.core.cancel_answer(cancel.request_id)
        if request is not None:
            await self._end_unserved(request, CANCELLED)
        elif cancel.held_by is not None and (
            not self.shard.sharded or self.core.registry.knows(cancel.request_id)
        ):
            await self.publisher.send(
                topics.CONTROL,
                Cancel(request_id=cancel.request_id, reason=cancel.reason),
                key=cancel.request_id,
            )

    def _on_scheduler_event(self, event: Event) -> None:
        if isinstance(event, SchedulerClaim) and self.claim.fenced_by(event):
            log.warning(
                "fenced: scheduler %s claimed epoch %d over this one's %d; "
                "this scheduler stops acting",
                event.scheduler_id,
                event.epoch,
                self.claim.epoch,
            )
            self.fenced.set()

    async def _admit(self, request: GenerationRequest, tp: TopicPartition, offset: int) -> None:
        self.journal.read(tp, offset)
        admission = self.core.add_request(request)
        request = admission.request
        if not admission.queued:
            if admission.end_code is not None:
                await self._end_unserved(
                    request,
                    admission.end_code,
                    admission.retry_after_s,
                    recorded=admission.recorded,
                )
            return
        self.runner.tracker.started(tp, offset)
        self._sources[request.request_id] = (tp, offset)
        self.traces.hold(request.request_id)
        if admission.routed_reason:
            await self._announce_route(request, admission.routed_reason)

    async def on_failure(self, record: ConsumerRecord, exc: Exception) -> None:
        """A request whose handling failed ends its stream (it may have been queued)."""
        if not record.topic.startswith(topics.REQUESTS_PREFIX):
            return
        request = decode_record(GenerationRequest, record)
        if not self.shard.decides(request.model):
            return
        self.core.cancel(request.request_id)
        await self._end_unserved(request, _end_code(exc))

    async def _end_unserved(
        self,
        request: GenerationRequest,
        code: str,
        retry_after: float | None = None,
        recorded: bool = False,
    ) -> None:
        """End a request without a worker: its `Unserved` record goes to the journal
        first (unless it is there already), then its stream's end."""
        metrics.REQUESTS_UNSERVED.labels(request.tier.value, code).inc()
        if not recorded:
            self.core.ended_unserved(request, code)
            sent = await self.publisher.send_and_wait(
                self.work_topic,
                Unserved(request_id=request.request_id, attempt=request.attempt, code=code),
                key=request.request_id,
                partition=unserved_partition(request.request_id, self.work_partitions),
            )
            self.journal.wrote(sent.partition, sent.offset)
        await self.publisher.send(
            topics.TOKENS, unserved_end(request, code, retry_after), key=request.conversation_id
        )
        self._release(request.request_id)

    async def _rejected(self, request: GenerationRequest, exc: RecordRejected) -> None:
        """The bus refused an event of `request` (e.g. a `reply_to` that cannot be
        written): a waiting request ends `pipeline_rejected`, a running one goes on (its
        worker and the safety stage meet the same refusal and end it). Sending it again
        would fail the same way and hold up every other decision."""
        log.error("request %s: the bus refused its event: %s", request.request_id, exc)
        if self.core.cancel(request.request_id) is None:
            return
        try:
            await self._end_unserved(request, PIPELINE_REJECTED)
        except RecordRejected:  # its offset stays uncommitted until a restart ends it
            log.exception("could not end %s", request.request_id)

    def _release(self, request_id: str) -> None:
        """The request is decided: its offset may be committed."""
        source = self._sources.pop(request_id, None)
        if source is not None:
            self.runner.tracker.done(*source)

    # --- decisions --------------------------------------------------------------------

    async def _decide(self) -> None:
        if self.fenced.is_set():
            return
        for worker_id in self.core.remove_lost_workers():
            log.warning(
                "worker %s lost: no heartbeat for %.0fs", worker_id, self.worker_lost_after_s
            )
        await self._read_back_unknown()
        for request in self.core.expire():
            await self._per_request(
                request,
                self.traces.within(
                    request.request_id, self._end_unserved(request, DEADLINE_EXCEEDED)
                ),
            )
        await self._cancel_abandoned()
        dispatches = self.core.schedule()
        if dispatches:
            await asyncio.gather(
                *(self.traces.within(d.request.request_id, self._dispatch(d)) for d in dispatches)
            )
        for preemption in self.core.preemptions():
            await self._preempt(preemption)
        for update in self.core.queue_updates():
            request = update.request
            await self._per_request(
                request,
                self._tell(
                    request,
                    Queued(
                        request_id=request.answer_id,
                        attempt=request.attempt,
                        position=update.position,
                        eta_ms=update.eta_ms,
                    ),
                ),
            )
        await self._publish_status()
        await self.claim.refresh()
        self.heap.tick()
        for tp in self.journal.ends_unknown():
            end = self.consumer.highwater(tp)
            if end is not None:
                self.journal.end_at_start(tp, end)

    async def _per_request(self, request: GenerationRequest, step: Awaitable[None]) -> None:
        """Run one request's step of the decisions; an event of it the bus refuses ends
        that request (`_rejected`), never the decisions of every other one."""
        try:
            await step
        except RecordRejected as exc:
            await self._rejected(request, exc)

    async def _cancel_abandoned(self) -> None:
        """Streams whose gateway died and that nobody resumed within the grace: a queued
        one ends unserved, a running one is cancelled like a client's Stop."""
        now = time.monotonic()
        if not self.gateways.worth_walking(now):
            return
        for request in self.gateways.abandoned([*self.core.waiting(), *self.core.running()], now):
            log.info(
                "request %s: its gateway %s is gone and nobody resumed it; cancelling",
                request.request_id,
                request.reply_to,
            )
            if self.core.cancel(request.request_id) is not None:
                await self._end_unserved(request, CANCELLED)
            else:
                await self.publisher.send(
                    topics.CONTROL,
                    Cancel(request_id=request.request_id, reason="gateway_gone"),
                    key=request.request_id,
                )

    async def _read_back_unknown(self) -> None:
        """Requests to dispatch again that only a heartbeat told of: their assignments
        on `chat.work` say what they are. A read that keeps failing gives them up
        (logged) rather than stall every other decision."""
        unknown = self.core.unknown
        if not unknown:
            return
        bounds: dict[int, tuple[int, int]] = {}
        for flight in unknown:
            if (offset := flight.offset) is None:
                continue  # no known assignment to read: given up below
            start, end = bounds.get(flight.partition, (offset, offset + 1))
            bounds[flight.partition] = (min(start, offset), max(end, offset + 1))
        try:
            records = await read_between(
                self.kafka, self.work_topic, bounds, WORK_EVENT, timeout_s=READ_BACK_TIMEOUT_S
            )
        except Exception:
            self._read_back_failures += 1
            log.exception(
                "reading back %d assignments failed (%d times)",
                len(unknown),
                self._read_back_failures,
            )
            if self._read_back_failures < READ_BACK_TRIES:
                return
            records = []
        self._read_back_failures = 0
        found = {(p, o): event for p, o, event in records}
        for flight in unknown:
            offset = flight.offset
            event = None if offset is None else found.get((flight.partition, offset))
            if isinstance(event, WorkAssignment) and event.request.request_id == flight.request_id:
                self.core.resolve_unknown(flight.request_id, event.request)
            else:
                log.error(
                    "assignment of %s not read back from %s[%d]@%d: it is not dispatched again",
                    flight.request_id,
                    self.work_topic,
                    flight.partition,
                    flight.offset,
                )
                self.core.resolve_unknown(flight.request_id, None)

    async def _preempt(self, preemption: Preemption) -> None:
        """Ask the worker running the request to hand it back (`scheduler.shares`). A
        preemption that cannot be sent is asked again later: nothing waits on it."""
        request = preemption.request
        log.info(
            "preempting %s on %s for %s (org %s holds more than its share of %s)",
            request.request_id, preemption.worker_id, preemption.for_request_id,
            request.org_id, request.model,
        )  # fmt: skip
        metrics.preempted(request.tier, request.model)
        await self.publisher.send(
            topics.CONTROL,
            Preempt(
                request_id=request.request_id,
                worker_id=preemption.worker_id,
                attempt=request.attempt,
            ),
            key=request.request_id,
        )

    async def _dispatch(self, dispatch: Dispatch) -> None:
        """Mark the attempt's start on the stream, then hand it to the worker. A dispatch
        that cannot be sent ends its request (dead-lettered, `dispatch_failed`)."""
        request = dispatch.request
        assignment = WorkAssignment(
            worker_id=dispatch.worker_id,
            request=request,
            epoch=self.claim.epoch,
            incarnation=dispatch.incarnation,
        )
        try:
            marker = await self.publisher.send_and_wait(
                topics.TOKENS,
                AttemptStarted(
                    request_id=request.answer_id,
                    attempt=request.attempt,
                    conversation_id=request.conversation_id,
                    worker_id=dispatch.worker_id,
                ),
                key=request.conversation_id,
            )
            start = request.stream.start_offset if request.stream else marker.offset
            request = request.model_copy(
                update={
                    "stream": StreamPosition(
                        partition=marker.partition, start_offset=start, attempt_offset=marker.offset
                    )
                }
            )
            assignment = assignment.model_copy(update={"request": request})
            sent = await self.publisher.send_and_wait(
                self.work_topic,
                assignment,
                key=request.conversation_id,
                partition=dispatch.partition,
            )
        except Exception as exc:  # noqa: BLE001 - one undeliverable dispatch ends one request
            await self._dispatch_failed(assignment, dispatch.partition, exc)
            return
        self.journal.wrote(sent.partition, sent.offset)
        self.core.on_dispatched(request, dispatch.worker_id, sent.offset)
        metrics.dispatched(request)
        self._release(request.request_id)
        if dispatch.routed_reason:
            await self._per_request(request, self._announce_route(request, dispatch.routed_reason))
        log.debug(
            "dispatched %s#%d to %s[%d]",
            request.request_id,
            request.attempt,
            dispatch.worker_id,
            dispatch.partition,
        )

    async def _dispatch_failed(
        self, assignment: WorkAssignment, partition: int, exc: Exception
    ) -> None:
        request = assignment.request
        await failed(
            STAGE,
            self.publisher,
            _unsent(self.work_topic, partition, request.conversation_id, assignment),
            exc,
        )
        try:
            await self._end_unserved(request, _end_code(exc))
        except Exception:
            log.exception("could not end %s after its dispatch failed", request.request_id)

    async def _announce_route(self, request: GenerationRequest, reason: str) -> None:
        await self._tell(
            request,
            Routed(
                request_id=request.answer_id,
                attempt=request.attempt,
                model=request.model,
                requested_model=request.requested_model or request.model,
                reason=reason,
            ),
        )

    async def _tell(self, request: GenerationRequest, event: Queued | Routed) -> None:
        """To the gateway holding the stream, and for a stored answer to `chat.answers`
        too, where a gateway that resumes the stream reads it."""
        await self.publisher.send(request.reply_to, event, key=request.conversation_id)
        if request.store:
            await self.publisher.send(topics.ANSWERS, event, key=request.conversation_id)

    async def _publish_status(self) -> None:
        """Every `status_interval_s` while it changes (every STATUS_UNCHANGED_S when it
        does not: an idle stack), and at once when a tier starts or stops shedding, so
        gateways refuse (or admit again) without waiting."""
        now = time.monotonic()
        tiers = self.core.status()
        workers = self.core.live_workers()
        shedding = {tier for tier, status in tiers.items() if status.shedding}
        if (shedding, workers) == (self._shedding, self._workers_sent) and (
            now - self._status_sent_at
            < (self.status_interval_s if tiers != self._status_sent else STATUS_UNCHANGED_S)
        ):
            return
        self._status_sent_at, self._shedding, self._status_sent = now, shedding, tiers
        self._workers_sent = workers
        models = self.shard.models or ()
        await self.publisher.send(
            topics.SCHEDULER,
            SchedulerStatus(
                tiers=tiers, shard=self.shard.name, models=tuple(sorted(models)), workers=workers
            ),
            key=STAGE,
        )

    def commit_rule(self, done: Offsets) -> Offsets:
        """What the runner commits after each batch's decisions (after flushing their
        events): nothing once fenced (the newer scheduler commits); never
        `chat.scheduler` (the claim commits it, so a restart reads every claim since);
        requests as soon as they are decided; heartbeats and control events, read
        again harmlessly after a restart, every BEATS_COMMIT_S."""
        if self.fenced.is_set():
            return {}
        offsets = {tp: offset for tp, offset in done.items() if tp.topic != topics.SCHEDULER}
        if not offsets or not self._commit_due(offsets):
            return {}
        self._beats_committed_at = time.monotonic()
        return offsets

    def _commit_due(self, offsets: Offsets) -> bool:
        return time.monotonic() - self._beats_committed_at >= BEATS_COMMIT_S or any(
            tp.topic not in BEAT_TOPICS for tp in offsets
        )

    async def _commit_journal(self, committed: Offsets) -> None:
        """After the requests, control and heartbeats, the journal: its window must
        still cover every request not committed (`JournalWindow`)."""
        if self.fenced.is_set():
            return
        self.journal.requests_committed(committed)
        floors = self.journal.to_commit(self.core.unread_assignments())
        if floors:
            await self.consumer.commit(
                {TopicPartition(self.work_topic, p): offset for p, offset in floors.items()}
            )
            self.journal.committed(floors)


def _end_code(exc: Exception) -> str:
    """A request's end code when handling it failed: the client learns that the bus
    refused it, or that it could not be handed on, never the exception."""
    return PIPELINE_REJECTED if isinstance(exc, RecordRejected) else DISPATCH_FAILED


def _unsent(topic: str, partition: int, key: str, event: Event) -> ConsumerRecord:
    """A record that could not be written, as a dead letter describes it (offset -1)."""
    value = encode(event)
    return ConsumerRecord(
        topic,
        partition,
        -1,
        int(time.time() * 1000),
        0,
        key.encode(),
        value,
        None,
        len(key),
        len(value),
        [],
    )
