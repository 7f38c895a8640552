"""The gateway's HTTP side of a trace (ops.tracing): a SERVER span per request."""

from __future__ import annotations

from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from ops import tracing


class HttpSpans:
    """ASGI middleware: a SERVER span per HTTP request, continuing the caller's trace
    when it sends a `traceparent` header; named by the route (`POST /v1/...`), with the
    status and the request id the response names (`X-Request-Id`)."""

    def __init__(
        self,
        app: Any,
        stage: str = "gateway",
        untraced: frozenset[str] = frozenset({"/healthz", "/metrics"}),
    ) -> None:
        self.app = app
        self.stage = stage
        self.untraced = untraced

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if not tracing.enabled() or scope["type"] != "http" or scope["path"] in self.untraced:
            await self.app(scope, receive, send)
            return
        parent = tracing.extract((key.decode("latin-1"), value) for key, value in scope["headers"])
        method = scope["method"]
        attributes = {"http.request.method": method, "url.path": scope["path"]}
        with tracing.tracer(self.stage).start_as_current_span(
            method, context=parent, kind=SpanKind.SERVER, attributes=attributes
        ) as span:

            async def send_traced(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.start":
                    _response_started(span, message)
                await send(message)

            try:
                await self.app(scope, receive, send_traced)
            finally:
                route = getattr(scope.get("route"), "path", None)
                if route is not None:
                    span.update_name(f"{method} {route}")
                    span.set_attribute("http.route", route)


def _response_started(span: trace.Span, message: dict[str, Any]) -> None:
    status = message["status"]
    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        span.set_status(Status(StatusCode.ERROR))
    for key, value in message.get("headers", ()):
        if key.lower() == b"x-request-id":
            span.set_attribute("chatpipe.request_id", value.decode("latin-1"))
