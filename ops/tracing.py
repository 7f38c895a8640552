"""Traces: one trace per request, from its HTTP call to its last token.

Each hop's context travels in the Kafka headers of the events it produces (W3C
`traceparent`): `trace_headers` adds it to every record sent while a span is
current, `consuming` continues it where a record is read. A stage reads a request's
stream as many records carrying one context (a worker's chunks, safety's deltas), so
`consuming` keeps one CONSUMER span per context, opened by its first record and ended
by its last (any event that is not a `chunk` or a `delta`): a stream costs one span and
a dict lookup per record, never a span per token.

The spans of a request, each the parent of the next:
  gateway  `POST /v1/...` (SERVER, `ops.http_spans`; its parent: the caller's
           `traceparent`, if sent)
  scheduler  `chat.requests.<tier> process`  (dispatched later under it: `HeldContexts`)
  worker  `chat.work process`, then `generate` (events `first_token`, `finish`)
  safety  `chat.tokens process`, one per attempt's chunks
  gateway  `chat.deliver.<gateway_id> process`, the deltas it relayed
Off the path, the recorder and billing add their own `... process` spans.

Off until `setup_tracing` is given an exporter or an OTLP endpoint: each helper then
returns at its first test (no span, no header). Every stage gets its own tracer
provider, so its spans carry `service.name` chatpipe-<stage>; in `chatpipe up` they
share one batch processor and exporter.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from aiokafka.structs import ConsumerRecord
    from opentelemetry.sdk.trace import SpanProcessor
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger(__name__)

T = TypeVar("T")
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
EVENT_TYPE_HEADER = "event-type"  # schemas.codec's; not imported: codec imports this module
STREAM_EVENT_TYPES = frozenset({b"chunk", b"delta"})
"""Events followed by more of the same stream under the same context: a span stays open."""
STREAM_IDLE_S = 300.0
"""A stream span with no record for this long is ended at its last record (its end was lost)."""
HELD_CONTEXTS = 50_000
_PROPAGATOR = TraceContextTextMapPropagator()
_NO_HEADERS: tuple[tuple[str, bytes], ...] = ()


class _Tracing:
    def __init__(self, processor: SpanProcessor) -> None:
        self.processor = processor
        self.tracers: dict[str, Tracer] = {}
        self.streams: dict[str, _StreamSpans] = {}

    def tracer(self, stage: str) -> Tracer:
        found = self.tracers.get(stage)
        if found is None:
            from opentelemetry.sdk.resources import SERVICE_NAME, Resource
            from opentelemetry.sdk.trace import TracerProvider

            provider = TracerProvider(resource=Resource.create({SERVICE_NAME: f"chatpipe-{stage}"}))
            provider.add_span_processor(self.processor)
            found = self.tracers[stage] = provider.get_tracer("chatpipe")
        return found

    def stream_spans(self, stage: str) -> _StreamSpans:
        found = self.streams.get(stage)
        if found is None:
            found = self.streams[stage] = _StreamSpans(self.tracer(stage))
        return found


_state: _Tracing | None = None
_NO_OP_TRACER = trace.NoOpTracer()


def setup_tracing(otlp_endpoint: str | None, exporter: SpanExporter | None = None) -> bool:
    """Start tracing this process: spans go to `exporter`, else by OTLP/HTTP to
    `otlp_endpoint` (OTEL_EXPORTER_OTLP_ENDPOINT) + `/v1/traces`. Neither: tracing
    stays off and costs nothing. Returns whether it is on. The SDK still reads its own
    tuning variables (OTEL_EXPORTER_OTLP_HEADERS, OTEL_EXPORTER_OTLP_TIMEOUT, OTEL_BSP_*,
    OTEL_TRACES_SAMPLER, OTEL_RESOURCE_ATTRIBUTES)."""
    global _state
    if exporter is None and otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=otlp_endpoint.rstrip("/") + "/v1/traces")
    if exporter is None:
        return False
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    shutdown_tracing()
    _state = _Tracing(BatchSpanProcessor(exporter))
    log.info("tracing on: spans to %s", otlp_endpoint or type(exporter).__name__)
    return True


def flush_tracing(timeout_s: float = 10.0) -> None:
    """Export every ended span now."""
    if _state is not None:
        _state.processor.force_flush(int(timeout_s * 1000))


def shutdown_tracing() -> None:
    """End the streams still open, export what is left, and turn tracing off."""
    global _state
    state, _state = _state, None
    if state is None:
        return
    for spans in state.streams.values():
        spans.end_all()
    state.processor.shutdown()


def enabled() -> bool:
    return _state is not None


def tracer(stage: str) -> Tracer:
    """The tracer of `stage` (service.name chatpipe-<stage>); a no-op one while off."""
    return _NO_OP_TRACER if _state is None else _state.tracer(stage)


# --- produce: the context into the headers ------------------------------------------


def trace_headers() -> tuple[tuple[str, bytes], ...]:
    """The Kafka headers carrying the current span's context; none while off or
    outside any span."""
    if _state is None:
        return _NO_HEADERS
    span_context = trace.get_current_span().get_span_context()
    if not span_context.is_valid:
        return _NO_HEADERS
    return _headers_of(span_context)


def _headers_of(span_context: SpanContext) -> tuple[tuple[str, bytes], ...]:
    traceparent = _traceparent(
        span_context.trace_id, span_context.span_id, span_context.trace_flags
    )
    if not span_context.trace_state:
        return traceparent
    return (*traceparent, (TRACESTATE, span_context.trace_state.to_header().encode()))


@functools.lru_cache(maxsize=4096)  # a stream sends many records in one span
def _traceparent(trace_id: int, span_id: int, flags: int) -> tuple[tuple[str, bytes]]:
    return ((TRACEPARENT, f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}".encode()),)


def extract(headers: Iterable[tuple[str, bytes]]) -> otel_context.Context:
    """The context a record's (or a request's) W3C headers carry; an empty one if none."""
    carrier = {
        key: value.decode("latin-1") for key, value in headers if key in (TRACEPARENT, TRACESTATE)
    }
    return _PROPAGATOR.extract(carrier, context=otel_context.Context())


# --- consume: a span per record, or per stream --------------------------------------


class _Nothing:
    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc_info: object) -> None:
        return None


_NOTHING = _Nothing()
_fresh: contextvars.ContextVar[trace.Span | None] = contextvars.ContextVar(
    "chatpipe_fresh_span", default=None
)


def consuming(stage: str, record: ConsumerRecord) -> Any:
    """A context manager around handling `record`: the span of its context (a new
    CONSUMER span, or its stream's) is current meanwhile, so what the handler sends
    carries it. Nothing while off or for a record sent outside any span."""
    if _state is None:
        return _NOTHING
    traceparent = _header(record, TRACEPARENT)
    if traceparent is None:
        return _NOTHING
    return _Handling(_state.stream_spans(stage), record, traceparent)


def consumed(stage: str, records: Iterable[ConsumerRecord], events: Iterable[Any]) -> None:
    """Records a batch was read as (and decoded to `events`, one each) without a handler
    to run in their spans: the gateway's deliveries, put in their streams' inboxes."""
    if _state is None:
        return
    spans = _state.stream_spans(stage)
    for record, event in zip(records, events, strict=True):
        traceparent = _header(record, TRACEPARENT)
        if traceparent is not None:
            span, fresh = spans.span_of(record, traceparent)
            if fresh:
                _annotate(span, event)
            spans.handled(record, traceparent, span)


def decoded(event: Any) -> None:
    """`event` is what the record being handled says: its request names the span."""
    if _state is None:
        return
    span = _fresh.get()
    if span is not None:
        _annotate(span, event)
        _fresh.set(None)


class _Handling:
    __slots__ = ("record", "span", "spans", "tokens", "traceparent")

    def __init__(self, spans: _StreamSpans, record: ConsumerRecord, traceparent: bytes) -> None:
        self.spans, self.record, self.traceparent = spans, record, traceparent

    def __enter__(self) -> None:
        self.span, fresh = self.spans.span_of(self.record, self.traceparent)
        self.tokens = (
            otel_context.attach(trace.set_span_in_context(self.span)),
            _fresh.set(self.span if fresh else None),
        )

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        context_token, fresh_token = self.tokens
        _fresh.reset(fresh_token)
        otel_context.detach(context_token)
        if isinstance(exc, Exception):
            failed(exc, self.span)
        self.spans.handled(self.record, self.traceparent, self.span)


class _StreamSpans:
    """One stage's open spans by the `traceparent` their records carry."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer
        self.open: dict[bytes, list[Any]] = {}  # traceparent -> [span, last record ns, records]
        self.swept_at = time.monotonic()

    def span_of(self, record: ConsumerRecord, traceparent: bytes) -> tuple[trace.Span, bool]:
        entry = self.open.get(traceparent)
        if entry is not None:
            entry[1] = time.time_ns()
            entry[2] += 1
            return entry[0], False
        self._sweep()
        parent = extract(record.headers)
        span = self.tracer.start_span(
            f"{record.topic} process",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=_messaging_attributes(record),
        )
        self.open[traceparent] = [span, time.time_ns(), 1]
        return span, True

    def handled(self, record: ConsumerRecord, traceparent: bytes, span: trace.Span) -> None:
        if _header(record, EVENT_TYPE_HEADER) in STREAM_EVENT_TYPES:
            return
        entry = self.open.pop(traceparent, None)
        if entry is not None:
            _end(entry)

    def _sweep(self) -> None:
        now = time.monotonic()
        if now - self.swept_at < 1.0:
            return
        self.swept_at = now
        idle_since = time.time_ns() - int(STREAM_IDLE_S * 1e9)
        for traceparent in [tp for tp, entry in self.open.items() if entry[1] < idle_since]:
            entry = self.open.pop(traceparent)
            entry[0].set_attribute("chatpipe.stream_end_seen", False)
            _end(entry, end_time=entry[1])

    def end_all(self) -> None:
        for entry in self.open.values():
            _end(entry)
        self.open.clear()


def _end(entry: list[Any], end_time: int | None = None) -> None:
    span, _, records = entry
    if records > 1:
        span.set_attribute("messaging.batch.message_count", records)
    span.end(end_time=end_time)


def _header(record: ConsumerRecord, name: str) -> bytes | None:
    for key, value in record.headers or ():
        if key == name:
            return value
    return None


def _messaging_attributes(record: ConsumerRecord) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "messaging.system": "kafka",
        "messaging.operation.type": "process",
        "messaging.destination.name": record.topic,
        "messaging.destination.partition.id": str(record.partition),
        "messaging.kafka.offset": record.offset,
    }
    if record.key is not None:
        attributes["messaging.kafka.message.key"] = record.key.decode(errors="replace")
    return attributes


