"""The HTTP server's bounds on clients that send slowly or without end.

uvicorn waits for headers as long as the client likes (its keep-alive timeout only
covers the time between requests), so a client that opens connections and sends
a header byte now and then (slowloris) holds them, and one that streams header
bytes without end fills memory. This protocol is uvicorn's own (httptools) with a
timer: from the connection's start, and from each later request's first byte, the
headers must be complete within `header_timeout_s` and `MAX_HEADER_BYTES`, else the
client gets 408 (or 431) and the connection is closed.

Closing a connection while the client is still sending (a refused body, refused
headers) would make the kernel answer its next bytes with a reset, which can
destroy the refusal before the client reads it. So such a connection lingers
(as nginx's does): the answer is sent and the sending side shut, what still
arrives is discarded unread, and the connection closes when the client does or
after `LINGER_S`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEADER_BYTES = 64 << 10
"""Request line and headers together; nginx allows 4 buffers of 8 KiB."""

LINGER_S = 2.0
"""How long a refused client may go on sending (discarded) before the reset."""


def _refusal(status: int, reason: str) -> bytes:
    return (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"content-length: {len(reason)}\r\nconnection: close\r\n\r\n{reason}"
    ).encode()


class _LingeringTransport:
    """The connection's transport as uvicorn sees it: its close() lingers while the
    client may still be sending."""

    def __init__(self, transport: asyncio.Transport, protocol: GuardedProtocol) -> None:
        self._transport = transport
        self._protocol = protocol

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        return self._transport.is_closing() or self._protocol.lingering

    def close(self) -> None:
        self._protocol.close()


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with headers bounded in time and size and a
    lingering close."""

    header_timeout_s: float = 10.0
    lingering = False
    _raw: asyncio.Transport
    _header_timer: asyncio.TimerHandle | None = None
    _header_bytes = 0
    _message_complete = True
    _linger_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._raw = transport
        super().connection_made(_LingeringTransport(transport, self))  # type: ignore[arg-type]
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            return
        super().data_received(data)
        if self._header_timer is not None:  # the headers are not complete yet
            self._header_bytes += len(data)
            if self._header_bytes > MAX_HEADER_BYTES:
                self._refuse(431, "Request Header Fields Too Large")

    def on_message_begin(self) -> None:
        self._message_complete = False
        super().on_message_begin()
        if self._header_timer is None:
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._message_complete = True
        super().on_message_complete()

    def close(self) -> None:
        """Close now if the client has sent all it meant to; else linger."""
        if self._raw.is_closing() or self.lingering:
            return
        if self._message_complete:  # nothing of a request is still on its way
            self._raw.close()
            return
        self.lingering = True
        self._disarm()
        if self._raw.can_write_eof():
            self._raw.write_eof()
        self.flow.resume_reading()
        self._linger_timer = self.loop.call_later(LINGER_S, self._raw.close)

    def _arm(self) -> None:
        self._header_bytes = 0
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._timed_out)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _timed_out(self) -> None:
        self._refuse(408, "Request Timeout")

    def _refuse(self, status: int, reason: str) -> None:
        if self._raw.is_closing() or self.lingering:
            return
        if self.cycle is None or self.cycle.response_complete:
            # A response in flight (a pipelined request behind it) is cut short instead.
            self._raw.write(_refusal(status, reason))
        self.close()


def guarded_protocol(header_timeout_s: float) -> type[GuardedProtocol]:
    """The protocol class for `uvicorn.Config(http=...)`, with its header timeout set."""
    return type("GuardedProtocol", (GuardedProtocol,), {"header_timeout_s": header_timeout_s})
