"""The safety stage: `chat.tokens` in, `chat.deliver.<gateway_id>` out (DESIGN §7).

Per request it keeps an `OutputGate`: each chunk's text (with an overlap of
what came before) goes through the tier's classifiers; text that passed is
released once it is older than the window. When a chunk trips a classifier
the stage sends `retract` for the message, cancels the generation on
`chat.control`, records the decision on `chat.moderation`, drops the rest of
the stream and ends it as FINISHED_FILTERED.

Duplicates (same request, attempt and seq) are dropped. A request's first
offset stays uncommitted until it ends, so a restart replays its whole stream.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from dataclasses import dataclass

from aiokafka.structs import ConsumerRecord, TopicPartition

from bus.clients import KafkaConfig, Publisher
from bus.offsets import OffsetTracker
from bus.subscriber import consume, decode_record
from safety.classifiers import Verdict, first_verdict
from safety.output_gate import OutputGate
from safety.policy import SafetyPolicy
from schemas import topics
from schemas.codec import TOKEN_EVENT
from schemas.events import (
    Cancel,
    Delta,
    DeliveryDone,
    DeliveryError,
    GenerationDone,
    GenerationError,
    ModerationEvent,
    Retract,
    StreamEvent,
    TokenChunk,
    Usage,
)
from schemas.lifecycle import RequestStatus

log = logging.getLogger(__name__)

STAGE = "safety"
GROUP = "chatpipe-safety"
RECENTLY_FINISHED = 10_000


@dataclass(slots=True)
class _RequestState:
    attempt: int
    first: tuple[TopicPartition, int]
    gate: OutputGate
    last_seq: int = -1
    filtered: bool = False


class SafetyStage:
    def __init__(self, kafka: KafkaConfig, policy: SafetyPolicy | None = None) -> None:
        self.kafka = kafka
        self.policy = policy or SafetyPolicy()
        self.tracker = OffsetTracker()
        self.check_seconds: deque[float] = deque(maxlen=100_000)
        self._requests: dict[str, _RequestState] = {}
        self._finished: OrderedDict[tuple[str, int], None] = OrderedDict()

    async def run(self) -> None:
        producer = self.kafka.producer()
        self.consumer = self.kafka.consumer(topics.TOKENS, group_id=GROUP)
        await producer.start()
        await self.consumer.start()
        self.publisher = Publisher(producer)
        try:
            await consume(self.consumer, STAGE, self.publisher, self._handle, self._commit,
                          poll_ms=100, tracker=self.tracker)
        finally:
            await self.consumer.stop()
            await producer.stop()

    async def _handle(self, record: ConsumerRecord) -> None:
        tp = TopicPartition(record.topic, record.partition)
        event = decode_record(TOKEN_EVENT, record)
        state = self._state_for(event, tp, record.offset)
        self.tracker.seen(tp, record.offset)
        if state is None or event.seq <= state.last_seq:
            return
        state.last_seq = event.seq
        if isinstance(event, TokenChunk):
            await self._on_chunk(event, state)
        else:
            await self._on_end(event, state)

    async def _on_chunk(self, chunk: TokenChunk, state: _RequestState) -> None:
        if state.filtered:
            return
        state.gate.feed(chunk.text)
        verdict = await self._check(chunk, state.gate.to_check())
        if verdict is not None:
            await self._retract(chunk, state, verdict)
            return
        released = state.gate.passed()
        if released:
            await self._deliver(chunk, Delta(request_id=chunk.request_id, attempt=chunk.attempt,
                                             seq=chunk.seq, text=released))

    async def _on_end(self, end: GenerationDone | GenerationError, state: _RequestState) -> None:
        fields = dict(request_id=end.request_id, attempt=end.attempt, seq=end.seq + 1)
        if state.filtered:
            usage = end.usage if isinstance(end, GenerationDone) else Usage()
            final: DeliveryDone | DeliveryError = DeliveryDone(
                **fields, status=RequestStatus.FINISHED_FILTERED, usage=usage)
        else:
            rest = state.gate.finish()
            if rest:
                await self._deliver(end, Delta(request_id=end.request_id, attempt=end.attempt,
                                               seq=end.seq, text=rest))
            if isinstance(end, GenerationDone):
                final = DeliveryDone(**fields, status=end.status, usage=end.usage)
            else:
                final = DeliveryError(**fields, code=end.code, message=end.message,
                                      retry_after=end.retry_after)
        await self._deliver(end, final)
        self._end(end)
        self.tracker.done(*state.first)

    async def _check(self, chunk: TokenChunk, text: str) -> Verdict | None:
        classifiers = self.policy.output_classifiers(chunk.tier, chunk.model)
        if not classifiers:
            return None
        started = time.perf_counter()
        try:
            return await first_verdict(classifiers, text)
        finally:
            self.check_seconds.append(time.perf_counter() - started)

    async def _retract(self, chunk: TokenChunk, state: _RequestState, verdict: Verdict) -> None:
        state.filtered = True
        log.info("retracting %s: %s (%s)", chunk.message_id, verdict.category, verdict.reason)
        await self.publisher.send(topics.CONTROL, Cancel(request_id=chunk.request_id,
                                                         reason="content_filter"),
                                  key=chunk.request_id)
        await self._deliver(chunk, Retract(
            request_id=chunk.request_id, attempt=chunk.attempt, seq=chunk.seq,
            message_id=chunk.message_id, reason=verdict.category,
            replacement=self.policy.replacement(verdict.category)))
        await self.publisher.send(topics.MODERATION, ModerationEvent(
            request_id=chunk.request_id, conversation_id=chunk.conversation_id,
            message_id=chunk.message_id, action="retract", category=verdict.category,
            reason=f"{verdict.classifier}: {verdict.reason}",
            replacement=self.policy.replacement(verdict.category)), key=chunk.conversation_id)

    def _state_for(self, event: StreamEvent, tp: TopicPartition, offset: int,
                   ) -> _RequestState | None:
        key = (event.request_id, event.attempt)
        if key in self._finished:
            return None
        state = self._requests.get(event.request_id)
        if state is None or state.attempt < event.attempt:
            if state is not None:
                self.tracker.done(*state.first)
            state = _RequestState(event.attempt, (tp, offset), self.policy.gate())
            self._requests[event.request_id] = state
            self.tracker.started(tp, offset)
        return state if state.attempt == event.attempt else None

    def _end(self, event: StreamEvent) -> None:
        self._requests.pop(event.request_id, None)
        self._finished[(event.request_id, event.attempt)] = None
        while len(self._finished) > RECENTLY_FINISHED:
            self._finished.popitem(last=False)

    async def _deliver(self, source: StreamEvent,
                       event: Delta | Retract | DeliveryDone | DeliveryError) -> None:
        await self.publisher.send(source.reply_to, event, key=source.conversation_id)

    async def _commit(self) -> None:
        offsets = self.tracker.to_commit()
        if offsets:
            await self.publisher.flush()
            await self.consumer.commit(offsets)
            self.tracker.committed(offsets)
