"""The safety stage's Kafka adapter: `chat.tokens` in; `chat.deliver.<gateway_id>` and,
for stored answers, `chat.answers` out. The decisions are `safety.core`'s;
the consume/commit/rebalance loop is the stage runner's (`bus.stage_runner`).

Commit policy: per partition, below the first event of any generation still open, so
a restart reads every open stream again from its start; at most every COMMIT_EVERY_S.
The core drops what it has seen (one answer rule) and its delivery ids are the
stream's positions, so the gateway and the recorder drop what they already have. A
record whose processing raises is dead-lettered and its stream ends with `error`
(`safety_error`, or `pipeline_rejected` when the bus refused one of its records). A
delivery to a gateway's topic that no longer exists (deleted with its gateway) is
dropped and counted, and so is every later one to that topic for GONE_S: nobody reads
it, and a stream resumed on another gateway goes on there (`chat.answers`).
"""

from __future__ import annotations

import logging
import time
from collections import deque

from aiokafka.errors import UnknownTopicOrPartitionError
from aiokafka.structs import ConsumerRecord, TopicPartition

from bus.clients import KafkaConfig
from bus.fetch_pace import Batch
from bus.produce_failures import PIPELINE_REJECTED, PIPELINE_REJECTED_MESSAGE, RecordRejected
from bus.stage_runner import Offsets, RunnerOptions, Stage, StageRunner
from bus.subscriber import decode_record
from moderation.classifiers import Verdict, first_verdict
from moderation.policy import SafetyPolicy
from ops.metrics import DELIVERIES_DROPPED, RETRACTIONS, SAFETY_CHECK_TIME
from safety.core import Check, Output, SafetyConfig, SafetyCore, records
from schemas import topics
from schemas.codec import EVENT_TYPE_HEADER, TOKEN_EVENT, EventDecodeError
from schemas.events import ModerationEvent, StreamEvent

log = logging.getLogger(__name__)

STAGE = "safety"
GROUP = "chatpipe-safety"
GONE_S = 600.0
COMMIT_EVERY_S = 1.0
"""Commits at most this often (not after every fetch): a restart reads at most this much
more of streams already finished, which every reader drops by delivery id."""
ATTEMPT_MARKER = (EVENT_TYPE_HEADER, b"attempt")
"""The header of an `AttemptStarted` record (`schemas.codec.headers`)."""


class SafetyStage(Stage):
    def __init__(self, kafka: KafkaConfig, policy: SafetyPolicy, config: SafetyConfig) -> None:
        self.policy = policy
        self.core = SafetyCore(config)
        self.check_seconds: deque[float] = deque(maxlen=100_000)
        self.runner = StageRunner(
            kafka,
            STAGE,
            GROUP,
            [topics.TOKENS],
            self,
            RunnerOptions(poll_ms=100),
        )
        self._committed_at = float("-inf")
        self._gone_topics: dict[str, float] = {}  # delivery topic -> dropped until

    async def run(self) -> None:
        await self.runner.run()

    def commit_floor(self, tp: TopicPartition) -> int | None:
        return self.core.commit_floor(tp.partition)

    def on_revoke(self, tp: TopicPartition) -> None:
        self.core.forget_partition(tp.partition)

    def busy(self) -> int:
        return self.core.open_count

    def eager(self, batch: Batch) -> bool:
        return self.core.awaiting_first_chunk or _starts_a_stream(batch)

    async def after_batch(self) -> None:
        await self._expire()

    async def handle(self, record: ConsumerRecord) -> None:
        event = decode_record(TOKEN_EVENT, record)
        step = self.core.on_event(event, record.partition, record.offset, time.monotonic())
        if isinstance(step, Check):
            step = self.core.checked(step, await self._classify(step))
        await self._send(step)

    async def _classify(self, check: Check) -> Verdict | None:
        classifiers = self.policy.output_classifiers(check.chunk.tier, check.chunk.model)
        if not classifiers:
            return None
        started = time.perf_counter()
        try:
            return await first_verdict(classifiers, check.text)
        finally:
            self.check_seconds.append(time.perf_counter() - started)
            SAFETY_CHECK_TIME.observe(self.check_seconds[-1])

    async def _send(self, outputs: list[Output]) -> None:
        """Send every output; one the bus refuses (`RecordRejected`) is raised once the
        others are sent, so a stored answer still reaches `chat.answers` when its
        gateway's topic refuses it, and the stream then ends (`on_failure`)."""
        for output in outputs:
            if isinstance(output, ModerationEvent):
                log.info("retracting %s: %s", output.message_id, output.reason)
                RETRACTIONS.labels(output.category).inc()
        rejected: RecordRejected | None = None
        for topic, event, key in records(outputs):
            if self._gone_topics.get(topic, 0.0) > time.monotonic():
                DELIVERIES_DROPPED.inc()
                continue
            try:
                await self.runner.publisher.send(topic, event, key=key)
            except RecordRejected as exc:
                if _gateway_gone(exc):
                    log.warning("%s is gone: deliveries to it are dropped", topic)
                    self._gone_topics[topic] = time.monotonic() + GONE_S
                    DELIVERIES_DROPPED.inc()
                    continue
                rejected = rejected or exc
        if rejected is not None:
            raise rejected

    def commit_rule(self, offsets: Offsets) -> Offsets:
        """The done offsets, once COMMIT_EVERY_S has passed since the last commit."""
        now = time.monotonic()
        if not offsets or now - self._committed_at < COMMIT_EVERY_S:
            return {}
        self._committed_at = now
        return offsets

    async def on_failure(self, record: ConsumerRecord, exc: Exception) -> None:
        try:
            event = decode_record(TOKEN_EVENT, record)
        except EventDecodeError:
            return  # nothing says which stream it belonged to
        if not isinstance(event, StreamEvent):
            return
        if isinstance(exc, RecordRejected):
            await self._send(self.core.fail(event, PIPELINE_REJECTED, PIPELINE_REJECTED_MESSAGE))
        else:
            await self._send(self.core.fail(event))

    async def _expire(self) -> None:
        for request_id in self.core.expire(time.monotonic()):
            log.warning(
                "gave up on generation %s: no event for %.0f s",
                request_id,
                self.core.idle_timeout_s,
            )


def _starts_a_stream(batch: Batch) -> bool:
    """An attempt's marker is among a poll's records: its first chunk is on its way."""
    return any(ATTEMPT_MARKER in record.headers for records in batch.values() for record in records)


def _gateway_gone(exc: RecordRejected) -> bool:
    """The bus refused a delivery because its gateway's topic does not exist."""
    return exc.topic.startswith(topics.DELIVER_PREFIX) and isinstance(
        exc.cause, UnknownTopicOrPartitionError
    )
