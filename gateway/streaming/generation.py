"""One request's stream as the HTTP layer sees it: its events through the gateway's
stream core (`gateway.streaming.stream_relay`), the answer stored before its end is shown, and
what happens when the listener goes away first.

The client going away is an event the response listens for (docs/decisions.md, *Thin routes*):
`EventStreamResponse` cancels the stream when `http.disconnect` arrives, and
`until_disconnected` does the same for a plain JSON answer. Either way
`Generation.close` runs, shielded: with a resume grace (native streams) the
generation is held that long for the client to come back, else it is cancelled at
once, so no GPU time is spent on output nobody reads. A stream that gets no event
for `stall_s` ends with error `stalled` and its generation is cancelled. A
generation's lease (`gateway.admission.leases`) is released at its end, before the
end is shown, or when its stream is closed (after a hold, for a held one).

Events are relayed in batches: all that arrived since the relay last looked, so a
relay that falls behind (a busy gateway) catches up in one write, its deltas merged
(`merged_deltas`), rather than falling further behind one event at a time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import TypeVar

import anyio
from fastapi import Request
from starlette.background import BackgroundTask

from gateway.admission.headers import note_request_id
from gateway.admission.leases import Lease, LeasedStream
from gateway.errors import ApiError, from_delivery_error
from gateway.pipeline import Pipeline, RequestStream
from gateway.refusals import Refused, pipeline_unavailable
from gateway.streaming.event_stream import EventStreamResponse
from gateway.streaming.stream_relay import StreamRelay
from ops.metrics import OPEN_STREAMS, StreamTiming
from schemas.answer import AnswerText
from schemas.events import (
    DeliverEvent,
    DeliveryError,
    Delta,
    Event,
    GenerationRequest,
    TokenLogprob,
)

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 5.0
_CANCELS_SENDING: set[asyncio.Task[None]] = set()
"""Cancels being sent apart from the stream that asked (a task needs a strong reference)."""
PING_INTERVAL_S = 15.0
SEND_TIMEOUT_S = 30.0
"""A client that reads nothing for this long is treated as gone."""

OnEnd = Callable[[StreamRelay], Awaitable[None]]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class StreamTimers:
    stall_s: float = 30.0
    """No event for this long: the stream ends with `stalled` and is cancelled."""
    grace_s: float = 0.0
    """A dropped stream's generation is held this long for a resume; 0: cancel at once."""
    cancels: bool = True
    """False: a reader only (of a background response): neither a drop nor a stall
    cancels the generation."""


