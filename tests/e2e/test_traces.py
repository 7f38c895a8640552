"""One trace per request, over real HTTP through every stage on the real broker: the
caller's `traceparent` is continued by the gateway, and each hop's span is the child of
the one before it, its context carried in the Kafka headers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from itertools import pairwise

import pytest_asyncio
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from chatpipe.dev_stack import running_sim_stack, stack_settings
from chatpipe.wiring import Stack
from ops import tracing
from tests.support.chat import read_sse
from tests.support.stack import client_for

CALLER_TRACE = 0x0AF7651916CD43DD8448EB211C80319C
CALLER_SPAN = 0xB7AD6B7169203331
CALLER = f"00-{CALLER_TRACE:032x}-{CALLER_SPAN:016x}-01"


@pytest_asyncio.fixture(loop_scope="session")
async def traced_stack(tmp_path) -> AsyncIterator[tuple[Stack, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    settings = stack_settings(tmp_path, engine="sim", sim_tokens_per_s=200.0, auto_titles=False)
    assert tracing.setup_tracing(
        settings.tracing.otlp_endpoint, exporter
    )  # before the stack starts
    try:
        async with running_sim_stack(settings) as stack:
            yield stack, exporter
    finally:
        tracing.shutdown_tracing()


async def _ask(stack: Stack, headers: dict[str, str]) -> str:
    """One streamed answer; returns its request id."""
    async with client_for(stack) as client:
        conversation = (await client.post("/v1/conversations", json={})).json()
        async with client.stream(
            "POST",
            f"/v1/conversations/{conversation['conversation_id']}/messages",
            json={"content": "[[sim:reply=traced all the way]]"},
            headers=headers,
        ) as response:
            assert response.status_code == 200, await response.aread()
            events = await read_sse(response)
    assert "done" in [event.event for event in events], events
    return response.headers["X-Request-Id"]


async def _spans_of(
    exporter: InMemorySpanExporter, request_id: str, timeout_s: float = 20.0
) -> dict[tuple[str, str], ReadableSpan]:
    """The request's spans by (service, name) once its last hop's has ended."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        tracing.flush_tracing()
        found = {
            (
                span.resource.attributes["service.name"],
                span.name.split(".", 2)[1] if span.name.startswith("chat.deliver.") else span.name,
            ): span
            for span in exporter.get_finished_spans()
            if span.attributes.get("chatpipe.request_id") == request_id
        }
        if ("chatpipe-gateway", "deliver") in found or loop.time() > deadline:
            return found
        await asyncio.sleep(0.1)


def _parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def test_one_trace_from_the_http_call_to_the_last_token(traced_stack):
    stack, exporter = traced_stack
    request_id = await _ask(stack, {"traceparent": CALLER})
    spans = await _spans_of(exporter, request_id)
    chain = [
        ("chatpipe-gateway", "POST /v1/conversations/{conversation_id}/messages"),
        ("chatpipe-scheduler", "chat.requests.free process"),
        ("chatpipe-worker", "chat.work process"),
        ("chatpipe-worker", "generate"),
        ("chatpipe-safety", "chat.tokens process"),
        ("chatpipe-gateway", "deliver"),  # chat.deliver.<gateway_id> process
    ]
    assert set(chain) <= set(spans), sorted(spans)
    http = spans[chain[0]]
    assert http.kind is SpanKind.SERVER
    assert (http.context.trace_id, _parent_of(http)) == (CALLER_TRACE, CALLER_SPAN)
    for parent, child in pairwise(chain):
        assert spans[child].context.trace_id == CALLER_TRACE, child
        assert _parent_of(spans[child]) == spans[parent].context.span_id, (parent, child)
    assert {spans[hop].kind for hop in chain[1:]} == {SpanKind.CONSUMER, SpanKind.INTERNAL}
    generate = spans[("chatpipe-worker", "generate")]
    assert [event.name for event in generate.events] == ["first_token", "finish"]
    relay = spans[chain[-1]]
    assert relay.attributes["messaging.batch.message_count"] >= 2  # deltas and done: one span
    assert http.end_time >= relay.end_time  # the HTTP span lasts to the last token sent

    # Without a traceparent a request starts its own trace, across every stage too.
    other_id = await _ask(stack, {})
    other = await _spans_of(exporter, other_id)
    assert set(chain) <= set(other), sorted(other)
    other_trace = other[chain[0]].context.trace_id
    assert other[chain[0]].parent is None and other_trace != CALLER_TRACE
    assert {other[hop].context.trace_id for hop in chain} == {other_trace}
