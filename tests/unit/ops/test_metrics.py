"""ops.metrics: what each recording call adds, read back from the registry as a scraper
would see it. Metrics are process-wide, so each test reads the change it made, under
labels no other test uses (a model name of its own)."""

from __future__ import annotations

import asyncio
import time
import uuid
from types import SimpleNamespace

import pytest
from aiokafka.structs import ConsumerRecord, TopicPartition
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from bus.subscriber import failed
from gateway.admission.gates import Admission, Ask, Gate, SheddingGate
from gateway.errors import ApiError
from gateway.refusals import Refused
from ops import metrics
from scheduler.core import Policy, Scheduler
from schemas.events import (
    ChatMessage,
    DeliveryDone,
    DeliveryError,
    Delta,
    GenerationRequest,
    Queued,
    Usage,
)
from schemas.lifecycle import RequestStatus
from schemas.topics import Tier
from tests.support.scheduler import make_request
from workers.sim_engine import SimEngine


def value(name: str, **labels: str) -> float:
    """The sample `name` with exactly these labels, 0 if there is none."""
    found = REGISTRY.get_sample_value(name, labels)
    return 0.0 if found is None else found


def request(model: str, created_at: float | None = None, attempt: int = 0) -> GenerationRequest:
    return GenerationRequest(
        request_id=uuid.uuid4().hex,
        attempt=attempt,
        conversation_id="c",
        message_id="m",
        user_id="u",
        org_id="o",
        tier=Tier.PRO,
        model=model,
        messages=(ChatMessage(role="user", content="hi"),),
        reply_to="chat.deliver.gw",
        created_at=created_at if created_at is not None else time.time(),
    )


def unique_model() -> str:
    return f"model-{uuid.uuid4().hex[:8]}"


def test_a_stream_times_its_first_delta_then_the_gaps_between_delta_frames() -> None:
    model = unique_model()
    labels = {"tier": "pro", "model": model}
    timing = metrics.StreamTiming(request(model, created_at=time.time() - 0.5))

    timing.shown([Queued(request_id="r", position=3)], ended=False)
    assert value("chatpipe:time_to_first_token_seconds_count", **labels) == 0

    timing.shown([Delta(request_id="r", seq=0, text="a")], ended=False)
    assert value("chatpipe:time_to_first_token_seconds_count", **labels) == 1
    assert value("chatpipe:time_to_first_token_seconds_sum", **labels) >= 0.5
    assert value("chatpipe:inter_token_latency_seconds_count", **labels) == 0

    timing.shown(
        [Delta(request_id="r", seq=1, text="b"), Delta(request_id="r", seq=2, text="c")],
        ended=False,
    )
    timing.shown([Delta(request_id="r", seq=3, text="d")], ended=False)
    assert value("chatpipe:time_to_first_token_seconds_count", **labels) == 1
    assert value("chatpipe:inter_token_latency_seconds_count", **labels) == 2, "one per frame"

    done = DeliveryDone(request_id="r", seq=4, status=RequestStatus.FINISHED_LENGTH, usage=Usage())
    timing.shown([done], ended=True)
    timing.ended("abort")  # the stream closes after its end: counted once
    assert value("chatpipe:request_success_total", finished_reason="length", **labels) == 1
    assert value("chatpipe:request_success_total", finished_reason="abort", **labels) == 0
    assert value("chatpipe:e2e_request_latency_seconds_count", **labels) == 1


@pytest.mark.parametrize(
    ("end", "reason"),
    [
        (
            DeliveryDone(request_id="r", status=RequestStatus.FINISHED_FILTERED, usage=Usage()),
            "content_filter",
        ),
        (
            DeliveryDone(request_id="r", status=RequestStatus.FINISHED_ABORTED, usage=Usage()),
            "abort",
        ),
        (
            DeliveryDone(request_id="r", status=RequestStatus.FINISHED_STOPPED, usage=Usage()),
            "stop",
        ),
        (DeliveryError(request_id="r", code="stalled", message="gone"), "error"),
    ],
)
def test_a_stream_counts_its_end_by_finished_reason(end, reason) -> None:
    model = unique_model()
    timing = metrics.StreamTiming(request(model))
    timing.shown([end], ended=True)
    assert (
        value("chatpipe:request_success_total", tier="pro", model=model, finished_reason=reason)
        == 1
    )
    assert value("chatpipe:time_to_first_token_seconds_count", tier="pro", model=model) == 0


class Refusing(Gate):
    """A gate that refuses with `code`."""

    def __init__(self, code: str) -> None:
        self.code = code

    async def check(self, ask: Ask) -> dict[str, str]:
        raise ApiError(429, self.code, "no")


@pytest.mark.parametrize(
    ("gate", "reason"),
    [
        (SheddingGate(SimpleNamespace(overloaded=lambda tier, model: 3.0)), "overloaded"),
        (Refusing("quota_exceeded"), "quota_exceeded"),
        (Refusing("rate_limited"), "rate_limited"),
    ],
)
async def test_admission_counts_each_refusal_by_tier_and_reason(gate, reason) -> None:
    before = value("chatpipe:admission_rejections_total", tier="enterprise", reason=reason)
    passing = SheddingGate(SimpleNamespace(overloaded=lambda tier, model: None))
    admission = Admission([passing, gate], pipeline=SimpleNamespace())  # type: ignore[arg-type]
    with pytest.raises((ApiError, Refused)) as refused:
        await admission.admit(SimpleNamespace(tier=Tier.ENTERPRISE), 10, "m")  # type: ignore[arg-type]
    assert refused.value.code == reason
    assert (
        value("chatpipe:admission_rejections_total", tier="enterprise", reason=reason) == before + 1
    )


