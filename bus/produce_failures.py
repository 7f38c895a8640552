"""What a stage does when the bus will not take one of its records.

Two failures look alike from `send`. The bus cannot be reached for a while (a broker
restarting, a leader moving, a request timing out): the same record goes through
later, so the stage waits it out — giving up would end requests a short outage could
have served. Or the bus refuses this record (over the message limit, not encodable, a
topic name that cannot exist, a topic the stage may not write): it fails the same way
every time, so retrying it would stop the stage for good, and every restart would
read it again (a poison pill). That record's request ends instead, with
`PIPELINE_REJECTED`, its input goes to `chat.dlq`, and the stage goes on.

`produce_failure` is the rule (pure); `RetryingPublisher` applies it to every send:
it retries the first kind in place and raises `RecordRejected` for the second.
"""

from __future__ import annotations

import asyncio
import logging
import re
from enum import Enum

from aiokafka import errors
from aiokafka.structs import RecordMetadata

from bus.clients import Publisher
from schemas.events import Event

log = logging.getLogger(__name__)

PIPELINE_REJECTED = "pipeline_rejected"
PIPELINE_REJECTED_MESSAGE = "the pipeline could not carry this request"
"""What the client reads: the cause stays in the stage's log and on `chat.dlq`."""

RETRY_BACKOFF_S = (0.1, 0.5, 1.0, 2.0, 5.0)
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


class ProduceFailure(Enum):
    BUS = "bus"
    """The bus is unreachable or busy: send the same record again after a pause."""
    RECORD = "record"
    """The bus refuses this record: end what it belongs to, dead-letter it, go on."""


_WAITED_OUT = (
    errors.KafkaConnectionError,
    errors.NodeNotReadyError,
    errors.NoBrokersAvailable,
    errors.KafkaTimeoutError,
    errors.RequestTimedOutError,
)
"""Not all flagged `retriable` by aiokafka, yet only the bus's state: e.g. a batch
that expired while the broker was away."""


def produce_failure(exc: BaseException) -> ProduceFailure:
    """Which failure `exc`, raised by sending one record, is.

    aiokafka's `retriable` errors are the bus's (leader moves, connections,
    replicas), except a topic missing from the metadata: the client has waited its
    request timeout for it already, and a topic named by a request (`reply_to`) that
    does not exist never will. Everything else — a size the client or broker refuses,
    an unencodable event, an invalid or unauthorised topic, an error the broker
    gives no reason for — is the record's."""
    if isinstance(exc, errors.UnknownTopicOrPartitionError):
        return ProduceFailure.RECORD
    if isinstance(exc, (*_WAITED_OUT, TimeoutError, ConnectionError)):
        return ProduceFailure.BUS
    if isinstance(exc, errors.KafkaError) and exc.retriable:
        return ProduceFailure.BUS
    return ProduceFailure.RECORD


def retry_delay(failures: int) -> float:
    """The pause before sending again after `failures` (>= 1) failures in a row."""
    return RETRY_BACKOFF_S[min(failures, len(RETRY_BACKOFF_S)) - 1]


class RecordRejected(Exception):
    """The bus refused one record; sending it again would fail the same way."""

    def __init__(self, topic: str, cause: BaseException) -> None:
        super().__init__(f"{topic}: {type(cause).__name__}: {cause}")
        self.topic = topic
        self.cause = cause


class RetryingPublisher(Publisher):
    """A `Publisher` that waits out an unreachable bus and raises `RecordRejected`
    for a record the bus refuses. Only what `send` itself raises, or what
    `send_and_wait` waits for, is seen: a record `send` enqueued that the broker later
    refuses is only logged (a stage that must know sends it with `send_and_wait`)."""

    async def send(
        self, topic: str, event: Event, key: str | None = None, partition: int | None = None
    ) -> asyncio.Future[RecordMetadata]:
        future = await self._retried(super().send, topic, event, key, partition)
        future.add_done_callback(lambda f: _log_lost(topic, f))
        return future

    async def send_and_wait(
        self, topic: str, event: Event, key: str | None = None, partition: int | None = None
    ) -> RecordMetadata:
        return await self._retried(super().send_and_wait, topic, event, key, partition)

    async def _retried(
        self, send, topic: str, event: Event, key: str | None, partition: int | None
    ):
        if not _TOPIC_NAME.fullmatch(topic):
            raise RecordRejected(topic, ValueError("not a valid topic name"))
        failures = 0
        while True:
            try:
                return await send(topic, event, key=key, partition=partition)
            except (asyncio.CancelledError, errors.ProducerClosed):
                raise  # the stage is stopping: nothing to retry, nothing to end
            except Exception as exc:  # sorted by produce_failure
                if produce_failure(exc) is ProduceFailure.RECORD:
                    raise RecordRejected(topic, exc) from exc
                failures += 1
                log.warning(
                    "sending %s to %s failed (%s: %s); retrying, %d failures",
                    getattr(event, "type", type(event).__name__),
                    topic,
                    type(exc).__name__,
                    exc,
                    failures,
                )
                await asyncio.sleep(retry_delay(failures))


def _log_lost(topic: str, future: asyncio.Future[RecordMetadata]) -> None:
    if future.cancelled() or future.exception() is None:
        return
    exc = future.exception()
    log.error("a record for %s was not written: %s: %s", topic, type(exc).__name__, exc)
