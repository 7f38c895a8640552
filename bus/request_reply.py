"""Asking the pipeline over Kafka: submit a `GenerationRequest` to its tier's topic and
read what comes back on this process's own delivery topic, as a gateway does.

Each client owns a fresh `chat.deliver.<client_id>.<start>` topic (`start` is new for
each client made, so for each process start) and reads all its partitions from offset 0
with `assign()` (no consumer group, no rebalance; the embedded broker cannot seek to the
end). Events are routed to the open stream of their request; the reader applies the one
answer rule (duplicates, fenced attempts). Heartbeats on `chat.control` say the client is
alive: the scheduler cancels the streams of one that went silent, and deletes its topic
once it has been silent for the delivery topics' TTL (`scheduler.delivery_topics`). A
gateway started again under the same id (a pod's container restarting) so reads none of
what its last start was sent, and that start's streams nobody resumed stop as a dead
gateway's do. A client whose heartbeats got through to nobody for TOPIC_RECHECK_S
(paused, cut off) makes sure its topic still exists, creating it again if it was judged
gone. A gateway asks this way for its users, the safety judge for itself.

The same acknowledgements say whether the bus is reachable: with none for
`BUS_SILENT_S` (`Silence`: time this process could not run does not count), or while
told the broker is down (`bus_down`, until `bus_up`), a submit is refused at once
(`BusUnreachable`) rather than left to wait for a broker that may never have it, and no
heartbeat is written (a broker restarting empty would take it before the topic is
created again).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Generic, TypeVar

from aiokafka import AIOKafkaProducer
from aiokafka.structs import ConsumerRecord, TopicPartition
from pydantic import TypeAdapter

from bus.clients import KafkaConfig, Publisher
from bus.subscriber import decode_record, failed
from bus.topics import create_topics
from ops import tracing
from ops.metrics import watch_lag
from schemas import topics
from schemas.codec import GATEWAY_EVENT
from schemas.events import (
    Cancel,
    DeliverEvent,
    Event,
    GatewayEvent,
    GatewayHeartbeat,
    GenerationRequest,
    Reroute,
)

log = logging.getLogger(__name__)

TOPIC_RECHECK_S = 30.0
BUS_SILENT_S = 5.0
"""No heartbeat acknowledged for this long (and at least three heartbeat periods): the
bus is unreachable."""
LATE_S = 0.1
"""A heartbeat period overrunning by more than this: the process could not run."""
E = TypeVar("E", bound=Event)
RecordHandler = Callable[[ConsumerRecord], None]


class Silence:
    """How long the bus has acknowledged none of a client's heartbeats, leaving out the
    time the heartbeat loop was held up (its sleep overran by more than `LATE_S`: a long
    blocking call in this process, a starved CPU): a heartbeat the process could not
    send, nor take the answer of, is no sign of the bus. `wait` is the loop's sleep."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._heard_at = clock()
        self._held_s = 0.0  # held up since then
        self._wake_at: float | None = None

    def heard(self) -> None:
        self._heard_at, self._held_s = self._clock(), 0.0

    def seconds(self) -> float:
        now = self._clock()
        return now - self._heard_at - self._held_s - self._late(now)

    async def wait(self, seconds: float) -> None:
        self._wake_at = self._clock() + seconds
        try:
            await asyncio.sleep(seconds)
        finally:
            self._held_s += self._late(self._clock())
            self._wake_at = None

    def _late(self, now: float) -> float:
        """How long the loop's sleep has overrun (beyond `LATE_S`), so far."""
        if self._wake_at is None or now - self._wake_at <= LATE_S:
            return 0.0
        return now - self._wake_at


class BusUnreachable(ConnectionError):
    """The bus takes no records now; nothing was sent."""