def test_queue_time_is_observed_for_first_attempts_only() -> None:
    model = unique_model()
    metrics.dispatched(request(model, created_at=time.time() - 2))
    metrics.dispatched(request(model, attempt=1))
    assert value("chatpipe:request_queue_time_seconds_count", tier="pro", model=model) == 1
    assert value("chatpipe:request_queue_time_seconds_sum", tier="pro", model=model) >= 2


async def test_state_gauges_are_read_while_their_stage_runs_and_dropped_after() -> None:
    engine = SimEngine(unique_model(), max_slots=7, tokens_per_s=100, prompt_tokens_per_s=1000)
    await engine.start()
    stage = SimpleNamespace(
        core=Scheduler(Policy(), clock=time.monotonic, wall=time.time), fenced=asyncio.Event()
    )
    stop = asyncio.Event()

    async def run() -> None:
        metrics.watch_worker(engine)
        metrics.watch_scheduler(stage)
        await stop.wait()

    def waiting() -> float:
        # Other schedulers of this process (the session's stacks) report the same tier.
        return REGISTRY.get_sample_value("chatpipe:num_requests_waiting", {"tier": "free"}) or 0

    others = waiting()
    for request_id in ("a", "b", "c"):
        stage.core.add_request(make_request(request_id))
    task = asyncio.create_task(run())
    await asyncio.sleep(0)
    assert value("chatpipe:worker_slots_max", model=engine.model) == 7
    assert value("chatpipe:worker_slots_used", model=engine.model) == 0
    assert waiting() == others + 3
    stage.fenced.set()  # a fenced scheduler decides nothing: its queue is not reported
    assert waiting() == others
    stop.set()
    await task
    assert REGISTRY.get_sample_value("chatpipe:worker_slots_max", {"model": engine.model}) is None
    await engine.stop()


class FakeConsumer:
    """The part of AIOKafkaConsumer that lag sampling reads."""

    def __init__(
        self, highwater: dict[TopicPartition, int | None], position: dict[TopicPartition, int]
    ) -> None:
        self._highwater = highwater
        self._position = position
        self._group_id = "chatpipe-test"

    def assignment(self) -> set[TopicPartition]:
        return set(self._highwater)

    def highwater(self, tp: TopicPartition) -> int | None:
        return self._highwater[tp]

    async def position(self, tp: TopicPartition) -> int:
        if tp not in self._position:
            raise RuntimeError("partition revoked")
        return self._position[tp]


async def test_consumer_lag_is_high_watermark_minus_position_summed_per_topic() -> None:
    tokens = [TopicPartition("chat.tokens", p) for p in range(4)]
    deliver = TopicPartition("chat.deliver.gw-1", 0)
    consumer = FakeConsumer(
        {tokens[0]: 10, tokens[1]: 5, tokens[2]: None, tokens[3]: 9, deliver: 4},
        {tokens[0]: 7, tokens[1]: 5, tokens[2]: 0, deliver: 1},
    )
    stage = f"stage-{uuid.uuid4().hex[:6]}"
    stop = asyncio.Event()

    async def consume_loop() -> None:
        metrics.watch_lag(consumer, stage)
        await stop.wait()

    task = asyncio.create_task(consume_loop())
    for _ in range(100):
        if value("chatpipe:consumer_lag", stage=stage, group="chatpipe-test", topic="chat.tokens"):
            break
        await asyncio.sleep(0.01)
    # 10-7 + 5-5; no high watermark yet: skipped; revoked meanwhile: skipped
    assert (
        value("chatpipe:consumer_lag", stage=stage, group="chatpipe-test", topic="chat.tokens") == 3
    )
    assert (
        value("chatpipe:consumer_lag", stage=stage, group="chatpipe-test", topic="chat.deliver")
        == 3
    ), "every gateway's delivery topic is one label"
    stop.set()
    await task
    assert (
        REGISTRY.get_sample_value(
            "chatpipe:consumer_lag",
            {"stage": stage, "group": "chatpipe-test", "topic": "chat.tokens"},
        )
        is None
    )


class FakePublisher:
    def __init__(self, fails: bool = False) -> None:
        self.fails = fails
        self.sent: list[object] = []

    async def send_and_wait(self, topic: str, event: object, key: str | None = None) -> None:
        if self.fails:
            raise ConnectionError("bus down")
        self.sent.append(event)


async def test_dead_letters_are_counted_by_stage_and_error_type_once_sent() -> None:
    stage = f"stage-{uuid.uuid4().hex[:6]}"
    record = ConsumerRecord("chat.tokens", 0, 5, 0, 0, b"k", b"{bad", None, 1, 4, [])
    sent, refused = FakePublisher(), FakePublisher(fails=True)
    await failed(stage, sent, record, ValueError("not JSON"))  # type: ignore[arg-type]
    await failed(stage, refused, record, ValueError("not JSON"))  # type: ignore[arg-type]
    assert len(sent.sent) == 1
    assert value("chatpipe:dead_letters_total", stage=stage, reason="ValueError") == 1


def test_exposition_serves_text_or_openmetrics_as_asked() -> None:
    body, content_type = metrics.exposition(None)
    assert content_type.startswith("text/plain")
    names = {family.name for family in text_string_to_metric_families(body.decode())}
    assert {
        "chatpipe:time_to_first_token_seconds",
        "chatpipe:open_streams",
        "chatpipe:consumer_lag",
        "chatpipe:request_success",
    } <= names
    body, content_type = metrics.exposition("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")
