"""Every Prometheus metric chatpipe exposes, defined once, and the small calls stages
record through.

Names follow vLLM's (`vllm:time_to_first_token_seconds` ...) with a `chatpipe:` prefix,
measured where the client sees them: time to first token and inter-token latency at
the gateway, per frame written, not per token. Metrics live in prometheus_client's
default registry, where vLLM's `PrometheusStatLogger` puts the engine's own `vllm:`
metrics: one exposition serves both (`exposition`). Each metric is defined here at
import, so any number of stages or stacks in one process share it and never register
a name twice.

Gauges of state (queue depth, worker slots, KV cache use, consumer lag) are read when
scraped, from the stages running in this process (`watch`): nothing is set per event,
and a stage that stops stops being reported. Consumer lag is sampled every
LAG_SAMPLE_S from each stage's consumer (`watch_lag`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from prometheus_client import (
    REGISTRY,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    make_asgi_app,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from schemas.events import DeliveryDone, Delta, GenerationRequest
from schemas.lifecycle import RequestStatus
from schemas.topics import DELIVER_PREFIX

disable_created_metrics()  # no `_created` series beside every counter and histogram

# vLLM's bucket families (vllm/v1/metrics/buckets.py).
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
INTER_TOKEN_LATENCY_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
CHECK_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

# --- gateway ------------------------------------------------------------------------------

TIME_TO_FIRST_TOKEN = Histogram(
    "chatpipe:time_to_first_token_seconds",
    "From the request's creation at the gateway (admission) to the first delta written to "
    "its client.",
    ["tier", "model"],
    buckets=TIME_TO_FIRST_TOKEN_BUCKETS,
)
INTER_TOKEN_LATENCY = Histogram(
    "chatpipe:inter_token_latency_seconds",
    "Between two frames with deltas written to a client (chunks of coalesced tokens).",
    ["tier", "model"],
    buckets=INTER_TOKEN_LATENCY_BUCKETS,
)
E2E_REQUEST_LATENCY = Histogram(
    "chatpipe:e2e_request_latency_seconds",
    "From the request's creation at the gateway to the end its client was shown.",
    ["tier", "model"],
    buckets=REQUEST_LATENCY_BUCKETS,
)
REQUEST_SUCCESS = Counter(
    "chatpipe:request_success",
    "Client streams ended, by how: stop, length, abort (cancelled, or the client left "
    "first), error, content_filter.",
    ["tier", "model", "finished_reason"],
)
ADMISSION_REJECTIONS = Counter(
    "chatpipe:admission_rejections",
    "Requests the gateway refused before queueing them, by reason: overloaded (the tier "
    "is shed), rate_limited, quota_exceeded.",
    ["tier", "reason"],
)
OPEN_STREAMS = Gauge("chatpipe:open_streams", "Client streams the gateway relays now.")
RESPONSE_CACHE_LOOKUPS = Counter(
    "chatpipe:response_cache_lookups",
    "Requests of opted-in orgs the gateway looked up in the response cache, by outcome: "
    "hit (replayed, never queued) or miss (queued).",
    ["tier", "model", "outcome"],
)
RESPONSE_CACHE_FILLS = Counter(
    "chatpipe:response_cache_fills",
    "Answers the gateway kept in the response cache after a miss.",
    ["tier", "model"],
)

# --- scheduler ----------------------------------------------------------------------------

REQUEST_QUEUE_TIME = Histogram(
    "chatpipe:request_queue_time_seconds",
    "From the request's creation to its first dispatch to a worker.",
    ["tier", "model"],
    buckets=TIME_TO_FIRST_TOKEN_BUCKETS,
)
REQUESTS_UNSERVED = Counter(
    "chatpipe:requests_unserved",
    "Requests the scheduler ended without a worker, by code: overloaded (shed), "
    "cancelled, deadline_exceeded, dispatch_failed, pipeline_rejected.",
    ["tier", "code"],
)
PREEMPTIONS = Counter(
    "chatpipe:preemptions",
    "Running requests whose slot the scheduler took back for a tenant kept waiting "
    "while another held more than its share of the model's slots.",
    ["tier", "model"],
)
DELIVERY_TOPICS_DELETED = Counter(
    "chatpipe:delivery_topics_deleted",
    "chat.deliver.<gateway_id> topics the scheduler deleted: their gateway was gone.",
)
DELIVERIES_DROPPED = Counter(
    "chatpipe:deliveries_dropped",
    "Delivery events the safety stage dropped: their gateway's topic was deleted.",
)

# --- safety, bus --------------------------------------------------------------------------

RETRACTIONS = Counter(
    "chatpipe:retractions", "Answers the safety stage retracted, by category.", ["category"]
)
SAFETY_CHECK_TIME = Histogram(
    "chatpipe:safety_check_seconds",
    "One output check by the safety stage's classifiers.",
    buckets=CHECK_BUCKETS,
)
DEAD_LETTERS = Counter(
    "chatpipe:dead_letters",
    "Records a stage sent to chat.dlq, by stage and error type.",
    ["stage", "reason"],
)

# --- gauges read when scraped -------------------------------------------------------------

LIVE_GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "chatpipe:num_requests_waiting": (
        "Requests waiting in the scheduler for a worker, by tier.",
        ("tier",),
    ),
    "chatpipe:scheduler_expected_wait_seconds": (
        "The scheduler's expected wait of a new request, by tier (shed above its bound).",
        ("tier",),
    ),
    "chatpipe:worker_slots_used": (
        "Requests a worker's engine holds (running or waiting inside it).",
        ("model",),
    ),
    "chatpipe:worker_slots_max": ("Requests a worker's engine runs at once.", ("model",)),
    "chatpipe:kv_cache_usage_perc": (
        "Share of the KV cache in use (1 = full), from the engine's scheduler stats.",
        ("model",),
    ),
    "chatpipe:consumer_lag": (
        "Records not yet read by a stage's consumer (high watermark - position), per topic.",
        ("stage", "group", "topic"),
    ),
}
Sample = tuple[str, tuple[str, ...], float]
"""(metric name in LIVE_GAUGES, its label values, value)"""
LAG_SAMPLE_S = 5.0


class _LiveState(Collector):
    """The LIVE_GAUGES of every source watched now; samples with the same labels add up
    (two workers of one model in one process), except KV cache use (the fullest)."""

    def __init__(self) -> None:
        self.sources: dict[int, Callable[[], Iterable[Sample]]] = {}

    def describe(self) -> Iterator[Metric]:
        for name, (documentation, labels) in LIVE_GAUGES.items():
            yield GaugeMetricFamily(name, documentation, labels=labels)

    def collect(self) -> Iterator[Metric]:
        values: dict[str, dict[tuple[str, ...], float]] = {name: {} for name in LIVE_GAUGES}
        for source in list(self.sources.values()):
            for name, labels, value in source():
                seen = values[name]
                if name == "chatpipe:kv_cache_usage_perc":
                    seen[labels] = max(value, seen.get(labels, 0.0))
                else:
                    seen[labels] = seen.get(labels, 0.0) + value
        for name, (documentation, labels) in LIVE_GAUGES.items():
            family = GaugeMetricFamily(name, documentation, labels=labels)
            for label_values, value in values[name].items():
                family.add_metric(label_values, value)
            yield family


_LIVE = _LiveState()
REGISTRY.register(_LIVE)


def watch(source: Callable[[], Iterable[Sample]]) -> None:
    """Report `source`'s gauges while the calling task runs (a stage's `run`)."""
    key = id(source)
    _LIVE.sources[key] = source
    task = asyncio.current_task()
    if task is not None:
        task.add_done_callback(lambda _: _LIVE.sources.pop(key, None))


def exposition(accept: str | None) -> tuple[bytes, str]:
    """Every metric of this process (chatpipe's and vLLM's), in the format `accept` asks
    for: (body, content type)."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(REGISTRY), content_type


