"""The scheduler's Kafka adapter: feeds the core, sends its dispatches to `chat.work`.

Exactly one scheduler runs (deployments pin one replica): it must see every
request topic and every heartbeat, which a second group member would split.
A request's offset is committed once it is dispatched, cancelled or expired, so
a restarted scheduler reads again only what it had not handed out.
"""

from __future__ import annotations

import asyncio
import logging
import time

from aiokafka.structs import ConsumerRecord, TopicPartition

from bus.clients import KafkaConfig, Publisher
from bus.offsets import OffsetTracker
from bus.subscriber import consume, decode_record
from scheduler.core import Dispatch, Scheduler
from schemas import topics
from schemas.codec import CONTROL_EVENT
from schemas.events import (
    Cancel,
    GenerationDone,
    GenerationError,
    GenerationRequest,
    Queued,
    Routed,
    SchedulerStatus,
    Usage,
    WorkAssignment,
    WorkerHeartbeat,
    stream_fields,
)
from schemas.lifecycle import RequestStatus
from schemas.topics import Tier

log = logging.getLogger(__name__)

STAGE = "scheduler"
GROUP = "chatpipe-scheduler"


class SchedulerStage:
    def __init__(self, kafka: KafkaConfig, core: Scheduler, status_interval_s: float = 1.0,
                 ) -> None:
        self.kafka = kafka
        self.core = core
        self.worker_lost_after_s = core.policy.worker_lost_after_s
        self.status_interval_s = status_interval_s
        self.tracker = OffsetTracker()
        self._sources: dict[str, tuple[TopicPartition, int]] = {}
        self._status_sent_at = 0.0
        self._shedding: set[Tier] = set()

    async def run(self) -> None:
        consumer = self.kafka.consumer(
            *topics.request_topics(), topics.WORKERS, topics.CONTROL, group_id=GROUP
        )
        producer = self.kafka.producer()
        await producer.start()
        await consumer.start()
        self.consumer = consumer
        self.publisher = Publisher(producer)
        try:
            await consume(
                consumer, STAGE, self.publisher, self._handle, self._decide,
                poll_ms=100, tracker=self.tracker,
            )
        finally:
            await consumer.stop()
            await producer.stop()

    async def _handle(self, record: ConsumerRecord) -> None:
        tp = TopicPartition(record.topic, record.partition)
        if record.topic == topics.WORKERS:
            self.tracker.seen(tp, record.offset)
            heartbeat = decode_record(WorkerHeartbeat, record)
            # Tansu cannot seek to the end: old heartbeats replay on start.
            if heartbeat.sent_at >= time.time() - self.worker_lost_after_s:
                self.core.on_heartbeat(heartbeat)
        elif record.topic == topics.CONTROL:
            self.tracker.seen(tp, record.offset)
            event = decode_record(CONTROL_EVENT, record)
            if isinstance(event, Cancel):
                request = self.core.cancel(event.request_id)
                if request is not None:
                    await self._end_unserved(request, GenerationDone(
                        **stream_fields(request, 0), status=RequestStatus.FINISHED_ABORTED,
                        usage=Usage()))
        else:
            await self._admit(decode_record(GenerationRequest, record), tp, record.offset)

    async def _admit(self, request: GenerationRequest, tp: TopicPartition, offset: int) -> None:
        admission = self.core.add_request(request)
        if not admission.accepted:
            self.tracker.seen(tp, offset)
            await self.publisher.send(topics.TOKENS, GenerationError(
                **stream_fields(request, 0), code="overloaded",
                message=f"the {request.tier} tier is overloaded; retry later",
                retry_after=admission.retry_after_s), key=request.conversation_id)
            return
        self.tracker.started(tp, offset)
        self._sources[request.request_id] = (tp, offset)
        if admission.routed_reason:
            await self._announce_route(admission.request, admission.routed_reason)

    async def _announce_route(self, request: GenerationRequest, reason: str) -> None:
        await self.publisher.send(request.reply_to, Routed(
            request_id=request.request_id, attempt=request.attempt, model=request.model,
            requested_model=request.requested_model or request.model, reason=reason,
        ), key=request.conversation_id)

    async def _end_unserved(self, request: GenerationRequest,
                            end: GenerationDone | GenerationError) -> None:
        """A request that never reached a worker still ends its stream, so the
        gateway's stream closes and the recorder stores the (empty) answer."""
        await self.publisher.send(topics.TOKENS, end, key=request.conversation_id)
        self._release(request.request_id)

    def _release(self, request_id: str) -> None:
        """The request left the waiting set: its offset may be committed."""
        source = self._sources.pop(request_id, None)
        if source is not None:
            self.tracker.done(*source)

    async def _decide(self) -> None:
        for worker_id in self.core.remove_lost_workers():
            log.warning("worker %s lost: no heartbeat for %.0fs", worker_id,
                        self.worker_lost_after_s)
        for request in self.core.expire():
            await self._end_unserved(request, GenerationError(
                **stream_fields(request, 0), code="deadline_exceeded",
                message="the request waited past its deadline"))
        dispatches = self.core.schedule()
        if dispatches:
            await asyncio.gather(*(self._dispatch(d) for d in dispatches))
        for update in self.core.queue_updates():
            request = update.request
            await self.publisher.send(request.reply_to, Queued(
                request_id=request.request_id, attempt=request.attempt,
                position=update.position, eta_ms=update.eta_ms), key=request.conversation_id)
        await self._publish_status()
        offsets = self.tracker.to_commit()
        if offsets:
            await self.consumer.commit(offsets)
            self.tracker.committed(offsets)

    async def _publish_status(self) -> None:
        """Every `status_interval_s`, and at once when a tier starts or stops
        shedding, so gateways refuse (or admit again) without waiting."""
        now = time.monotonic()
        tiers = self.core.status()
        shedding = {tier for tier, status in tiers.items() if status.shedding}
        if now - self._status_sent_at < self.status_interval_s and shedding == self._shedding:
            return
        self._status_sent_at, self._shedding = now, shedding
        await self.publisher.send(topics.SCHEDULER, SchedulerStatus(tiers=tiers), key=STAGE)

    async def _dispatch(self, dispatch: Dispatch) -> None:
        request = dispatch.request
        assignment = WorkAssignment(worker_id=dispatch.worker_id, request=request)
        metadata = await self.publisher.send_and_wait(
            topics.WORK, assignment, key=request.conversation_id, partition=dispatch.partition
        )
        self.core.on_dispatched(request.request_id, dispatch.worker_id, metadata.offset)
        self._release(request.request_id)
        if dispatch.routed_reason:
            await self._announce_route(request, dispatch.routed_reason)
        log.debug("dispatched %s to %s[%d]", request.request_id, dispatch.worker_id,
                  dispatch.partition)