class Inbox(Generic[E]):
    """Where a reader puts one stream's events and its relay takes them: all that have
    arrived at once, so a relay that falls behind catches up in one step, not one
    wake-up per event."""

    __slots__ = ("_events", "_waiter")

    def __init__(self) -> None:
        self._events: list[E] = []
        self._waiter: asyncio.Future[None] | None = None

    def put(self, event: E) -> None:
        self._events.append(event)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def take(self) -> list[E]:
        while not self._events:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        events, self._events = self._events, []
        return events

    async def __aiter__(self) -> AsyncIterator[E]:
        while True:
            for event in await self.take():
                yield event


class DeliveryStream(Inbox[DeliverEvent]):
    """Delivery events of one request as they arrive on the client's topic."""

    def __init__(self, client: RequestReplyClient, request_id: str) -> None:
        super().__init__()
        self._client = client
        self.request_id = request_id

    async def aclose(self) -> None:
        self._client.forget(self.request_id)


class RequestReplyClient:
    """Requests out, their deliveries back; `async with` starts and stops it.

    `also_read`: more partitions its one consumer reads, each record handed to its
    handler (a failing record is dead-lettered). `on_reroute(request_id)`: another
    reader relays that stream now (a `Reroute` on the delivery topic)."""

    def __init__(
        self,
        kafka: KafkaConfig,
        client_id: str,
        partitions: int = 4,
        heartbeat_interval_s: float = 1.0,
        *,
        stage: str = "gateway",
        also_read: Mapping[TopicPartition, RecordHandler] | None = None,
        on_reroute: Callable[[str], None] | None = None,
    ) -> None:
        self.kafka = kafka
        self.client_id = client_id
        self.partitions = partitions
        self.heartbeat_interval_s = heartbeat_interval_s
        self.stage = stage
        self._also_read = dict(also_read or {})
        self._on_reroute = on_reroute
        self._streams: dict[str, DeliveryStream] = {}
        self._awaiting: set[str] = set()  # submitted, no event back yet
        self._tasks: list[asyncio.Task[None]] = []
        self._producer: AIOKafkaProducer
        self.publisher: Publisher
        self._silence = Silence()
        self._down = False
        self.reply_to = topics.deliver_topic(client_id, uuid.uuid4().hex[:6])

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    @property
    def reachable(self) -> bool:
        """The bus took one of this client's heartbeats lately, and is not known down."""
        silent_s = max(BUS_SILENT_S, 3 * self.heartbeat_interval_s)
        return not self._down and self._silence.seconds() <= silent_s

    def bus_down(self) -> None:
        """The broker is gone (restarting): unreachable until `bus_up`."""
        self._down = True

    async def bus_up(self) -> None:
        """The broker is back, its topics created; what the producer held was dropped
        (`bus.clients.drop_pending_writes`), so it sends with a new one from now on."""
        old = self._producer
        self._producer = self.kafka.producer()
        await self._producer.start()
        self.publisher.producer = self._producer
        await old.stop()
        self._down = False
        self._silence.heard()

    async def start(self) -> None:
        await self._create_topic()
        self._producer = self.kafka.producer()
        await self._producer.start()
        self.publisher = Publisher(self._producer)
        self._consumer = self.kafka.consumer()
        # A client with open streams keeps fetching often even while a request queues.
        self._consumer.busy_while(lambda: len(self._streams), eager=lambda _: bool(self._awaiting))
        await self._consumer.start()
        self._consumer.assign(
            [TopicPartition(self.reply_to, p) for p in range(self.partitions)]
            + list(self._also_read)
        )
        self._tasks = [
            asyncio.create_task(self._read(), name=f"{self.stage}-delivery"),
            asyncio.create_task(self._beat(), name=f"{self.stage}-heartbeats"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._consumer.stop()
        await self._producer.stop()

    async def __aenter__(self) -> RequestReplyClient:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def submit(self, request: GenerationRequest) -> DeliveryStream:
        """Queue `request`; its stream is registered before the request is sent.
        `BusUnreachable` at once, sending nothing, while the bus is unreachable."""
        if not self.reachable:
            raise BusUnreachable("the bus took no heartbeat lately")
        stream = DeliveryStream(self, request.request_id)
        self._streams[request.request_id] = stream
        self._awaiting.add(request.request_id)
        self._consumer.expect()
        try:
            await self.publisher.send_and_wait(
                topics.requests_topic(request.tier), request, key=request.conversation_id
            )
        except BaseException:
            self.forget(request.request_id)
            raise
        return stream

    async def cancel(
        self, request_id: str, reason: str = "client_disconnected", held_by: str | None = None
    ) -> None:
        """Publish a cancel; with `held_by`, one the scheduler passes on only while that
        delivery topic still relays the stream (nobody resumed it elsewhere)."""
        await self.publisher.send_and_wait(
            topics.CONTROL,
            Cancel(request_id=request_id, reason=reason, held_by=held_by),
            key=request_id,
        )

    def forget(self, request_id: str) -> None:
        self._streams.pop(request_id, None)
        self._awaiting.discard(request_id)

    def rewind(self) -> None:
        """The broker lost every record (an embedded broker restarted): read every
        partition again from its new start."""
        for tp in self._consumer.assignment():
            self._consumer.seek(tp, 0)

    async def _create_topic(self) -> None:
        if await create_topics(self.kafka, {self.reply_to: self.partitions}):
            log.info("%s: delivery topic %s created", self.stage, self.reply_to)
        self._silence.heard()

    async def _beat(self) -> None:
        heartbeat = GatewayHeartbeat(gateway_id=self.client_id, reply_to=self.reply_to)
        while True:
            try:
                if self._down:
                    await self._silence.wait(self.heartbeat_interval_s)
                    continue
                if self._silence.seconds() > TOPIC_RECHECK_S:
                    await self._create_topic()  # the scheduler may have judged this gone
                sent = await self.publisher.send(
                    topics.CONTROL,
                    heartbeat.model_copy(update={"sent_at": time.time()}),
                    key=self.reply_to,
                )
                sent.add_done_callback(self._beat_acked)
            except Exception:
                log.warning("%s heartbeat failed", self.stage, exc_info=True)
            await self._silence.wait(self.heartbeat_interval_s)

    def _beat_acked(self, sent: asyncio.Future[object]) -> None:
        if not sent.cancelled() and sent.exception() is None:
            self._silence.heard()

    async def _read(self) -> None:
        """A fetch at a time, each partition's records decoded in one step; a record
        that fails is dead-lettered and the rest go on."""
        watch_lag(self._consumer, self.stage)
        while True:
            batch = await self._consumer.getmany(timeout_ms=100, max_records=10_000)
            for tp, records in batch.items():
                handler = self._also_read.get(tp)
                if handler is not None:
                    await self._each(records, handler)
                    continue
                events = decoded_batch(records)
                if events is None:
                    await self._each(records, self._route)
                    continue
                tracing.consumed(self.stage, records, events)
                for event in events:
                    self._deliver(event)

    async def _each(self, records: list[ConsumerRecord], handle: RecordHandler) -> None:
        for record in records:
            try:
                handle(record)
            except Exception as exc:  # noqa: BLE001 - any failure is dead-lettered
                await failed(self.stage, self.publisher, record, exc)

    def _route(self, record: ConsumerRecord) -> None:
        self._deliver(decode_record(GATEWAY_EVENT, record))

    def _deliver(self, event: GatewayEvent) -> None:
        if isinstance(event, Reroute):
            if self._on_reroute is not None:
                self._on_reroute(event.request_id)
            return
        stream = self._streams.get(event.request_id)
        if stream is not None:
            self._awaiting.discard(event.request_id)
            stream.put(event)


GATEWAY_EVENTS: TypeAdapter[list[GatewayEvent]] = TypeAdapter(list[GatewayEvent])


def decoded_batch(records: list[ConsumerRecord]) -> list[GatewayEvent] | None:
    """The events of `records` validated in one call (what a client does per token chunk,
    so per record costs count); None if any record is not a delivery event."""
    try:
        events = GATEWAY_EVENTS.validate_json(b"[" + b",".join(r.value for r in records) + b"]")
    except (TypeError, ValueError):
        return None
    return events if len(events) == len(records) else None  # one record, one event
