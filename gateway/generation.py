"""One request's stream as the HTTP layer sees it: its events through the gateway's
stream core (`gateway.stream_relay`), the answer stored before its end is shown, and
what happens when the listener goes away first.

The client going away is an event the response listens for (STYLE 6):
`EventSourceResponse` cancels the stream when `http.disconnect` arrives, and
`until_disconnected` does the same for a plain JSON answer. Either way
`Generation.close` runs, shielded: with a resume grace (native streams) the
generation is held that long for the client to come back, else it is cancelled at
once, so no GPU time is spent on output nobody reads. A stream that gets no event
for `stall_s` ends with error `stalled` and its generation is cancelled.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import anyio
from fastapi import Request
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask

from gateway.errors import ApiError
from gateway.pipeline import Pipeline, RequestStream
from gateway.stream_relay import StreamRelay
from schemas import sse
from schemas.events import DeliverEvent, GenerationRequest

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 5.0
PING_INTERVAL_S = 15.0
SEND_TIMEOUT_S = 30.0
"""A client that reads nothing for this long is treated as gone."""

OnEnd = Callable[[StreamRelay], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class StreamTimers:
    stall_s: float = 30.0
    """No event for this long: the stream ends with `stalled` and is cancelled."""
    grace_s: float = 0.0
    """A dropped stream's generation is held this long for a resume; 0: cancel at once."""


class LiveRequests:
    """The requests this gateway relays right now, by id, for cancels of requests the
    store does not know (OpenAI-compatible ones). Dropped when their stream closes."""

    def __init__(self) -> None:
        self._requests: dict[str, GenerationRequest] = {}

    def add(self, request: GenerationRequest) -> None:
        self._requests[request.request_id] = request

    def discard(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def owned(self, request_id: str, user_id: str) -> GenerationRequest | None:
        """The running request, if it is `user_id`'s."""
        request = self._requests.get(request_id)
        return request if request is not None and request.user_id == user_id else None

    def __len__(self) -> int:
        return len(self._requests)


class Generation:
    def __init__(self, pipeline: Pipeline, request_id: str, stream: RequestStream,
                 relay: StreamRelay | None = None, timers: StreamTimers = StreamTimers(),
                 live: LiveRequests | None = None, on_end: OnEnd | None = None) -> None:
        self.request_id = request_id
        self.relay = relay or StreamRelay()
        self._pipeline = pipeline
        self._stream = stream
        self._timers = timers
        self._live = live
        self._on_end = on_end
        self._closed = False

    @property
    def finished(self) -> bool:
        """A terminal event (done or error) was received."""
        return self.relay.ended

    async def events(self) -> AsyncIterator[DeliverEvent]:
        """Events to show, up to and including the terminal one; closes on exit."""
        events = aiter(self._stream)
        try:
            while not self.relay.ended:
                try:
                    async with asyncio.timeout(self._timers.stall_s):
                        event = await anext(events)
                except StopAsyncIteration:
                    return  # the stream went away without an end
                except TimeoutError:
                    log.warning("request %s stalled: no event for %.0f s", self.request_id,
                                self._timers.stall_s)
                    shown = self.relay.stall(self.request_id)
                    await self._cancel("stalled")
                else:
                    shown = self.relay.add(event)
                if self.relay.ended:
                    await self._ended()
                if shown is not None:
                    yield shown
        finally:
            await self.close()

    async def _ended(self) -> None:
        """Store the answer before its end is shown (read your writes)."""
        if self._on_end is None:
            return
        try:
            await self._on_end(self.relay)
        except Exception:  # noqa: BLE001 - the recorder stores it; the stream still ends
            log.warning("could not store the end of %s", self.request_id, exc_info=True)

    async def close(self) -> None:
        """Stop listening; unless the answer ended, hold or cancel its generation."""
        if self._closed:
            return
        self._closed = True
        if self._live is not None:
            self._live.discard(self.request_id)
        if not self.relay.ended and self._timers.grace_s > 0:
            self._pipeline.hold(self.request_id, self._stream, self._timers.grace_s)
            return
        # Runs while the response task is being cancelled: shield it, but bound it.
        with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
            try:
                if not self.relay.ended:
                    await self._cancel("client_disconnected")
            finally:
                await self._stream.aclose()

    async def _cancel(self, reason: str) -> None:
        try:
            await self._pipeline.cancel(self.request_id, reason=reason)
        except Exception:  # noqa: BLE001 - the stream ends anyway
            log.warning("could not cancel request %s", self.request_id, exc_info=True)


async def start_generation(
    pipeline: Pipeline, request: GenerationRequest, live: LiveRequests | None = None,
    relay: StreamRelay | None = None, timers: StreamTimers = StreamTimers(),
    on_end: OnEnd | None = None,
) -> Generation:  # fmt: skip
    """Submit the request (known to `live` until its stream closes); 503 if the
    pipeline cannot take it."""
    try:
        stream = await pipeline.submit(request)
    except ApiError:
        raise
    except Exception as exc:
        raise unavailable() from exc
    if live is not None:
        live.add(request)
    return Generation(pipeline, request.request_id, stream, relay, timers, live, on_end)


def unavailable() -> ApiError:
    return ApiError(503, "pipeline_unavailable", "the request could not be queued",
                    headers={"Retry-After": "5"})


def event_stream(
    events: AsyncIterator[ServerSentEvent], generation: Generation
) -> EventSourceResponse:
    """The SSE response; closing the generation also covers a stream that never started."""
    return EventSourceResponse(
        events,
        sep=sse.SEP,
        ping=PING_INTERVAL_S,
        send_timeout=SEND_TIMEOUT_S,
        headers={"X-Request-Id": generation.request_id},
        background=BackgroundTask(generation.close),
    )


async def until_disconnected(request: Request) -> None:
    """Returns when the client disconnects (call once the body has been read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
