"""The SSE response: frames already encoded (`schemas.sse`) written as they come.

A gateway holds thousands of these, each written every ~100 ms, so the response does
per frame only what it must: one `send` of the bytes. The rest is per stream, not per
frame: a listener that turns `http.disconnect` into cancelling the writer,
and a keep-alive that sends a ping comment when the stream has been quiet for
`ping_s` and treats a client that has not taken a frame for `send_timeout_s` as gone.
Whatever way it ends, `background` runs after it (the generation's close).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping

from starlette.background import BackgroundTask
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from schemas.sse import PING

HEADERS = {"Cache-Control": "no-store", "Connection": "keep-alive", "X-Accel-Buffering": "no"}


class EventStreamResponse(Response):
    media_type = "text/event-stream"

    def __init__(
        self,
        frames: AsyncIterator[bytes],
        headers: Mapping[str, str] | None = None,
        background: BackgroundTask | None = None,
        ping_s: float = 15.0,
        send_timeout_s: float = 30.0,
        status_code: int = 200,
    ) -> None:
        # `status_code` with an int default: FastAPI reads a response class's default
        # status from its signature when it writes the OpenAPI document.
        self.frames = frames
        self.status_code = status_code
        self.background = background
        self.ping_s = ping_s
        self.send_timeout_s = send_timeout_s
        self.init_headers({**HEADERS, **(headers or {})})
        self._gone = False
        self._last_sent = 0.0
        self._sending_since: float | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        writer = asyncio.current_task()
        assert writer is not None
        helpers = [
            asyncio.create_task(self._listen(receive, writer)),
            asyncio.create_task(self._keep_alive(send, writer)),
        ]
        try:
            await self._send(
                send,
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                },
            )
            async for frame in self.frames:
                await self._send(
                    send, {"type": "http.response.body", "body": frame, "more_body": True}
                )
            await self._send(send, {"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not self._gone or writer.uncancel() > 0:
                raise  # cancelled from outside (shutdown), not by the client leaving
        except OSError:
            pass  # the connection broke under a send: the client is gone
        finally:
            for helper in helpers:
                helper.cancel()
            with contextlib.suppress(Exception):
                await self.frames.aclose()  # type: ignore[attr-defined]
            if self.background is not None:
                await self.background()

    async def _listen(self, receive: Receive, writer: asyncio.Task[object]) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self._leave(writer)

    async def _send(self, send: Send, message: Message) -> None:
        """Every send of the response: the keep-alive watches how long one has waited."""
        self._sending_since = self._last_sent = asyncio.get_running_loop().time()
        try:
            await send(message)
        finally:
            self._sending_since = None

    async def _keep_alive(self, send: Send, writer: asyncio.Task[object]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(max(0.0, self._last_sent + self.ping_s - loop.time()))
            sending_since = self._sending_since
            if sending_since is not None:
                if loop.time() - sending_since > self.send_timeout_s:
                    self._leave(writer)  # it stopped reading
                    return
                await asyncio.sleep(min(self.ping_s, self.send_timeout_s))
            elif loop.time() - self._last_sent >= self.ping_s:
                try:  # a ping waits for the same full buffer a frame would
                    async with asyncio.timeout(self.send_timeout_s):
                        await self._send(
                            send, {"type": "http.response.body", "body": PING, "more_body": True}
                        )
                except (TimeoutError, OSError):
                    self._leave(writer)
                    return

    def _leave(self, writer: asyncio.Task[object]) -> None:
        """The client is gone (once, whichever of the listener and the keep-alive saw it)."""
        if not self._gone:
            self._gone = True
            writer.cancel()
