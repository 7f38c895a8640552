"""What a stage does with a produce that fails: the pure rule that
tells an unreachable bus from a record the bus refuses, and the publisher applying it.
The producer here is a fake with aiokafka's `send`/`send_and_wait`, not a mock."""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest
from aiokafka import errors

from bus import produce_failures
from bus.clients import Publisher
from bus.produce_failures import (
    PIPELINE_REJECTED,
    ProduceFailure,
    RecordRejected,
    RetryingPublisher,
    produce_failure,
)
from scheduler.journal import unserved_end
from schemas.events import DeliveryError, GenerationError, GenerationRequest
from tests.support.safety import chunk_of, feed, record, stage_with, to_gateway
from workers.failures import ENGINE_ERROR, ENGINE_ERROR_MESSAGE, client_error

BUS = ProduceFailure.BUS
RECORD = ProduceFailure.RECORD


@pytest.mark.parametrize(("exc", "failure"), [
    # The bus's state: the same record goes through later.
    (errors.KafkaConnectionError("connection refused"), BUS),
    (errors.NodeNotReadyError(), BUS),
    (errors.NoBrokersAvailable(), BUS),
    (errors.KafkaTimeoutError(), BUS),  # a batch expired while the broker was away
    (errors.RequestTimedOutError(), BUS),
    (errors.NotLeaderForPartitionError(), BUS),
    (errors.LeaderNotAvailableError(), BUS),
    (errors.NotEnoughReplicasError(), BUS),
    (TimeoutError(), BUS),
    (ConnectionResetError(), BUS),
    # This record's: sending it again fails the same way.
    (errors.MessageSizeTooLargeError("over max_request_size"), RECORD),
    (errors.RecordListTooLargeError(), RECORD),
    (errors.InvalidTopicError(), RECORD),
    (errors.UnknownTopicOrPartitionError(), RECORD),  # waited for already, never came
    (errors.TopicAuthorizationFailedError(), RECORD),
    (errors.CorruptRecordException(), RECORD),
    (errors.UnknownError(), RECORD),
    (orjson.JSONEncodeError("Integer exceeds 64-bit range"), RECORD),
    (ValueError("unencodable"), RECORD),
])  # fmt: skip
def test_a_failed_produce_is_the_buss_or_the_records(exc, failure):
    assert produce_failure(exc) is failure


class FakeProducer:
    """aiokafka's producer as the publisher uses it: each send fails with the next of
    `failures` (None: it succeeds)."""

    def __init__(self, *failures: BaseException | None) -> None:
        self.failures = list(failures)
        self.sent: list[str] = []

    async def send(self, topic, value, key=None, partition=None, headers=None):
        self.sent.append(topic)
        failure = self.failures.pop(0) if self.failures else None
        if failure is not None:
            raise failure
        future = asyncio.get_running_loop().create_future()
        future.set_result(None)
        return future

    async def send_and_wait(self, topic, value, key=None, partition=None, headers=None):
        return await (await self.send(topic, value, key, partition, headers))


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch):
    monkeypatch.setattr(produce_failures, "retry_delay", lambda failures: 0.0)


def event() -> GenerationError:
    return GenerationError(
        request_id="r",
        seq=0,
        conversation_id="c",
        message_id="m",
        model="tiny-random",
        reply_to="chat.deliver.gw",
        code="x",
        message="y",
    )


@pytest.mark.parametrize("method", ["send", "send_and_wait"])
async def test_an_unreachable_bus_is_waited_out_not_turned_into_an_error(method):
    producer = FakeProducer(errors.KafkaConnectionError("down"), errors.KafkaTimeoutError(), None)
    await getattr(RetryingPublisher(producer), method)("chat.tokens", event(), key="c")
    assert producer.sent == ["chat.tokens"] * 3


@pytest.mark.parametrize("method", ["send", "send_and_wait"])
async def test_a_record_the_bus_refuses_is_raised_at_once_as_rejected(method):
    cause = errors.MessageSizeTooLargeError("The message is 9000000 bytes")
    producer = FakeProducer(cause)
    with pytest.raises(RecordRejected) as raised:
        await getattr(RetryingPublisher(producer), method)("chat.work", event(), key="c")
    assert producer.sent == ["chat.work"], "sent once: again would fail the same way"
    assert raised.value.cause is cause and raised.value.topic == "chat.work"


