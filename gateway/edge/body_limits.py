"""Request bodies are bounded in size and in time before anything else runs.

`BodyLimits` reads each request's body whole, before the key is checked or the
JSON parsed: a declared `Content-Length` over `max_body_bytes` is refused at once,
unread; a chunked body is counted as it arrives and refused the moment it passes
the limit (413 `body_too_large`); a body that has not all arrived within
`body_read_timeout_s` of the request's start is refused (408 `body_timeout`). Both
answers close the connection, so the rest of the body is never read. The app then
gets the body in one message, and the connection's later messages (a disconnect)
as they come.

A body held whole costs at most `max_body_bytes`; FastAPI would hold it whole anyway.
A route that takes uploads (`POST /v1/files`) has a limit of its own (`larger`).
"""

from __future__ import annotations

from collections.abc import Mapping

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import error_response, error_type
from schemas.api import ErrorDetail

_CLOSE = {"Connection": "close"}


class _BodyTooLarge(Exception):
    pass


class _ClientGone(Exception):
    pass


class BodyLimits:
    """ASGI middleware: each HTTP request's body, bounded, before the app sees the request."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, read_timeout_s: float,
                 larger: Mapping[str, int] | None = None) -> None:  # fmt: skip
        """`larger`: path -> the limit of a request to that path, instead of `max_bytes`."""
        self.app = app
        self.max_bytes = max_bytes
        self.read_timeout_s = read_timeout_s
        self.larger = dict(larger or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.larger.get(scope["path"], self.max_bytes)
        declared = declared_length(scope)
        if declared is not None and declared > limit:
            await self._refuse(scope, receive, send, 413, "body_too_large", _too_large(limit))
            return
        try:
            with anyio.fail_after(self.read_timeout_s):
                body = await read_body(receive, limit)
        except _BodyTooLarge:
            await self._refuse(scope, receive, send, 413, "body_too_large", _too_large(limit))
            return
        except TimeoutError:
            message = f"the request body did not arrive within {self.read_timeout_s:g} s"
            await self._refuse(scope, receive, send, 408, "body_timeout", message)
            return
        except _ClientGone:
            return
        await self.app(scope, replayed(body, receive), send)

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, status: int, code: str,
                      message: str) -> None:  # fmt: skip
        detail = ErrorDetail(code=code, message=message, type=error_type(status))
        await error_response(status, detail, headers=_CLOSE)(scope, receive, send)


def _too_large(limit: int) -> str:
    return f"a request body holds at most {limit} bytes"


def declared_length(scope: Scope) -> int | None:
    """The request's Content-Length; None when it has none (chunked, or no body). The
    HTTP server has refused a malformed one already."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def read_body(receive: Receive, max_bytes: int) -> bytes:
    """The whole body; `_BodyTooLarge` as soon as it passes `max_bytes`."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise _BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def replayed(body: bytes, receive: Receive) -> Receive:
    """A `receive` that gives `body` first, then the connection's own messages."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive_replayed() -> Message:
        if pending:
            return pending.pop()
        return await receive()

    return receive_replayed
