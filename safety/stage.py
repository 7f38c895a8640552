"""The safety stage: `chat.tokens` in, `chat.deliver.<gateway_id>` out.

Per request it keeps an `OutputGate` and releases text as the gate allows;
duplicates (same request, attempt and seq) are dropped. A request's first
offset stays uncommitted until it ends, so a restart replays its whole stream.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass

from aiokafka.structs import ConsumerRecord, TopicPartition

from bus.clients import KafkaConfig, Publisher
from bus.offsets import OffsetTracker
from bus.subscriber import consume, decode_record
from safety.output_gate import OutputGate
from schemas import topics
from schemas.codec import TOKEN_EVENT
from schemas.events import (
    Delta,
    DeliveryDone,
    DeliveryError,
    GenerationDone,
    GenerationError,
    StreamEvent,
    TokenChunk,
)

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


class SafetyStage:
    def __init__(self, kafka: KafkaConfig, window_chars: int = 0) -> None:
        self.kafka = kafka
        self.window_chars = window_chars
        self.tracker = OffsetTracker()
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
        if state is None or event.seq <= state.last_seq:
            self.tracker.seen(tp, record.offset)
            return
        state.last_seq = event.seq
        if isinstance(event, TokenChunk):
            released = state.gate.feed(event.text)
            if released:
                await self._deliver(event, Delta(request_id=event.request_id,
                                                 attempt=event.attempt, seq=event.seq,
                                                 text=released))
            self.tracker.seen(tp, record.offset)
            return
        rest = state.gate.finish()
        if rest:
            await self._deliver(event, Delta(request_id=event.request_id, attempt=event.attempt,
                                             seq=event.seq, text=rest))
        if isinstance(event, GenerationDone):
            final = DeliveryDone(request_id=event.request_id, attempt=event.attempt,
                                 seq=event.seq + 1, status=event.status, usage=event.usage)
        else:
            assert isinstance(event, GenerationError)
            final = DeliveryError(request_id=event.request_id, attempt=event.attempt,
                                  seq=event.seq + 1, code=event.code, message=event.message,
                                  retry_after=event.retry_after)
        await self._deliver(event, final)
        self._end(event)
        self.tracker.seen(tp, record.offset)
        self.tracker.done(*state.first)

    def _state_for(self, event: StreamEvent, tp: TopicPartition, offset: int) -> _RequestState | None:
        key = (event.request_id, event.attempt)
        if key in self._finished:
            return None
        state = self._requests.get(event.request_id)
        if state is None or state.attempt < event.attempt:
            if state is not None:
                self.tracker.done(*state.first)
            state = _RequestState(event.attempt, (tp, offset), OutputGate(self.window_chars))
            self._requests[event.request_id] = state
            self.tracker.started(tp, offset)
        return state if state.attempt == event.attempt else None

    def _end(self, event: StreamEvent) -> None:
        self._requests.pop(event.request_id, None)
        self._finished[(event.request_id, event.attempt)] = None
        while len(self._finished) > RECENTLY_FINISHED:
            self._finished.popitem(last=False)

    async def _deliver(self, source: StreamEvent, event: Delta | DeliveryDone | DeliveryError) -> None:
        await self.publisher.send(source.reply_to, event, key=source.conversation_id)

    async def _commit(self) -> None:
        offsets = self.tracker.to_commit()
        if offsets:
            await self.publisher.flush()
            await self.consumer.commit(offsets)
            self.tracker.committed(offsets)
