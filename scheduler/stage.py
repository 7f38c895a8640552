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
    Usage,
    WorkAssignment,
    WorkerHeartbeat,
    stream_fields,
)
from schemas.lifecycle import RequestStatus

log = logging.getLogger(__name__)

STAGE = "scheduler"
GROUP = "chatpipe-scheduler"


class SchedulerStage:
    def __init__(self, kafka: KafkaConfig, core: Scheduler, worker_lost_after_s: float) -> None:
        self.kafka = kafka
        self.core = core
        self.worker_lost_after_s = worker_lost_after_s
        self.tracker = OffsetTracker()
        self._sources: dict[str, tuple[TopicPartition, int]] = {}

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
            request = decode_record(GenerationRequest, record)
            if self.core.add_request(request):
                self.tracker.started(tp, record.offset)
                self._sources[request.request_id] = (tp, record.offset)
            else:
                self.tracker.seen(tp, record.offset)

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
        offsets = self.tracker.to_commit()
        if offsets:
            await self.consumer.commit(offsets)
            self.tracker.committed(offsets)

    async def _dispatch(self, dispatch: Dispatch) -> None:
        request = dispatch.request
        assignment = WorkAssignment(worker_id=dispatch.worker_id, request=request)
        metadata = await self.publisher.send_and_wait(
            topics.WORK, assignment, key=request.conversation_id, partition=dispatch.partition
        )
        self.core.on_dispatched(request.request_id, dispatch.worker_id, metadata.offset)
        self._release(request.request_id)
        log.debug("dispatched %s to %s[%d]", request.request_id, dispatch.worker_id,
                  dispatch.partition)
