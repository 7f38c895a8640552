"""The response cache in front of the pipeline: a `Pipeline` whose `submit` answers a
cacheable request of an opted-in org from the conversation store, with no queueing, no
scheduler slot and no GPU time, and keeps the answer of one it had to queue.

The rules are `gateway.cache.rules`'s; the key has the request's output policy, from the
same safety policy the gateway's settings make for the safety stage
(`SafetyPolicy.output_policy`). The entries live in the conversation store
(`put_cached_response`), shared by every gateway. Admission (rate limits, budgets, input
safety) runs before `submit`, so a hit is charged to the rate limits like any request.

A hit is replayed by a `ReplayStream`: the kept text in deltas paced at the configured
tokens/s, then the end, marked `cache: "hit"`. A stored (native) answer's replay is also
written whole after its marker on `chat.answers`, as the safety stage writes any answer,
so a client can resume it on any gateway and the recorder stores it if the client
leaves; its usage goes on `chat.usage` (worker `response-cache`, no GPU time), so
billing charges its tokens as the answer's and analytics counts the hit. A miss is
relayed through a `FillingStream`, which marks its end `cache: "miss"` and, when the
answer ended whole (stop or length, nothing retracted, the model asked for), keeps it
before the end is shown. A store that fails or is slow never fails a request: the
lookup counts as not cacheable, the fill is skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

import anyio

from conversations.store import CachedResponse, ConversationStore
from gateway.cache.rules import cache_key, entry_to_keep, marked_miss, refusal, replay
from gateway.config import ResponseCacheConfig
from gateway.pipeline import Pipeline, Readiness, RequestStream, StreamLosses
from ops.metrics import RESPONSE_CACHE_FILLS, RESPONSE_CACHE_LOOKUPS
from schemas.answer import AnswerText
from schemas.events import (
    DeliverEvent,
    DeliveryDone,
    Event,
    FeedbackEvent,
    GenerationRequest,
    ModerationEvent,
    Routed,
    UsageEvent,
)
from schemas.lifecycle import RequestStatus
from schemas.topics import Tier

log = logging.getLogger(__name__)

T = TypeVar("T")
D = TypeVar("D")
STORE_TIMEOUT_S = 2.0
"""The most a lookup or a fill waits for the store; past it the cache is skipped."""
REPLAY_WORKER = "response-cache"
OutputPolicy = Callable[[Tier, str], str]
"""(tier, model) -> the output check their answers get (`SafetyPolicy.output_policy`)."""


class ReplayRecorder(Protocol):
    async def record_replay(
        self, request: GenerationRequest, events: list[DeliverEvent], usage: UsageEvent
    ) -> None:
        """Write a replayed answer where a generated one would be: its events on
        `chat.answers` (a stored request only) and its usage on `chat.usage`."""


class CachedPipeline:
    """`Pipeline` over `inner`, with the response cache in front of `submit`."""

    def __init__(
        self,
        inner: Pipeline,
        recorder: ReplayRecorder,
        store: ConversationStore,
        config: ResponseCacheConfig,
        output_policy: OutputPolicy,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._inner = inner
        self._recorder = recorder
        self._store = store
        self._config = config
        self._output_policy = output_policy
        self._clock = clock
        self._replays: dict[str, ReplayStream] = {}

    async def submit(self, request: GenerationRequest) -> RequestStream:
        key = await self._lookup_key(request)
        if key is None:
            return await self._inner.submit(request)
        entry = await _bounded(
            self._store.get_cached_response(key, request.org_id),
            None,
            f"looking up {request.request_id} in the response cache",
        )
        labels = (request.tier.value, request.model)
        if entry is None:
            RESPONSE_CACHE_LOOKUPS.labels(*labels, "miss").inc()
            return FillingStream(
                await self._inner.submit(request),
                request,
                lambda text, model: self._keep(request, key, text, model),
            )
        RESPONSE_CACHE_LOOKUPS.labels(*labels, "hit").inc()
        return await self._replay(request, entry)

    async def _lookup_key(self, request: GenerationRequest) -> str | None:
        """The request's cache key if the cache may answer it and its org opted in (the
        output policy is digested only then)."""
        if refusal(request, self._config.system_prompt) is not None:
            return None
        settings = await _bounded(
            self._store.get_org_settings(request.org_id),
            None,
            f"reading org {request.org_id}'s settings",
        )
        if settings is None or not settings.response_cache:
            return None
        policy = self._output_policy(request.tier, request.model)
        return cache_key(request, self._config.system_prompt, output_policy=policy)

    async def _replay(self, request: GenerationRequest, entry: CachedResponse) -> RequestStream:
        timed = replay(request, entry, self._config.tokens_per_s, self._config.chunk_s)
        usage = UsageEvent(
            request_id=request.request_id, conversation_id=request.conversation_id,
            user_id=request.user_id, org_id=request.org_id, tier=request.tier,
            model=entry.model, worker_id=REPLAY_WORKER, status=entry.status,
            prompt_tokens=entry.prompt_tokens, completion_tokens=entry.completion_tokens,
            cached_tokens=entry.prompt_tokens, gpu_ms=0.0, cache="hit")  # fmt: skip
        try:
            await self._recorder.record_replay(request, [event for _, event in timed], usage)
        except Exception:  # the client still gets its answer; the gateway stores it
            log.warning("could not record the replay of %s", request.request_id, exc_info=True)
        stream = ReplayStream(timed, request.request_id)
        self._replays[request.request_id] = stream
        stream.on_close = lambda: self._replays.pop(request.request_id, None)
        return stream

    async def _keep(
        self, request: GenerationRequest, key: str, text: AnswerText, answered_by: str
    ) -> None:
        now = self._clock()
        entry = entry_to_keep(request, key, text, answered_by, now, self._config.ttl_s)
        if entry is None:
            return
        kept = await _bounded(
            self._store.put_cached_response(entry),
            False,
            f"keeping {request.request_id} in the response cache",
        )
        if kept is not False:
            RESPONSE_CACHE_FILLS.labels(request.tier.value, request.model).inc()

    # --- the rest is the inner pipeline's, but for replays ------------------------------

    @property
    def reply_to(self) -> str:
        return self._inner.reply_to

    async def start_answer(self, request: GenerationRequest) -> tuple[int, int]:
        return await self._inner.start_answer(request)

    async def follow(
        self, request_id: str, conversation_id: str, partition: int, offset: int
    ) -> RequestStream:
        return await self._inner.follow(request_id, conversation_id, partition, offset)

    async def cancel(self, request_id: str, reason: str = "client_disconnected") -> None:
        replaying = self._replays.get(request_id)
        if replaying is not None:
            replaying.stop()
            return
        await self._inner.cancel(request_id, reason)

    def hold(self, request_id: str, stream: RequestStream, grace_s: float) -> None:
        if isinstance(stream, ReplayStream):
            stream.close()  # written whole on chat.answers: the recorder stores it
            return
        self._inner.hold(request_id, stream, grace_s)

    async def announce_resume(self, request_id: str, held_by: str) -> None:
        await self._inner.announce_resume(request_id, held_by)

    async def moderate(self, event: ModerationEvent) -> None:
        await self._inner.moderate(event)

    async def feedback(self, event: FeedbackEvent) -> None:
        await self._inner.feedback(event)

    async def usage(self, event: UsageEvent) -> None:
        await self._inner.usage(event)

    def overloaded(self, tier: Tier, model: str) -> float | None:
        return self._inner.overloaded(tier, model)

    @property
    def losses(self) -> StreamLosses:
        return self._inner.losses

    def unreachable(self) -> bool:
        return self._inner.unreachable()

    def readiness(self, models: Sequence[str], default: str) -> Readiness:
        return self._inner.readiness(models, default)


async def _bounded(work: Awaitable[T], failed: D, what: str) -> T | D:
    """`work`, or `failed` if it raises or takes over `STORE_TIMEOUT_S` (logged: the
    request goes on without the cache)."""
    try:
        with anyio.fail_after(STORE_TIMEOUT_S):
            return await work
    except Exception:
        log.warning("%s failed; going on without the cache", what, exc_info=True)
        return failed


class ReplayStream:
    """A cached answer's events, each shown at its time (seconds after the stream was
    made): `take` waits for the next one due and returns all that are due, so a slow
    reader catches up in one take. `stop` ends it at once with `finished_aborted`."""

    def __init__(self, timed: list[tuple[float, DeliverEvent]], request_id: str) -> None:
        loop = asyncio.get_running_loop()
        self.request_id = request_id
        self._clock = loop.time
        self._start = loop.time()
        self._pending = deque(timed)
        self._next_seq = 0
        self._stopped = asyncio.Event()
        self.on_close: Callable[[], object] | None = None

    async def take(self) -> list[Event]:
        if not self._pending:
            return []
        delay = self._start + self._pending[0][0] - self._clock()
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), delay)
        if self._stopped.is_set():
            return self._aborted()
        due: list[Event] = []
        now = self._clock() - self._start
        while self._pending and self._pending[0][0] <= now:
            event = self._pending.popleft()[1]
            self._next_seq = event.seq + 1
            due.append(event)
        if not self._pending:
            self.close()
        return due

    def _aborted(self) -> list[Event]:
        """The end of a stopped replay: aborted after what was shown."""
        done = next((e for _, e in reversed(self._pending) if isinstance(e, DeliveryDone)), None)
        self._pending.clear()
        self.close()
        if done is None:
            return []
        usage = done.usage.model_copy(update={"completion_tokens": 0})
        return [
            done.model_copy(
                update={
                    "seq": self._next_seq,
                    "usage": usage,
                    "status": RequestStatus.FINISHED_ABORTED,
                }
            )
        ]

    def stop(self) -> None:
        """Stop (the client pressed Stop): the next take ends the answer, aborted."""
        self._stopped.set()

    def close(self) -> None:
        """Forget it (it ended, or its client left: nothing more is shown)."""
        if self.on_close is not None:
            self.on_close()
            self.on_close = None

    async def aclose(self) -> None:
        self._pending.clear()
        self.close()

    async def __aiter__(self) -> AsyncIterator[Event]:
        while events := await self.take():
            for event in events:
                yield event


Keep = Callable[[AnswerText, str], Awaitable[None]]


class FillingStream:
    """A queued request's stream, watched: its end is marked `cache: "miss"`, and once the
    answer has ended `keep(text, model that answered)` runs before the end is shown."""

    def __init__(self, inner: RequestStream, request: GenerationRequest, keep: Keep) -> None:
        self._inner = inner
        self._text = AnswerText()
        self._model = request.model
        self._keep: Keep | None = keep

    async def take(self) -> list[Event]:
        return [await self._watched(event) for event in await self._inner.take()]

    async def _watched(self, event: Event) -> Event:
        if not self._text.add(event):
            return event
        if isinstance(event, Routed):
            self._model = event.model
        if isinstance(event, DeliveryDone):
            self._model = event.model or self._model
            event = marked_miss(event)
        if self._text.log.ended and self._keep is not None:
            keep, self._keep = self._keep, None
            await keep(self._text, self._model)
        return event

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aiter__(self) -> AsyncIterator[Event]:
        while events := await self.take():
            for event in events:
                yield event