def _annotate(span: trace.Span, event: Any) -> None:
    request_id = getattr(event, "request_id", None)
    if request_id is None:  # a work assignment carries its request
        request_id = getattr(getattr(event, "request", None), "request_id", None)
    if request_id is not None:
        span.set_attribute("chatpipe.request_id", request_id)


def failed(exc: BaseException, span: trace.Span | None = None) -> None:
    """Handling failed: the span (the current one by default) says why."""
    if _state is None:
        return
    span = span or trace.get_current_span()
    if span.is_recording():
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


# --- work that outlives the record it came in -----------------------------------------


class HeldContexts:
    """Trace contexts of requests a stage acts on after their record's span ended: the
    scheduler admits a request while reading it and dispatches it later (again, on a
    retry), from its decisions. The most recent HELD_CONTEXTS only; nothing while off."""

    def __init__(self) -> None:
        self._contexts: OrderedDict[str, otel_context.Context] = OrderedDict()

    def hold(self, request_id: str) -> None:
        """Keep the current context for `request_id`."""
        if _state is None:
            return
        self._contexts[request_id] = otel_context.get_current()
        if len(self._contexts) > HELD_CONTEXTS:
            self._contexts.popitem(last=False)

    def within(self, request_id: str, work: Coroutine[Any, Any, T]) -> Coroutine[Any, Any, T]:
        """`work`, run in the context held for `request_id` (as it is if none)."""
        held = self._contexts.get(request_id) if self._contexts else None
        return work if held is None else _within(held, work)


