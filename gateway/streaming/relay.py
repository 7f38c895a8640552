"""The gateway's Kafka side: ask through the bus's request/reply client
(`bus.request_reply`), follow answers it resumes, hold a dropped stream for a while,
and read the scheduler's status.

A stored answer starts with an `AnswerStarted` marker on `chat.answers` (`start_answer`),
where any gateway can read it from (`follow`, `gateway.streaming.follower`). When a native
client drops its stream the gateway holds the generation for the resume grace; a
gateway that resumes it sends a `Reroute` to this gateway's topic (and to
`chat.control`), which ends the hold; a hold that runs out asks the scheduler to
cancel the generation, which it does unless another gateway resumed it since. The
gateway that held a stream may be gone and its topic deleted (an answer replayed long
after): the resume never waits on that topic.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from aiokafka.structs import ConsumerRecord, TopicPartition

from bus.clients import KafkaConfig
from bus.request_reply import DeliveryStream, RequestReplyClient
from bus.subscriber import decode_record
from conversations.answers import answer_started
from gateway.admission.shedding import Shedding
from gateway.pipeline import Readiness, RequestStream, StreamLosses
from gateway.rollout import ModelAliases
from gateway.streaming.follower import AnswerFollower, FollowedAnswer
from schemas import topics
from schemas.codec import SCHEDULER_EVENT
from schemas.events import (
    DeliverEvent,
    DeliveryDone,
    DeliveryError,
    FeedbackEvent,
    GenerationRequest,
    ModerationEvent,
    Reroute,
    RolloutSet,
    SchedulerStatus,
    UsageEvent,
)
from schemas.topics import Tier

log = logging.getLogger(__name__)

TERMINAL = (DeliveryDone, DeliveryError)


class KafkaPipeline:
    """`gateway.pipeline.Pipeline` over Kafka; `async with` starts and stops it."""

    def __init__(
        self,
        kafka: KafkaConfig,
        gateway_id: str,
        partitions: int = 4,
        heartbeat_interval_s: float = 1.0,
        aliases: ModelAliases | None = None,
    ) -> None:
        """`aliases`: kept current from `chat.rollout`, read from its start (the last
        record of each alias wins), live from then on."""
        self.kafka = kafka
        self.gateway_id = gateway_id
        self.aliases = aliases
        also_read = {TopicPartition(topics.SCHEDULER, 0): self._scheduler_status}
        if aliases is not None:
            also_read[TopicPartition(topics.ROLLOUT, 0)] = self._rollout
        self.requests = RequestReplyClient(
            kafka,
            gateway_id,
            partitions,
            heartbeat_interval_s,
            also_read=also_read,
            on_reroute=self.taken,
        )
        self.follower = AnswerFollower(kafka)
        self._holds: dict[str, asyncio.Task[None]] = {}
        self._reroutes: set[asyncio.Task[None]] = set()
        self._shedding = Shedding()  # by scheduler shard
        self.losses = StreamLosses()

    @property
    def reply_to(self) -> str:
        return self.requests.reply_to

    @property
    def partitions(self) -> int:
        return self.requests.partitions

    async def start(self) -> None:
        await self.requests.start()

    async def stop(self) -> None:
        tasks = [*self._holds.values(), *self._reroutes]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.requests.stop()
        await self.follower.stop()

    async def __aenter__(self) -> KafkaPipeline:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def start_answer(self, request: GenerationRequest) -> tuple[int, int]:
        """Write the stored answer's marker on `chat.answers`; returns its (partition,
        offset): where any gateway reads the answer from."""
        metadata = await self.requests.publisher.send_and_wait(
            topics.ANSWERS, answer_started(request), key=request.conversation_id
        )
        return metadata.partition, metadata.offset

    async def record_replay(
        self, request: GenerationRequest, events: list[DeliverEvent], usage: UsageEvent
    ) -> None:
        """A cached answer replayed without the pipeline (`gateway.cache.cached_pipeline`): a
        stored one's events after its marker on `chat.answers`, as safety writes a
        generated one's, and its usage on `chat.usage`."""
        if request.store:
            for event in events:
                await self.requests.publisher.send(
                    topics.ANSWERS, event, key=request.conversation_id
                )
        await self.requests.publisher.send(topics.USAGE, usage, key=usage.user_id)

    async def submit(self, request: GenerationRequest) -> DeliveryStream:
        return await self.requests.submit(request)

    async def follow(
        self, request_id: str, conversation_id: str, partition: int, offset: int
    ) -> FollowedAnswer:
        """An answer's events from its marker on, read from `chat.answers`."""
        return await self.follower.follow(request_id, conversation_id, partition, offset)

    async def cancel(
        self, request_id: str, reason: str = "client_disconnected", held_by: str | None = None
    ) -> None:
        await self.requests.cancel(request_id, reason, held_by)

    async def moderate(self, event: ModerationEvent) -> None:
        await self.requests.publisher.send(topics.MODERATION, event, key=event.conversation_id)

    async def feedback(self, event: FeedbackEvent) -> None:
        await self.requests.publisher.send_and_wait(
            topics.FEEDBACK, event, key=event.conversation_id
        )

    async def usage(self, event: UsageEvent) -> None:
        await self.requests.publisher.send(topics.USAGE, event, key=event.user_id)

    def forget(self, request_id: str) -> None:
        self.requests.forget(request_id)

    # --- a dropped stream waiting to be resumed ----------------------------------------

    def hold(self, request_id: str, stream: RequestStream, grace_s: float) -> None:
        """The client dropped `stream`: cancel its generation unless it ends or is resumed
        (here or on another gateway) within `grace_s`."""
        if request_id in self._holds:
            return
        task = asyncio.create_task(
            self._hold(request_id, stream, grace_s), name=f"hold:{request_id}"
        )
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
            task = asyncio.create_task(
                self._tell_holder(held_by, reroute), name=f"reroute:{request_id}"
            )
            self._reroutes.add(task)
            task.add_done_callback(self._reroutes.discard)
        await self.requests.publisher.send(topics.CONTROL, reroute, key=request_id)

    async def _tell_holder(self, held_by: str, reroute: Reroute) -> None:
        """A missing topic (its gateway gone) can hold a send for the producer's request
        timeout, then fail: nobody waits for it, and nobody there needs the news."""
        try:
            await self.requests.publisher.send(held_by, reroute, key=reroute.request_id)
        except Exception:  # logged; the resume goes on
            log.info(
                "could not tell %s that %s resumed here", held_by, reroute.request_id, exc_info=True
            )

    def rewind(self) -> None:
        """The broker lost every record (an embedded broker restarted): read this
        gateway's topics again from their new start."""
        self.requests.rewind()
        self.follower.rewind()

    def bus_lost(self) -> int:
        """The broker died and comes back empty (an embedded broker): new requests are
        refused until `bus_back`, every open stream ends now with error `answer_lost`,
        and the dropped streams held for a resume are let go. How many streams ended."""
        self.requests.bus_down()
        for hold in list(self._holds.values()):
            hold.cancel()
        return self.losses.lose_all()

    async def bus_back(self) -> None:
        """The broker is back with its topics: read them from their new start, and take
        requests again, sent with a new producer (the old one's records were dropped)."""
        self.rewind()
        await self.requests.bus_up()

    def unreachable(self) -> bool:
        return not self.requests.reachable

    def readiness(self, models: Sequence[str], default: str) -> Readiness:
        now = time.time()
        return Readiness(
            bus=self.requests.reachable,
            schedulers={model: self._shedding.speaks_for(model, now) for model in models},
            workers={model: self._shedding.workers(model, now) for model in models},
            model=default,
        )

    # --- status -----------------------------------------------------------------------

    @property
    def open_streams(self) -> int:
        return self.requests.open_streams

    def overloaded(self, tier: Tier, model: str) -> float | None:
        """Seconds to wait before retrying, while the scheduler deciding for `model`
        sheds `tier`."""
        return self._shedding.retry_after(tier, model, time.time())

    def _scheduler_status(self, record: ConsumerRecord) -> None:
        status = decode_record(SCHEDULER_EVENT, record)
        if isinstance(status, SchedulerStatus):
            self._shedding.update(status)

    def _rollout(self, record: ConsumerRecord) -> None:
        """A new set of weights for an alias; one this gateway cannot apply raises (it is
        dead-lettered) and the alias keeps its weights."""
        assert self.aliases is not None
        rollout = decode_record(RolloutSet, record)
        self.aliases.apply(rollout)
        log.info("alias %s: weights %s", rollout.alias, rollout.weights)