async def test_a_write_the_broker_fails_without_a_reason_is_sent_again_twice():
    """The embedded broker's first write to a partition it made again after a restart."""
    twice = FakeProducer(errors.UnknownError(), errors.UnknownError(), None)
    await Publisher(twice).send_and_wait("chat.tokens", event(), key="c")  # type: ignore[arg-type]
    assert twice.sent == ["chat.tokens"] * 3
    always = FakeProducer(*[errors.UnknownError()] * 3)
    with pytest.raises(RecordRejected):
        await RetryingPublisher(always).send_and_wait("chat.tokens", event(), key="c")  # type: ignore[arg-type]
    assert len(always.sent) == 3


async def test_a_topic_name_that_cannot_exist_is_refused_without_asking_the_bus():
    producer = FakeProducer()
    with pytest.raises(RecordRejected):
        await RetryingPublisher(producer).send("chat.deliver.no such gateway!", event())
    assert producer.sent == []


async def test_a_stopping_producer_is_neither_retried_nor_a_rejected_record():
    producer = FakeProducer(errors.ProducerClosed())
    with pytest.raises(errors.ProducerClosed):
        await RetryingPublisher(producer).send("chat.tokens", event())


async def test_the_real_producers_size_check_is_a_rejected_record():
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:1", max_request_size=1024)
    producer.client._wait_on_metadata = _no_metadata_wait  # never started: no broker here
    big = event().model_copy(update={"message": "x" * 2048})
    with pytest.raises(RecordRejected) as raised:
        await RetryingPublisher(producer).send("chat.tokens", big)
    assert isinstance(raised.value.cause, errors.MessageSizeTooLargeError)
    await producer.client.close()


async def _no_metadata_wait(topic: str) -> set[int]:
    return {0}


async def test_an_enqueued_record_the_broker_refuses_later_is_logged(caplog):
    loop = asyncio.get_running_loop()
    later = loop.create_future()

    class Enqueuing(FakeProducer):
        async def send(self, topic, value, key=None, partition=None, headers=None):
            return later

    await RetryingPublisher(Enqueuing()).send("chat.tokens", event())
    with caplog.at_level(logging.ERROR, logger="bus.produce_failures"):
        later.set_exception(errors.MessageSizeTooLargeError())
        await asyncio.sleep(0)
    assert "not written" in caplog.text


# --- what the client is told --------------------------------------------------------


def test_an_engine_failure_tells_the_client_a_code_and_a_fixed_message():
    exc = RuntimeError("CUDA error at /opt/vllm/worker.py:42: request r7 of user bob")
    error = client_error(exc)
    assert (error.code, error.message) == (ENGINE_ERROR, ENGINE_ERROR_MESSAGE)


def test_an_output_the_bus_refused_tells_the_client_pipeline_rejected():
    rejected = RecordRejected("chat.tokens", errors.MessageSizeTooLargeError("9000000 bytes"))
    error = client_error(rejected)
    assert error.code == PIPELINE_REJECTED and "9000000" not in error.message


def test_the_scheduler_ends_a_refused_request_pipeline_rejected():
    request = GenerationRequest(
        request_id="r",
        conversation_id="c",
        message_id="m",
        user_id="u",
        org_id="o",
        tier="free",
        model="tiny-random",
        messages=(),
        reply_to="chat.deliver.gw",
    )
    end = unserved_end(request, PIPELINE_REJECTED)
    assert isinstance(end, GenerationError) and end.code == PIPELINE_REJECTED
    assert end.message == produce_failures.PIPELINE_REJECTED_MESSAGE


async def test_safety_ends_a_refused_stream_pipeline_rejected_without_the_cause():
    stage, out = stage_with()
    await feed(stage, ["a"], done=False)
    cause = RecordRejected("chat.deliver.x", errors.MessageSizeTooLargeError("9000000 bytes"))
    await stage.on_failure(record(chunk_of(1, "b"), 1), cause)
    [end] = [e for e in to_gateway(out) if isinstance(e, DeliveryError)]
    assert isinstance(end, DeliveryError) and end.code == PIPELINE_REJECTED
    assert "9000000" not in end.message and "MessageSizeTooLarge" not in end.message
