"""ops.tracing: trace context into Kafka headers and out of them, spans per hop and per
stream, the HTTP middleware, and nothing at all while tracing is off."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from aiokafka.structs import ConsumerRecord
from fastapi import FastAPI, Response
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from bus.subscriber import decode_record
from chatpipe.settings import Settings
from ops import tracing
from ops.http_spans import HttpSpans
from schemas import codec
from schemas.codec import CONTROL_EVENT, DELIVER_EVENT
from schemas.events import Cancel, DeliveryDone, Delta, Event, Usage
from schemas.lifecycle import RequestStatus

CALLER_TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
CALLER_SPAN = 0x00F067AA0BA902B7
CALLER = f"00-{CALLER_TRACE:032x}-{CALLER_SPAN:016x}-01"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    assert tracing.setup_tracing(None, exporter)
    try:
        yield exporter
    finally:
        tracing.shutdown_tracing()


def finished(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    tracing.flush_tracing()
    return list(exporter.get_finished_spans())


def record_of(topic: str, event: Event, offset: int = 0, key: str = "c1") -> ConsumerRecord:
    """A record as a stage would read it, with the headers sent in the current context."""
    value = codec.encode(event)
    return ConsumerRecord(
        topic,
        1,
        offset,
        int(time.time() * 1000),
        0,
        key.encode(),
        value,
        None,
        len(key),
        len(value),
        codec.headers(event),
    )


def header(record: ConsumerRecord, name: str) -> bytes | None:
    return dict(record.headers).get(name)


def done(request_id: str) -> DeliveryDone:
    return DeliveryDone(request_id=request_id, status=RequestStatus.FINISHED_STOPPED, usage=Usage())


# --- off ------------------------------------------------------------------------------


def test_off_no_headers_no_spans_no_wrapping(monkeypatch):
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("CHATPIPE_OTLP_ENDPOINT", raising=False)
    assert not tracing.enabled()
    assert not tracing.setup_tracing(
        Settings().tracing.otlp_endpoint
    )  # no endpoint, no exporter: stays off
    event = Cancel(request_id="r1")
    with trace.get_tracer("t").start_as_current_span("x"):  # even inside someone's span
        assert [name for name, _ in codec.headers(event)] == ["event-type", "schema-version"]
    record = record_of("chat.control", event)
    assert tracing.consuming("scheduler", record) is tracing.consuming("worker", record)
    work = asyncio.sleep(0)
    assert tracing.in_span("worker", "generate", work) is work
    work.close()
    held = tracing.HeldContexts()
    held.hold("r1")
    work = asyncio.sleep(0)
    assert held.within("r1", work) is work
    work.close()


# --- produce and consume ----------------------------------------------------------------


def test_headers_carry_the_current_span_as_w3c_traceparent(spans):
    tracer = tracing.tracer("gateway")
    with tracer.start_as_current_span("http") as span:
        record = record_of("chat.requests.pro", Cancel(request_id="r1"))
    sent = span.get_span_context()
    official: dict[str, str] = {}  # what OTel's own W3C propagator writes
    TraceContextTextMapPropagator().inject(official, trace.set_span_in_context(span))
    assert header(record, "traceparent") == official["traceparent"].encode()
    carrier = {"traceparent": header(record, "traceparent").decode()}
    extracted = trace.get_current_span(TraceContextTextMapPropagator().extract(carrier))
    assert (extracted.get_span_context().trace_id, extracted.get_span_context().span_id) == (
        sent.trace_id,
        sent.span_id,
    )
    outside = record_of("chat.requests.pro", Cancel(request_id="r1"))
    assert header(outside, "traceparent") is None  # heartbeats and the like: no context


def test_tracestate_travels_with_the_traceparent(spans):
    parent = tracing.extract([("traceparent", CALLER.encode()), ("tracestate", b"vendor=abc")])
    with tracing.tracer("gateway").start_as_current_span("http", context=parent):
        record = record_of("chat.control", Cancel(request_id="r1"))
    assert header(record, "tracestate") == b"vendor=abc"


def test_a_consumed_record_gets_a_consumer_span_child_of_its_producer(spans):
    with tracing.tracer("gateway").start_as_current_span("http") as http:
        record = record_of("chat.requests.pro", Cancel(request_id="r7"), offset=42)
    with tracing.consuming("scheduler", record):
        decode_record(CONTROL_EVENT, record)
        forwarded = record_of("chat.work", Cancel(request_id="r7"))
    [_, hop] = finished(spans)
    assert hop.name == "chat.requests.pro process"
    assert hop.kind is SpanKind.CONSUMER
    assert hop.parent.span_id == http.get_span_context().span_id
    assert hop.context.trace_id == http.get_span_context().trace_id
    assert hop.resource.attributes["service.name"] == "chatpipe-scheduler"
    assert {
        k: hop.attributes[k]
        for k in (
            "messaging.system",
            "messaging.destination.name",
            "messaging.kafka.message.key",
            "messaging.destination.partition.id",
            "messaging.kafka.offset",
            "chatpipe.request_id",
        )
    } == {
        "messaging.system": "kafka",
        "messaging.destination.name": "chat.requests.pro",
        "messaging.kafka.message.key": "c1",
        "messaging.destination.partition.id": "1",
        "messaging.kafka.offset": 42,
        "chatpipe.request_id": "r7",
    }
    # What the handler sent carries the hop's own span: the next hop is its child.
    assert header(forwarded, "traceparent").decode().split("-")[2] == (
        f"{hop.context.span_id:016x}"
    )
    assert not trace.get_current_span().get_span_context().is_valid  # detached after


def test_a_stream_is_one_span_from_its_first_record_to_its_end(spans):
    tracer = tracing.tracer("safety")
    with tracer.start_as_current_span("stream a") as a:
        records_a = [
            record_of("chat.deliver.g1", Delta(request_id="a", seq=i, text="x"), i)
            for i in range(3)
        ] + [record_of("chat.deliver.g1", done("a"), 3)]
    with tracer.start_as_current_span("stream b") as b:
        records_b = [record_of("chat.deliver.g1", Delta(request_id="b", text="y"), 10)]
    for record in records_a[:2] + records_b + records_a[2:3]:
        with tracing.consuming("gateway", record):
            decode_record(DELIVER_EVENT, record)
    consumers = [s for s in finished(spans) if s.kind is SpanKind.CONSUMER]
    assert consumers == [], "a stream's span ended before its end"
    with tracing.consuming("gateway", records_a[3]):
        pass
    [span] = [s for s in finished(spans) if s.kind is SpanKind.CONSUMER]
    assert span.parent.span_id == a.get_span_context().span_id
    assert span.attributes["messaging.batch.message_count"] == 4
    assert span.attributes["messaging.kafka.offset"] == 0  # where it started
    assert span.attributes["chatpipe.request_id"] == "a"
    tracing.shutdown_tracing()  # ends what is still open: stream b
    open_b = [
        s
        for s in spans.get_finished_spans()
        if s.kind is SpanKind.CONSUMER and s.parent.span_id == b.get_span_context().span_id
    ]
    assert len(open_b) == 1


def test_a_batch_without_handler_spans_per_stream(spans):
    with tracing.tracer("safety").start_as_current_span("safety"):
        records = [
            record_of("chat.deliver.g1", Delta(request_id="a", text="x"), 0),
            record_of("chat.deliver.g1", done("a"), 1),
        ]
    untraced = record_of("chat.deliver.g1", Delta(request_id="z", text="x"), 2)
    events = [DELIVER_EVENT.validate_json(r.value) for r in [*records, untraced]]
    tracing.consumed("gateway", [*records, untraced], events)
    [span] = [s for s in finished(spans) if s.kind is SpanKind.CONSUMER]
    assert span.name == "chat.deliver.g1 process"
    assert span.attributes["chatpipe.request_id"] == "a"
    assert span.resource.attributes["service.name"] == "chatpipe-gateway"


def test_a_record_without_context_gets_no_span(spans):
    record = record_of("chat.workers", Cancel(request_id="r1"))
    with tracing.consuming("scheduler", record):
        assert not trace.get_current_span().get_span_context().is_valid
    assert finished(spans) == []


def test_a_failed_record_marks_its_span(spans):
    with tracing.tracer("gateway").start_as_current_span("http"):
        record = record_of("chat.requests.pro", Cancel(request_id="r1"))
    with tracing.consuming("scheduler", record):
        tracing.failed(ValueError("bad event"))
    [_, hop] = finished(spans)
    assert hop.status.status_code is StatusCode.ERROR
    assert hop.events[0].name == "exception"


def test_a_stream_whose_end_never_comes_is_ended_at_its_last_record(spans, monkeypatch):
    monkeypatch.setattr(tracing, "STREAM_IDLE_S", 0.05)
    tracer = tracing.tracer("worker")
    with tracer.start_as_current_span("generate lost"):
        lost = record_of("chat.tokens", Delta(request_id="lost", text="x"))
    with tracer.start_as_current_span("generate later"):
        later = record_of("chat.tokens", Delta(request_id="later", text="x"))
    with tracing.consuming("safety", lost):
        pass
    time.sleep(1.1)  # past the idle time and the sweep's own pace
    with tracing.consuming("safety", later):  # a new stream sweeps the idle ones
        pass
    [span] = [s for s in finished(spans) if s.kind is SpanKind.CONSUMER]
    assert span.attributes["chatpipe.stream_end_seen"] is False
    assert span.end_time - span.start_time < 0.5e9


# --- work that outlives its record ------------------------------------------------------


async def test_held_context_follows_a_request_into_later_work(spans):
    held = tracing.HeldContexts()
    with tracing.tracer("gateway").start_as_current_span("http"):
        record = record_of("chat.requests.pro", Cancel(request_id="r1"))
    with tracing.consuming("scheduler", record):
        held.hold("r1")
    sent: list[ConsumerRecord] = []

    async def dispatch(request_id: str) -> None:
        sent.append(record_of("chat.work", Cancel(request_id=request_id)))

    await asyncio.gather(held.within("r1", dispatch("r1")), held.within("r2", dispatch("r2")))
    [_, hop] = finished(spans)
    assert header(sent[0], "traceparent").decode().split("-")[1:3] == [
        f"{hop.context.trace_id:032x}",
        f"{hop.context.span_id:016x}",
    ]
    assert header(sent[1], "traceparent") is None  # never held


async def test_in_span_covers_the_work_with_events(spans):
    async def generate() -> str:
        first = tracing.event_once("first_token")
        for _ in range(3):
            first()
        tracing.add_event("finish", status="finished_stopped")
        return "ok"

    with tracing.tracer("worker").start_as_current_span("chat.work process") as hop:
        assert await tracing.in_span("worker", "generate", generate(), request_id="r1") == "ok"
    generated = next(s for s in finished(spans) if s.name == "generate")
    assert generated.parent.span_id == hop.get_span_context().span_id
    assert [e.name for e in generated.events] == ["first_token", "finish"]
    assert generated.events[1].attributes["chatpipe.status"] == "finished_stopped"
    assert generated.attributes["chatpipe.request_id"] == "r1"


# --- HTTP -----------------------------------------------------------------------------


def _app() -> FastAPI:
    app = FastAPI()
    app.add_middleware(HttpSpans)

    @app.post("/v1/conversations/{conversation_id}/messages")
    async def message(conversation_id: str) -> Response:
        return Response(status_code=200, headers={"X-Request-Id": "req-1"})

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


async def test_http_span_continues_the_callers_traceparent(spans):
    transport = httpx.ASGITransport(app=_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        await client.post("/v1/conversations/c1/messages", headers={"traceparent": CALLER})
        await client.post("/v1/conversations/c2/messages")
        await client.get("/healthz")
    continued, fresh = finished(spans)
    assert continued.kind is SpanKind.SERVER
    assert continued.name == "POST /v1/conversations/{conversation_id}/messages"
    assert (continued.context.trace_id, continued.parent.span_id) == (CALLER_TRACE, CALLER_SPAN)
    assert continued.parent.is_remote
    assert continued.attributes["http.response.status_code"] == 200
    assert continued.attributes["chatpipe.request_id"] == "req-1"
    assert fresh.parent is None and fresh.context.trace_id != CALLER_TRACE


# --- OTLP export ----------------------------------------------------------------------


RECEIVED: list[tuple[str, str, bytes]] = []


class _Collector(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        RECEIVED.append((self.path, self.headers["Content-Type"], body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_spans_are_posted_to_the_otlp_endpoint(monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        assert tracing.setup_tracing(Settings().tracing.otlp_endpoint)
        with tracing.tracer("scheduler").start_as_current_span("chat.requests.pro process"):
            pass
        tracing.shutdown_tracing()  # exports what is buffered
    finally:
        tracing.shutdown_tracing()
        server.shutdown()
    [(path, content_type, body)] = RECEIVED
    assert (path, content_type) == ("/v1/traces", "application/x-protobuf")
    assert b"chat.requests.pro process" in body and b"chatpipe-scheduler" in body
