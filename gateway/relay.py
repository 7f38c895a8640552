"""The gateway's Kafka side: queue requests, read this gateway's delivery topic, follow
answers it resumes, and hold a dropped stream for a while.

Each gateway process owns a fresh `chat.deliver.<gateway_id>` topic and reads all its
partitions from offset 0 with `assign()` (no consumer group, no rebalance; the embedded
broker cannot seek to the end). Events are routed to the open stream of their request;
the reader applies the one answer rule (duplicates, fenced attempts).

A stored answer starts with an `AnswerStarted` marker on `chat.answers` (`start_answer`),
where any gateway can read it from (`follow`, `gateway.follower`). When a native
client drops its stream the gateway holds the generation for the resume grace; a
gateway that resumes it sends a `Reroute` to this gateway's topic (and to
`chat.control`), which ends the hold; a hold that runs out asks the scheduler to
cancel the generation, which it does unless another gateway resumed it since.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from aiokafka.structs import ConsumerRecord, TopicPartition
from pydantic import TypeAdapter

from bus.clients import KafkaConfig, Publisher
from bus.subscriber import decode_record, failed
from bus.topics import create_topics
from conversations.answers import answer_started
from gateway.follower import AnswerFollower, FollowedAnswer
from gateway.pipeline import Inbox, RequestStream
from ops import tracing
from ops.metrics import watch_lag
from schemas import topics
from schemas.codec import GATEWAY_EVENT, SCHEDULER_EVENT
from schemas.events import (
    Cancel,
    DeliverEvent,
    DeliveryDone,
    DeliveryError,
    Event,
    GatewayEvent,
    GatewayHeartbeat,
    GenerationRequest,
    ModerationEvent,
    Reroute,
    SchedulerStatus,
)
from schemas.topics import Tier

log = logging.getLogger(__name__)

STAGE = "gateway"
STATUS_FRESH_S = 5.0  # an older scheduler status says nothing about now
TERMINAL = (DeliveryDone, DeliveryError)


class DeliveryStream(Inbox[DeliverEvent]):
    """Delivery events of one request as they arrive on this gateway's topic."""

    def __init__(self, pipeline: KafkaPipeline, request_id: str) -> None:
        super().__init__()
        self._pipeline = pipeline
        self.request_id = request_id

    async def aclose(self) -> None:
        self._pipeline.forget(self.request_id)