def metrics_app() -> Callable[..., Any]:
    """An ASGI app serving `exposition` on every path (for a stage run alone; no lifespan)."""
    return make_asgi_app(REGISTRY)


# --- gateway: one stream --------------------------------------------------------------------

_FINISHED_REASON = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
    RequestStatus.FINISHED_ERROR: "error",
    RequestStatus.FINISHED_FILTERED: "content_filter",
}


class StreamTiming:
    """One client stream's latencies as its client sees them: the first delta's time
    since the request was created, then the gap between frames with deltas, and its end.
    Per frame it costs a clock read and one histogram observe."""

    __slots__ = ("_created_at", "_ended", "_itl", "_labels", "_last", "_ttft")

    def __init__(self, request: GenerationRequest) -> None:
        self._labels = (request.tier.value, request.model)
        self._created_at = request.created_at
        self._last: float | None = None
        self._ttft = TIME_TO_FIRST_TOKEN.labels(*self._labels)
        self._itl = INTER_TOKEN_LATENCY.labels(*self._labels)
        self._ended = False

    def shown(self, events: Sequence[object], ended: bool) -> None:
        """`events` are written to the client now; with `ended`, the last is its end."""
        for event in events:
            if type(event) is Delta:
                now = time.time()
                if self._last is None:
                    self._ttft.observe(max(0.0, now - self._created_at))
                else:
                    self._itl.observe(now - self._last)
                self._last = now
                break
        if ended:
            end = events[-1]
            self.ended(
                _FINISHED_REASON.get(end.status, "error")
                if isinstance(end, DeliveryDone)
                else "error"
            )

    def ended(self, finished_reason: str) -> None:
        """The stream is over (once; a stream closed before its end is `abort`)."""
        if self._ended:
            return
        self._ended = True
        REQUEST_SUCCESS.labels(*self._labels, finished_reason).inc()
        E2E_REQUEST_LATENCY.labels(*self._labels).observe(max(0.0, time.time() - self._created_at))


