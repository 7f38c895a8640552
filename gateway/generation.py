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
from schemas.events import (
    DeliverEvent,
    Delta,
    DeliveryDone,
    DeliveryError,
    GenerationRequest,
    Retract,
)

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 5.0
PING_INTERVAL_S = 15.0
SEND_TIMEOUT_S = 30.0
"""A client that reads nothing for this long is treated as gone."""


class LiveRequests:
    """The requests this gateway relays right now, by id: who may cancel them.

    A request is added once submitted and dropped when its stream closes. Only
    the gateway holding a stream knows it; a cancel sent to another replica is 404.
    """

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

    def of_conversation(self, conversation_id: str) -> list[str]:
        return [r.request_id for r in self._requests.values()
                if r.conversation_id == conversation_id]  # fmt: skip

    def __len__(self) -> int:
        return len(self._requests)


class AnswerText:
    """The answer's text as its delivery events build it: deltas add to it, and a
    retraction replaces all of it with the policy's replacement."""

    def __init__(self) -> None:
        self._parts: list[str] = []
        self.retracted = False

    def add(self, event: DeliverEvent) -> None:
        match event:
            case Delta() if not self.retracted:
                self._parts.append(event.text)
            case Retract():
                self.retracted, self._parts = True, [event.replacement]

    def __str__(self) -> str:
        return "".join(self._parts)


class Generation:
    def __init__(
        self,
        pipeline: Pipeline,
        request_id: str,
        stream: RequestStream,
        live: LiveRequests | None = None,
    ) -> None:
        self.request_id = request_id
        self._pipeline = pipeline
        self._stream = stream
        self._live = live
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
        if self._live is not None:
            self._live.discard(self.request_id)
        # Runs while the response task is being cancelled: shield it, but bound it.
        with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
            try:
                if not self._finished:
                    await self._pipeline.cancel(self.request_id)
            except Exception:
                log.warning("could not cancel request %s", self.request_id, exc_info=True)
            finally:
                await self._stream.aclose()


async def start_generation(
    pipeline: Pipeline, request: GenerationRequest, live: LiveRequests | None = None
) -> Generation:
    """Submit the request (known to `live` until its stream closes); 503 if the
    pipeline cannot take it."""
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
    if live is not None:
        live.add(request)
    return Generation(pipeline, request.request_id, stream, live)


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