class KafkaPipeline:
    """`gateway.pipeline.Pipeline` over Kafka; `async with` starts and stops it."""

    def __init__(self, kafka: KafkaConfig, gateway_id: str, partitions: int = 4,
                 heartbeat_interval_s: float = 1.0) -> None:
        self.kafka = kafka
        self.gateway_id = gateway_id
        self.partitions = partitions
        self.heartbeat_interval_s = heartbeat_interval_s
        self.follower = AnswerFollower(kafka)
        self._streams: dict[str, DeliveryStream] = {}
        self._holds: dict[str, asyncio.Task[None]] = {}
        self._task: asyncio.Task[None] | None = None
        self._status: SchedulerStatus | None = None

    @property
    def reply_to(self) -> str:
        return topics.deliver_topic(self.gateway_id)

    async def start(self) -> None:
        await create_topics(self.kafka, {self.reply_to: self.partitions})
        self._producer = self.kafka.producer()
        await self._producer.start()
        self.publisher = Publisher(self._producer)
        self._consumer = self.kafka.consumer()
        # A gateway with open streams keeps fetching often even while a request queues.
        self._consumer.busy_while(lambda: bool(self._streams))
        await self._consumer.start()
        self._consumer.assign([TopicPartition(self.reply_to, p) for p in range(self.partitions)]
                              + [TopicPartition(topics.SCHEDULER, 0)])
        self._task = asyncio.create_task(self._read(), name="gateway-delivery")
        self._heartbeats = asyncio.create_task(self._beat(), name="gateway-heartbeats")

    async def stop(self) -> None:
        for task in (*self._holds.values(), self._heartbeats):
            task.cancel()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, self._heartbeats, *self._holds.values(),
                                 return_exceptions=True)
        await self.follower.stop()
        await self._consumer.stop()
        await self._producer.stop()

    async def __aenter__(self) -> KafkaPipeline:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def start_answer(self, request: GenerationRequest) -> tuple[int, int]:
        """Write the stored answer's marker on `chat.answers`; returns its (partition,
        offset): where any gateway reads the answer from."""
        metadata = await self.publisher.send_and_wait(
            topics.ANSWERS, answer_started(request), key=request.conversation_id)
        return metadata.partition, metadata.offset

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

    async def follow(self, request_id: str, conversation_id: str, partition: int,
                     offset: int) -> FollowedAnswer:
        """An answer's events from its marker on, read from `chat.answers`."""
        return await self.follower.follow(request_id, conversation_id, partition, offset)

    async def cancel(self, request_id: str, reason: str = "client_disconnected",
                     held_by: str | None = None) -> None:
        """Publish a cancel; with `held_by`, one the scheduler passes on only while that
        gateway still relays the stream (nobody resumed it elsewhere)."""
        await self.publisher.send_and_wait(
            topics.CONTROL, Cancel(request_id=request_id, reason=reason, held_by=held_by),
            key=request_id)

    async def moderate(self, event: ModerationEvent) -> None:
        await self.publisher.send(topics.MODERATION, event, key=event.conversation_id)

    def forget(self, request_id: str) -> None:
        self._streams.pop(request_id, None)

    # --- a dropped stream waiting to be resumed ----------------------------------------

    def hold(self, request_id: str, stream: RequestStream, grace_s: float) -> None:
        """The client dropped `stream`: cancel its generation unless it ends or is resumed
        (here or on another gateway) within `grace_s`."""
        if request_id in self._holds:
            return
        task = asyncio.create_task(self._hold(request_id, stream, grace_s),
                                   name=f"hold:{request_id}")
        self._holds[request_id] = task
        task.add_done_callback(lambda _: self._holds.pop(request_id, None))

    async def _hold(self, request_id: str, stream: RequestStream, grace_s: float) -> None:
        try:
            async with asyncio.timeout(grace_s):
                async for event in stream:
                    if isinstance(event, TERMINAL):
                        return
        except TimeoutError:
            log.info("request %s: not resumed within %.0f s; cancelling", request_id, grace_s)
            await self.cancel(request_id, reason="client_gone", held_by=self.reply_to)
        finally:
            await stream.aclose()

    def taken(self, request_id: str) -> None:
        """A gateway resumed the stream: stop holding it here."""
        hold = self._holds.get(request_id)
        if hold is not None:
            hold.cancel()

    async def announce_resume(self, request_id: str, held_by: str) -> None:
        """Tell the gateway that held the stream (its delivery topic `held_by`), and the
        stages on `chat.control`, that this gateway relays it now."""
        reroute = Reroute(request_id=request_id, reply_to=self.reply_to)
        if held_by == self.reply_to:
            self.taken(request_id)
        else:
            await self.publisher.send(held_by, reroute, key=request_id)
        await self.publisher.send(topics.CONTROL, reroute, key=request_id)

    def rewind(self) -> None:
        """The broker lost every record (an embedded broker restarted): read this
        gateway's topics again from their new start."""
        for tp in self._consumer.assignment():
            self._consumer.seek(tp, 0)
        self.follower.rewind()

    async def _beat(self) -> None:
        """Say this gateway is alive: the scheduler cancels the streams of one that went
        silent if nobody resumed them within the grace."""
        heartbeat = GatewayHeartbeat(gateway_id=self.gateway_id, reply_to=self.reply_to)
        while True:
            try:
                await self.publisher.send(topics.CONTROL, heartbeat.model_copy(
                    update={"sent_at": time.time()}), key=self.reply_to)
            except Exception:
                log.warning("gateway heartbeat failed", exc_info=True)
            await asyncio.sleep(self.heartbeat_interval_s)

    # --- status -----------------------------------------------------------------------

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

    async def _read(self) -> None:
        """This gateway's topics a fetch at a time, each partition's records decoded in
        one step; a record that fails is dead-lettered and the rest go on."""
        watch_lag(self._consumer, STAGE)
        while True:
            batch = await self._consumer.getmany(timeout_ms=100, max_records=10_000)
            for tp, records in batch.items():
                if tp.topic == topics.SCHEDULER:
                    await self._each(records, self._scheduler_status)
                    continue
                events = _decoded(records)
                if events is None:
                    await self._each(records, self._route)
                    continue
                tracing.consumed(STAGE, records, events)
                for event in events:
                    self._deliver(event)

    async def _each(self, records: list[ConsumerRecord],
                    handle: Callable[[ConsumerRecord], None]) -> None:
        for record in records:
            try:
                handle(record)
            except Exception as exc:  # noqa: BLE001 - any failure is dead-lettered
                await failed(STAGE, self.publisher, record, exc)

    def _scheduler_status(self, record: ConsumerRecord) -> None:
        status = decode_record(SCHEDULER_EVENT, record)
        if isinstance(status, SchedulerStatus):
            self._status = status

    def _route(self, record: ConsumerRecord) -> None:
        self._deliver(decode_record(GATEWAY_EVENT, record))

    def _deliver(self, event: Event) -> None:
        if isinstance(event, Reroute):
            self.taken(event.request_id)
            return
        stream = self._streams.get(event.request_id)
        if stream is not None:
            stream.put(event)


GATEWAY_EVENTS = TypeAdapter(list[GatewayEvent])


def _decoded(records: list[ConsumerRecord]) -> list[Event] | None:
    """The events of `records` validated in one call (what a gateway does per token chunk,
    so per record costs count); None if any record is not a gateway event."""
    try:
        events = GATEWAY_EVENTS.validate_json(b"[" + b",".join(r.value for r in records) + b"]")
    except (TypeError, ValueError):
        return None
    return events if len(events) == len(records) else None  # one record, one event