def admission_rejected(tier: str, reason: str) -> None:
    ADMISSION_REJECTIONS.labels(str(tier), reason).inc()


# --- scheduler, worker, bus ----------------------------------------------------------------


def preempted(tier: str, model: str) -> None:
    PREEMPTIONS.labels(str(tier), model).inc()


def dispatched(request: GenerationRequest) -> None:
    """A request's first attempt left the queue (a continuation's wait is not counted)."""
    if request.attempt == 0:
        REQUEST_QUEUE_TIME.labels(request.tier.value, request.model).observe(
            max(0.0, time.time() - request.created_at)
        )


def watch_scheduler(stage: Any) -> None:
    """Queue depth and expected wait per tier, while the scheduler acts (not fenced)."""

    def samples() -> Iterator[Sample]:
        if stage.fenced.is_set():
            return
        for tier, status in stage.core.status().items():
            yield "chatpipe:num_requests_waiting", (tier.value,), status.waiting
            if status.expected_wait_s is not None:
                yield (
                    "chatpipe:scheduler_expected_wait_seconds",
                    (tier.value,),
                    status.expected_wait_s,
                )

    watch(samples)


def watch_worker(engine: Any) -> None:
    """The engine's slots in use and in all, and its KV cache use where it knows it."""

    def samples() -> Iterator[Sample]:
        with contextlib.suppress(RuntimeError):  # not started, or stopped
            stats = engine.stats()
            yield "chatpipe:worker_slots_used", (engine.model,), stats.running + stats.waiting
            yield "chatpipe:worker_slots_max", (engine.model,), engine.max_slots
            usage = getattr(engine, "kv_cache_usage", None)
            if usage is not None:
                yield "chatpipe:kv_cache_usage_perc", (engine.model,), usage

    watch(samples)


def watch_lag(consumer: Any, stage: str) -> None:
    """Sample `consumer`'s lag every LAG_SAMPLE_S while the calling task (its consume
    loop) runs: per topic, the sum over its assigned partitions of high watermark -
    position, for partitions the consumer has fetched from."""
    group = getattr(consumer, "_group_id", None) or ""
    lag: dict[str, int] = {}

    async def sample() -> None:
        while True:
            lag.clear()
            lag.update(await _lag_by_topic(consumer))
            await asyncio.sleep(LAG_SAMPLE_S)

    sampler = asyncio.get_running_loop().create_task(sample(), name=f"{stage}-lag")
    task = asyncio.current_task()
    if task is not None:
        task.add_done_callback(lambda _: sampler.cancel())
    watch(
        lambda: [
            ("chatpipe:consumer_lag", (stage, group, topic), value) for topic, value in lag.items()
        ]
    )


async def _lag_by_topic(consumer: Any) -> dict[str, int]:
    lag: dict[str, int] = {}
    for tp in list(consumer.assignment()):
        try:
            end = consumer.highwater(tp)
            if end is None:
                continue  # nothing fetched from it yet
            position = await asyncio.wait_for(consumer.position(tp), 1.0)
        except Exception:  # noqa: BLE001 - revoked meanwhile, or no position yet
            continue
        topic = "chat.deliver" if tp.topic.startswith(DELIVER_PREFIX) else tp.topic
        lag[topic] = lag.get(topic, 0) + max(0, end - position)
    return lag


def dead_lettered(stage: str, exc: BaseException) -> None:
    DEAD_LETTERS.labels(stage, type(exc).__name__).inc()