async def _within(held: otel_context.Context, work: Coroutine[Any, Any, T]) -> T:
    token = otel_context.attach(held)
    try:
        return await work
    finally:
        otel_context.detach(token)


def in_span(
    stage: str, name: str, work: Coroutine[Any, Any, T], **attributes: str | int
) -> Coroutine[Any, Any, T]:
    """`work` run in a new span `name` of `stage`, child of the current one; the
    attributes are named `chatpipe.<key>`. `work` itself while off."""
    if _state is None:
        return work
    return _in_span(
        _state.tracer(stage),
        name,
        work,
        {f"chatpipe.{key}": value for key, value in attributes.items()},
    )


async def _in_span(
    tracer: Tracer, name: str, work: Coroutine[Any, Any, T], attributes: dict[str, str | int]
) -> T:
    with tracer.start_as_current_span(name, attributes=attributes):
        return await work


def add_event(name: str, **attributes: str | int) -> None:
    """An event (`chatpipe.<key>` attributes) on the current span."""
    if _state is None:
        return
    trace.get_current_span().add_event(
        name, {f"chatpipe.{key}": value for key, value in attributes.items()}
    )


def _nothing() -> None:
    return None


def event_once(name: str) -> Callable[[], None]:
    """A function adding event `name` to the current span on its first call only (a
    generation's first token): per token, one call that does nothing."""
    if _state is None:
        return _nothing
    span = trace.get_current_span()
    if not span.is_recording():
        return _nothing
    added = False

    def once() -> None:
        nonlocal added
        if not added:
            added = True
            span.add_event(name)

    return once
