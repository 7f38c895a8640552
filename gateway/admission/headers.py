"""Headers noted while a request is handled, added to whatever response it gets.

Admission notes the rate-limit headers of an admitted request, and starting a generation
its `x-request-id` (`note_request_id`); the response may be an SSE stream, a JSON answer or
a later error, each built by its own route. `ResponseHeaders` adds the noted headers to
any of them, so no route passes them along.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextvars import ContextVar

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID_HEADER = "x-request-id"

_noted_headers: ContextVar[dict[str, str] | None] = ContextVar("noted_headers", default=None)


def note_response_headers(headers: Mapping[str, str]) -> None:
    """Headers for the response to the current request (needs `ResponseHeaders`)."""
    noted = _noted_headers.get()
    if noted is not None:
        noted.update(headers)


def note_request_id(request_id: str) -> None:
    """The request id for the response's `x-request-id`: the first generation the request
    started (a completion's first choice; a title generated later does not replace it)."""
    noted = _noted_headers.get()
    if noted is not None:
        noted.setdefault(REQUEST_ID_HEADER, request_id)


class ResponseHeaders:
    """ASGI middleware: adds the headers noted while handling a request to its response.
    A header the response already has is kept."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        noted: dict[str, str] = {}
        token = _noted_headers.set(noted)

        async def send_with_noted(message: Message) -> None:
            if message["type"] == "http.response.start" and noted:
                message.setdefault("headers", [])
                headers = MutableHeaders(scope=message)
                for name, value in noted.items():
                    if name not in headers:
                        headers[name] = value
            await send(message)

        try:
            await self.app(scope, receive, send_with_noted)
        finally:
            _noted_headers.reset(token)
