"""A bound on how long and how much a client may take to send a request's headers.

uvicorn waits for headers as long as the client likes (its keep-alive timeout only
covers the time between requests), so a client that opens connections and sends
a header byte now and then (slowloris) holds them, and one that streams header
bytes without end fills memory. This protocol is uvicorn's own (httptools) with a
timer: from the connection's start, and from each later request's first byte, the
headers must be complete within `header_timeout_s` and `MAX_HEADER_BYTES`, else the
client gets 408 (or 431) and the connection is closed.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEADER_BYTES = 64 << 10
"""Request line and headers together; nginx allows 4 buffers of 8 KiB."""


def _refusal(status: int, reason: str) -> bytes:
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\n"
            f"content-length: {len(reason)}\r\nconnection: close\r\n\r\n{reason}").encode()


class HeaderTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with headers bounded in time and size."""

    header_timeout_s: float = 10.0
    _header_timer: asyncio.TimerHandle | None = None
    _header_bytes: int = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._header_timer is not None:  # the headers are not complete yet
            self._header_bytes += len(data)
            if self._header_bytes > MAX_HEADER_BYTES:
                self._refuse(431, "Request Header Fields Too Large")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._header_timer is None:
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def _arm(self) -> None:
        self._header_bytes = 0
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._timed_out)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _timed_out(self) -> None:
        self._header_timer = None
        self._refuse(408, "Request Timeout")

    def _refuse(self, status: int, reason: str) -> None:
        self._disarm()
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete:
            # A response in flight (a pipelined request behind it) is cut short instead.
            self.transport.write(_refusal(status, reason))
        self.transport.close()


def header_timeout_protocol(timeout_s: float) -> type[HeaderTimeoutProtocol]:
    """The protocol class for `uvicorn.Config(http=...)`, with its timeout set."""
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout_s": timeout_s})
