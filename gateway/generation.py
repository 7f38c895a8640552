"""One submitted request as the HTTP layer sees it: its delivery events, and a
cancel on `chat.control` whenever the listener goes away before the end.

The client going away is an event the response listens for (STYLE 6):
`EventSourceResponse` cancels the stream when `http.disconnect` arrives, and
`until_disconnected` does the same for a plain JSON answer. Either way
`Generation.close` runs, shielded, so no GPU time is spent on output nobody reads.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import anyio
from fastapi import Request
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.background import BackgroundTask

from gateway.errors import ApiError
from gateway.pipeline import Pipeline, RequestStream
from schemas import sse
from schemas.events import DeliverEvent, DeliveryDone, DeliveryError, GenerationRequest

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 5.0
PING_INTERVAL_S = 15.0
SEND_TIMEOUT_S = 30.0
"""A client that reads nothing for this long is treated as gone."""


class Generation:
    def __init__(self, pipeline: Pipeline, request_id: str, stream: RequestStream) -> None:
        self.request_id = request_id
        self._pipeline = pipeline
        self._stream = stream
        self._finished = False
        self._closed = False

    @property
    def finished(self) -> bool:
        """A terminal event (done or error) was received."""
        return self._finished

    async def events(self) -> AsyncIterator[DeliverEvent]:
        """Delivery events up to and including the terminal one; closes on exit."""
        try:
            async for event in self._stream:
                self._finished = isinstance(event, DeliveryDone | DeliveryError)
                yield event
                if self._finished:
                    return
        finally:
            await self.close()

    async def close(self) -> None:
        """Stop listening; cancel the generation unless it ended. Idempotent."""
        if self._closed:
            return
        self._closed = True
        # Runs while the response task is being cancelled: shield it, but bound it.
        with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
            try:
                if not self._finished:
                    await self._pipeline.cancel(self.request_id)
            except Exception:
                log.warning("could not cancel request %s", self.request_id, exc_info=True)
            finally:
                await self._stream.aclose()


async def start_generation(pipeline: Pipeline, request: GenerationRequest) -> Generation:
    """Submit the request; 503 if the pipeline cannot take it."""
    try:
        stream = await pipeline.submit(request)
    except ApiError:
        raise
    except Exception as exc:
        raise ApiError(
            503,
            "pipeline_unavailable",
            "the request could not be queued",
            headers={"Retry-After": "5"},
        ) from exc
    return Generation(pipeline, request.request_id, stream)


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
