"""The gateway's Kafka side: produce requests, read this gateway's delivery topic.

Each gateway process owns a fresh `chat.deliver.<gateway_id>` topic and reads
all its partitions from offset 0 with `assign()` (no consumer group, no
rebalance; the embedded broker cannot seek to the end). Events are routed to
the open stream of their request; duplicates are dropped by (attempt, seq).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import ConsumerRecord, TopicPartition

from bus.clients import KafkaConfig, Publisher
from bus.subscriber import consume, decode_record
from bus.topics import create_topics
from schemas import topics
from schemas.codec import DELIVER_EVENT
from schemas.events import (
    Cancel,
    DeliverEvent,
    DeliveryDone,
    DeliveryError,
    GenerationRequest,
    ModerationEvent,
    Queued,
    Routed,
    SchedulerStatus,
)
from schemas.topics import Tier

log = logging.getLogger(__name__)

STAGE = "gateway"
STATUS_FRESH_S = 5.0  # an older scheduler status says nothing about now
TERMINAL = (DeliveryDone, DeliveryError)


class DeliveryStream:
    """Delivery events of one request, in order, without duplicates."""

    def __init__(self, pipeline: KafkaPipeline, request_id: str) -> None:
        self._pipeline = pipeline
        self.request_id = request_id
        self._queue: asyncio.Queue[DeliverEvent] = asyncio.Queue()
        self._seen: set[tuple[int, int]] = set()

    def put(self, event: DeliverEvent) -> None:
        if not isinstance(event, Queued | Routed):
            key = (event.attempt, event.seq)
            if key in self._seen:
                return
            self._seen.add(key)
        self._queue.put_nowait(event)

    async def __aiter__(self) -> AsyncIterator[DeliverEvent]:
        while True:
            event = await self._queue.get()
            yield event
            if isinstance(event, TERMINAL):
                return

    async def aclose(self) -> None:
        self._pipeline.forget(self.request_id)


class KafkaPipeline:
    """`gateway.pipeline.Pipeline` over Kafka; `async with` starts and stops it."""

    def __init__(self, kafka: KafkaConfig, gateway_id: str, partitions: int = 4) -> None:
        self.kafka = kafka
        self.gateway_id = gateway_id
        self.partitions = partitions
        self._streams: dict[str, DeliveryStream] = {}
        self._task: asyncio.Task[None] | None = None
        self._status: SchedulerStatus | None = None

    @property
    def reply_to(self) -> str:
        return topics.deliver_topic(self.gateway_id)

    async def start(self) -> None:
        await create_topics(self.kafka.bootstrap_servers, {self.reply_to: self.partitions})
        self._producer = self.kafka.producer()
        await self._producer.start()
        self.publisher = Publisher(self._producer)
        self._consumer: AIOKafkaConsumer = self.kafka.consumer()
        await self._consumer.start()
        self._consumer.assign([TopicPartition(self.reply_to, p) for p in range(self.partitions)]
                              + [TopicPartition(topics.SCHEDULER, 0)])
        self._task = asyncio.create_task(
            consume(self._consumer, STAGE, self.publisher, self._route, poll_ms=100)
        )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._consumer.stop()
        await self._producer.stop()

    async def __aenter__(self) -> KafkaPipeline:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def submit(self, request: GenerationRequest) -> DeliveryStream:
        stream = DeliveryStream(self, request.request_id)
        self._streams[request.request_id] = stream
        try:
            await self.publisher.send_and_wait(
                topics.requests_topic(request.tier), request, key=request.conversation_id
            )
        except BaseException:
            self.forget(request.request_id)
            raise
        return stream

    async def cancel(self, request_id: str, reason: str = "client_disconnected") -> None:
        await self.publisher.send_and_wait(
            topics.CONTROL, Cancel(request_id=request_id, reason=reason), key=request_id
        )

    async def moderate(self, event: ModerationEvent) -> None:
        await self.publisher.send(topics.MODERATION, event, key=event.conversation_id)

    def forget(self, request_id: str) -> None:
        self._streams.pop(request_id, None)

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def overloaded(self, tier: Tier) -> float | None:
        """Seconds to wait before retrying, while the scheduler sheds `tier`."""
        status = self._status
        if status is None or status.sent_at < time.time() - STATUS_FRESH_S:
            return None
        tier_status = status.tiers.get(tier)
        if tier_status is None or not tier_status.shedding:
            return None
        return tier_status.retry_after_s or 1.0

    async def _route(self, record: ConsumerRecord) -> None:
        if record.topic == topics.SCHEDULER:
            self._status = decode_record(SchedulerStatus, record)
            return
        event = decode_record(DELIVER_EVENT, record)
        stream = self._streams.get(event.request_id)
        if stream is not None:
            stream.put(event)