class LiveRequests:
    """The requests this gateway relays right now, by id, for cancels of requests the
    store does not know (OpenAI-compatible ones). Dropped when their stream closes.
    A request is its owner's by (org_id, user_id): the same user id in another org is
    someone else."""

    def __init__(self) -> None:
        self._requests: dict[str, GenerationRequest] = {}

    def add(self, request: GenerationRequest) -> None:
        self._requests[request.request_id] = request

    def discard(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def owned(self, request_id: str, org_id: str, user_id: str) -> GenerationRequest | None:
        """The running request, if it is the user `user_id`'s of org `org_id`."""
        request = self._requests.get(request_id)
        if request is None or (request.org_id, request.user_id) != (org_id, user_id):
            return None
        return request

    def __len__(self) -> int:
        return len(self._requests)


class Generation:
    def __init__(
        self,
        pipeline: Pipeline,
        request_id: str,
        stream: RequestStream,
        relay: StreamRelay | None = None,
        timers: StreamTimers = StreamTimers(),
        live: LiveRequests | None = None,
        on_end: OnEnd | None = None,
        timing: StreamTiming | None = None,
        lease: Lease | None = None,
    ) -> None:
        """`lease`: the generation's place among its key's concurrent requests, held by
        its stream (`LeasedStream`) and released once it ends or is closed."""
        self.request_id = request_id
        self.relay = relay or StreamRelay()
        self._pipeline = pipeline
        self._lease = lease
        self._stream: RequestStream = stream if lease is None else LeasedStream(stream, lease)
        self._timers = timers
        self._live = live
        self._on_end = on_end
        self._closed = False
        self._timing = timing
        OPEN_STREAMS.inc()

    @property
    def finished(self) -> bool:
        """A terminal event (done or error) was received."""
        return self.relay.ended

    async def batches(self) -> AsyncGenerator[list[DeliverEvent]]:
        """Events to show, all that have arrived at once, up to and including the
        terminal one; closes on exit."""
        stall = _StallTimer(self._timers.stall_s)
        losses = self._pipeline.losses
        losses.add(stall)
        try:
            while not self.relay.ended:
                shown: list[DeliverEvent]
                try:
                    arrived = await stall.wait(self._stream.take())
                except StreamLost:
                    log.warning("request %s: the bus lost its answer", self.request_id)
                    shown = [self.relay.lost(self.request_id)]
                except TimeoutError:
                    log.warning(
                        "request %s stalled: no event for %.0f s",
                        self.request_id,
                        self._timers.stall_s,
                    )
                    shown = [self.relay.stall(self.request_id)]
                    if self._timers.cancels:
                        with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
                            await self._cancel("stalled")  # close() will not: the relay ended
                else:
                    if not arrived:
                        return  # the stream went away without an end
                    shown = [e for event in arrived if (e := self.relay.add(event)) is not None]
                if shown and self._timing is not None:
                    self._timing.shown(shown, self.relay.ended)
                if self.relay.ended:
                    if self._lease is not None:  # before the end is shown: the next may start
                        await self._lease.release()
                    await self._ended()
                if shown:
                    yield shown
        finally:
            losses.discard(stall)
            stall.cancel()
            await self.close()

    async def events(self) -> AsyncGenerator[DeliverEvent]:
        """Events to show one at a time, up to and including the terminal one."""
        async with aclosing(self.batches()) as batches:
            async for batch in batches:
                for event in batch:
                    yield event

    async def _ended(self) -> None:
        """Store the answer before its end is shown (read your writes)."""
        if self._on_end is None:
            return
        try:
            await self._on_end(self.relay)
        except Exception:
            log.warning("could not store the end of %s", self.request_id, exc_info=True)

    async def close(self) -> None:
        """Stop listening; unless the answer ended, hold or cancel its generation."""
        if self._closed:
            return
        self._closed = True
        OPEN_STREAMS.dec()
        if self._timing is not None and not self.relay.ended:
            self._timing.ended("abort")
        if self._live is not None:
            self._live.discard(self.request_id)
        if not self.relay.ended and self._timers.grace_s > 0:
            self._pipeline.hold(self.request_id, self._stream, self._timers.grace_s)
            return
        # Runs while the response task is being cancelled: shield it, but bound it.
        with anyio.move_on_after(CLOSE_TIMEOUT_S, shield=True):
            try:
                if not self.relay.ended and self._timers.cancels:
                    await self._cancel("client_disconnected")
            finally:
                await self._stream.aclose()

    async def _cancel(self, reason: str) -> None:
        """Send the cancel from a task of its own. An anyio shield keeps out anyio's
        cancellations, not a native `task.cancel()` (the SSE response's own when the client
        leaves, the stall timer's): one landing in the task that asked must not drop the
        cancel, or the engine generates the whole answer for nobody."""
        sending = asyncio.create_task(self._send_cancel(reason), name=f"cancel:{self.request_id}")
        _CANCELS_SENDING.add(sending)
        sending.add_done_callback(_CANCELS_SENDING.discard)
        await asyncio.shield(sending)

    async def _send_cancel(self, reason: str) -> None:
        try:
            await self._pipeline.cancel(self.request_id, reason=reason)
        except Exception:
            log.warning("could not cancel request %s", self.request_id, exc_info=True)


async def start_generation(
    pipeline: Pipeline, request: GenerationRequest, live: LiveRequests | None = None,
    relay: StreamRelay | None = None, timers: StreamTimers = StreamTimers(),
    on_end: OnEnd | None = None, lease: Lease | None = None,
) -> Generation:  # fmt: skip
    """Submit the request (known to `live` until its stream closes, holding `lease` until
    it ends; its id the response's `x-request-id`); refused `pipeline_unavailable` if the
    pipeline cannot take it (the lease given back)."""
    try:
        stream = await pipeline.submit(request)
    except BaseException as exc:
        if lease is not None:
            await lease.release()
        if isinstance(exc, Refused) or not isinstance(exc, Exception):
            raise
        raise pipeline_unavailable() from exc
    if live is not None:
        live.add(request)
    note_request_id(request.request_id)
    return Generation(pipeline, request.request_id, stream, relay, timers, live, on_end,
                      StreamTiming(request), lease)  # fmt: skip


def event_stream(
    frames: AsyncIterator[bytes], generation: Generation, *others: Generation
) -> EventStreamResponse:
    """The SSE response of `generation` (and `others`: a completion's other choices);
    closing the generations also covers a stream that never started. Its `x-request-id`
    is the generation's (a resumed stream started none here)."""
    note_request_id(generation.request_id)

    async def close() -> None:
        for each in (generation, *others):
            await each.close()

    return EventStreamResponse(
        frames,
        background=BackgroundTask(close),
        ping_s=PING_INTERVAL_S,
        send_timeout_s=SEND_TIMEOUT_S,
    )


def merged_deltas(events: list[DeliverEvent]) -> list[DeliverEvent]:
    """Consecutive deltas as one, with the position (SSE id) of the last: a client that
    resumes after it has all of their text."""
    if len(events) < 2:
        return events
    merged: list[DeliverEvent] = []
    run: list[Delta] = []
    for event in [*events, None]:
        if isinstance(event, Delta):
            run.append(event)
            continue
        if len(run) == 1:
            merged.append(run[0])
        elif run:
            merged.append(
                run[-1].model_copy(
                    update={
                        "text": "".join(d.text for d in run),
                        "logprobs": tuple(entry for d in run for entry in d.logprobs),
                    }
                )
            )
        run = []
        if event is not None:
            merged.append(event)
    return merged


class StreamLost(Exception):
    """The bus lost the stream's answer (`gateway.pipeline.StreamLosses`)."""


class _StallTimer:
    """`wait` raises TimeoutError once nothing has arrived for `stall_s`, and StreamLost
    once `lose()` was called. One timer per stream, moved on lazily when it fires, where
    `asyncio.timeout` around every wait would add and cancel a timer per event
    (thousands of streams, ~10 events/s each)."""

    def __init__(self, stall_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._stall_s = stall_s
        self._last = self._loop.time()
        self._waiting: asyncio.Task[object] | None = None
        self._expired = False
        self._lost = False
        self._handle = self._loop.call_at(self._last + stall_s, self._check)

    def lose(self) -> None:
        self._lost = True
        if self._waiting is not None:
            self._expired = True
            self._waiting.cancel()

    def _check(self) -> None:
        now, due = self._loop.time(), self._last + self._stall_s
        if self._waiting is not None and now >= due:
            self._expired = True
            self._waiting.cancel()
            return
        # Not due yet, or not waiting (a relay busy writing is no stall): look again.
        self._handle = self._loop.call_at(due if due > now else now + self._stall_s, self._check)

    async def wait(self, arrival: Awaitable[T]) -> T:
        """Await `arrival`, for at most `stall_s` (counted from now)."""
        task = asyncio.current_task()
        assert task is not None
        if self._lost:
            if isinstance(arrival, Coroutine):
                arrival.close()
            raise StreamLost
        cancelling = task.cancelling()
        self._waiting, self._last = task, self._loop.time()
        try:
            return await arrival
        except asyncio.CancelledError:
            if self._expired and task.uncancel() <= cancelling:
                self._expired = False
                if self._lost:
                    raise StreamLost from None
                self._handle = self._loop.call_at(self._loop.time() + self._stall_s, self._check)
                raise TimeoutError from None
            raise
        finally:
            self._waiting = None
            self._last = self._loop.time()

    def cancel(self) -> None:
        self._handle.cancel()


async def collected(generation: Generation, request: Request) -> AnswerText:
    """The whole answer, ended by its `DeliveryDone`; a client that disconnects first
    cancels the generation (499), a stream that stops before its end is 502, and an
    answer that failed its pipeline error."""
    [text] = await collected_all([generation], request, [AnswerText()])
    return text


class LoggedAnswerText(AnswerText):
    """An answer's text and its tokens' log probabilities (what a retraction left)."""

    __slots__ = ("logprobs",)

    def __init__(self) -> None:
        super().__init__()
        self.logprobs: list[TokenLogprob] = []

    def add(self, event: Event) -> bool:
        if not super().add(event):
            return False
        if isinstance(event, Delta) and not self.retracted:
            self.logprobs += event.logprobs
        return True


AnswerT = TypeVar("AnswerT", bound=AnswerText)


async def collected_all(
    generations: Sequence[Generation], request: Request, texts: list[AnswerT]
) -> list[AnswerT]:
    """`collected` of several answers at once (a completion's choices), each read into
    its text of `texts`: all of them ended by their `DeliveryDone`, or the error of the
    first that failed (which cancels the others)."""
    disconnected = False
    async with anyio.create_task_group() as listeners:

        async def cancel_on_disconnect() -> None:
            nonlocal disconnected
            await until_disconnected(request)
            disconnected = True
            listeners.cancel_scope.cancel()

        listeners.start_soon(cancel_on_disconnect)
        async with anyio.create_task_group() as readers:
            for generation, text in zip(generations, texts, strict=True):
                readers.start_soon(_read, generation, text, readers.cancel_scope)
        listeners.cancel_scope.cancel()
    for text in texts:
        if isinstance(text.end, DeliveryError):
            raise from_delivery_error(text.end)
    if disconnected:
        raise ApiError(499, "client_disconnected", "the client went away")
    if any(text.end is None for text in texts):
        raise ApiError(502, "stream_interrupted", INTERRUPTED)
    return texts


async def _read(generation: Generation, text: AnswerText, answers: anyio.CancelScope) -> None:
    """Read one answer to its end; a failed one ends the others (`answers`)."""
    async with aclosing(generation.events()) as events:
        await text.read(events)
    if isinstance(text.end, DeliveryError):
        answers.cancel()


INTERRUPTED = "the answer stopped before its end"


async def until_disconnected(request: Request) -> None:
    """Returns when the client disconnects (call once the body has been read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
