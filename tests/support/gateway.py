"""A gateway app on a scripted pipeline: keys, events, a client's requests."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import orjson

from chatpipe.settings import Settings
from chatpipe.wiring import gateway_config
from conversations.answers import answer_started
from conversations.sqlite_store import SQLiteStore
from gateway.app import create_app
from gateway.context.builder import ContextBuilder
from gateway.context.summaries import TITLE_INSTRUCTIONS, is_summary_request
from gateway.context.tokens import TokenCounter
from gateway.deps import GatewayDeps
from gateway.pipeline import Readiness, StreamLosses
from schemas.events import (
    DeliverEvent,
    DeliveryDone,
    Delta,
    FeedbackEvent,
    GenerationRequest,
    ModerationEvent,
    Usage,
    UsageEvent,
)
from schemas.lifecycle import RequestStatus
from schemas.topics import Tier
from tests.support.chat import until

ALICE = {"Authorization": "Bearer key-alice"}
BOB = {"Authorization": "Bearer key-bob"}
REPLY_TO = "chat.deliver.gw-test"
USAGE = Usage(prompt_tokens=7, completion_tokens=2, cached_tokens=3)


def is_background(request: GenerationRequest) -> bool:
    """A title or summary the gateway asks for on its own."""
    return bool(request.messages) and (
        request.messages[0].content == TITLE_INSTRUCTIONS or is_summary_request(request.messages)
    )


class ScriptedStream:
    def __init__(self, request_id: str, events: list[DeliverEvent], hold: bool) -> None:
        self.request_id = request_id
        self._events = [e.model_copy(update={"request_id": request_id}) for e in events]
        self._hold = hold
        self.held = asyncio.Event()
        self.closed = False
        self.events: list[DeliverEvent] = []
        """What it has played so far."""
        self._taking: AsyncIterator[DeliverEvent] | None = None

    @property
    def ended(self) -> bool:
        return len(self.events) == len(self._events) and not self._hold

    async def _play(self) -> AsyncIterator[DeliverEvent]:
        for event in self._events:
            await asyncio.sleep(0)
            self.events.append(event)
            yield event
        if self._hold:
            self.held.set()
            await asyncio.Event().wait()

    def __aiter__(self) -> AsyncIterator[DeliverEvent]:
        return self._play()

    async def take(self) -> list[DeliverEvent]:
        """The next event; [] once the script has played (unless it holds)."""
        if self._taking is None:
            self._taking = self._play()
        try:
            return [await anext(self._taking)]
        except StopAsyncIteration:
            return []

    async def aclose(self) -> None:
        self.closed = True


class ScriptedPipeline:
    def __init__(self) -> None:
        self.scripts: list[tuple[list[DeliverEvent], bool]] = []
        self.submitted: list[GenerationRequest] = []
        self.background: list[GenerationRequest] = []
        """Titles and summaries the gateway asked for, played from `background_scripts`."""
        self.background_scripts: list[tuple[list[DeliverEvent], bool]] = []
        self.streams: list[ScriptedStream] = []
        self.cancelled: list[tuple[str, str]] = []
        self.fail_submit = False
        self.shedding: dict[Tier, float] = {}
        self.started: list[GenerationRequest] = []
        self.followed: list[tuple[str, int]] = []
        self.held: list[tuple[str, float]] = []
        self.holding: dict[str, Any] = {}
        """The streams held now, by request id, until `end_hold`."""
        self.resumed: list[tuple[str, str]] = []
        self.feedback_events: list[FeedbackEvent] = []
        self.usage_events: list[UsageEvent] = []
        self.losses = StreamLosses()
        self.bus_down = False
        self.ready = Readiness(bus=True, schedulers={}, workers={}, model="")

    @property
    def reply_to(self) -> str:
        return REPLY_TO

    def unreachable(self) -> bool:
        return self.bus_down

    def readiness(self, models: Sequence[str], default: str) -> Readiness:
        return self.ready

    def script(self, *events: DeliverEvent, hold: bool = False) -> None:
        self.scripts.append((list(events), hold))

    async def submit(self, request: GenerationRequest) -> ScriptedStream:
        if self.fail_submit:
            raise ConnectionError("broker down")
        if is_background(request):
            self.background.append(request)
            events, hold = self.background_scripts.pop(0) if self.background_scripts else ([], True)
            stream = ScriptedStream(request.request_id, events, hold)
            return stream
        self.submitted.append(request)
        events, hold = self.scripts.pop(0) if self.scripts else ([], True)
        stream = ScriptedStream(request.request_id, events, hold)
        self.streams.append(stream)
        return stream

    async def cancel(self, request_id: str, reason: str = "client_disconnected") -> None:
        await asyncio.sleep(0.01)  # a real cancel is a produce: it yields to the loop
        self.cancelled.append((request_id, reason))

    async def start_answer(self, request: GenerationRequest) -> tuple[int, int]:
        self.started.append(request)
        return 0, len(self.started) - 1

    async def follow(
        self, request_id: str, conversation_id: str, partition: int, offset: int
    ) -> ScriptedStream:
        """The answer's events as chat.answers holds them: its marker, then what its
        script played so far (all of it once the stream ended)."""
        [request] = [r for r in self.started if r.request_id == request_id]
        played = next(s for s in self.streams if s.request_id == request_id)
        events = [answer_started(request), *played.events]
        self.followed.append((request_id, offset))
        return ScriptedStream(request_id, events, hold=not played.ended)

    def hold(self, request_id: str, stream: ScriptedStream, grace_s: float) -> None:
        self.held.append((request_id, grace_s))
        self.holding[request_id] = stream

    async def end_hold(self, request_id: str) -> None:
        """The hold of `request_id` ends (its grace ran out, or it was resumed): the
        held stream is closed, as the Kafka pipeline's is."""
        await self.holding.pop(request_id).aclose()

    async def announce_resume(self, request_id: str, held_by: str) -> None:
        self.resumed.append((request_id, held_by))

    async def feedback(self, event: FeedbackEvent) -> None:
        self.feedback_events.append(event)

    async def usage(self, event: UsageEvent) -> None:
        self.usage_events.append(event)

    def overloaded(self, tier: Tier, model: str) -> float | None:
        return self.shedding.get(tier)


def delta(text: str, seq: int) -> Delta:
    return Delta(request_id="-", seq=seq, text=text)


def done(seq: int, status: RequestStatus = RequestStatus.FINISHED_STOPPED) -> DeliveryDone:
    return DeliveryDone(request_id="-", seq=seq, status=status, usage=USAGE)


class WordTokenizer:
    """One token per word; no chat template (TokenCounter renders `role: content`)."""

    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [0] * len(text.split())


def word_context(settings: Settings) -> ContextBuilder:
    """The deployment's context policy, counting words instead of loading a tokenizer."""
    built = ContextBuilder.from_config(gateway_config(settings).context)
    return ContextBuilder(
        system_prompt=settings.context.system_prompt,
        policy=built.policy,
        counter=lambda model: TokenCounter(WordTokenizer()),
    )


def gateway_deps(
    settings: Settings,
    store: SQLiteStore,
    pipeline: ScriptedPipeline,
    context: ContextBuilder | None = None,
    **options: Any,
) -> GatewayDeps:
    """What the wiring gives the gateway under `settings`, around a test's store,
    pipeline and (word-counting) context builder; `reply_wait_s` replaces the config's."""
    config = gateway_config(settings)
    if "reply_wait_s" in options:
        config = dataclasses.replace(config, reply_wait_s=options.pop("reply_wait_s"))
    return GatewayDeps(config, store, pipeline,
                       context if context is not None else word_context(settings),
                       **options)  # fmt: skip


async def new_conversation(client: httpx.AsyncClient, headers=ALICE) -> str:
    response = await client.post("/v1/conversations", json={"title": "t"}, headers=headers)
    assert response.status_code == 201, response.text
    return response.json()["conversation_id"]


def assert_error(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == code
    assert body["error"]["message"] and body["error"]["type"]
    return body["error"]


def post_scope(path: str, key: str) -> dict:
    """The ASGI scope of a JSON `POST` to `path` with API key `key`."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "client": ("127.0.0.1", 5000),
        "server": ("test", 80),
        "headers": [
            (b"host", b"test"),
            (b"authorization", f"Bearer {key}".encode()),
            (b"content-type", b"application/json"),
        ],
    }


async def disconnect_after_hold(app, pipeline, path: str, body: dict) -> list[dict]:
    """Drive the app over raw ASGI; disconnect once the scripted events are all out."""
    sent: list[dict] = []
    first_receive = True

    async def receive() -> dict:
        nonlocal first_receive
        if first_receive:
            first_receive = False
            return {"type": "http.request", "body": orjson.dumps(body), "more_body": False}
        await until(lambda: pipeline.streams, timeout_s=None, interval_s=0.01)
        await pipeline.streams[-1].held.wait()
        await asyncio.sleep(0.05)  # let the last event reach the client
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = post_scope(path, "key-alice")
    await asyncio.wait_for(app(scope, receive, send), timeout=5)
    return sent


@contextlib.asynccontextmanager
async def app_client(settings: Settings, store, pipeline: ScriptedPipeline, **options: Any
                     ) -> AsyncIterator[tuple[httpx.AsyncClient, GatewayDeps]]:  # fmt: skip
    """A client of an app on other settings than the fixtures' (`options`: more of what
    `gateway_deps` takes)."""
    deps = gateway_deps(settings, store, pipeline, reply_wait_s=0.3, **options)
    transport = httpx.ASGITransport(create_app(deps))
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client, deps
    finally:
        await deps.background.close()


class ModeratedPipeline(ScriptedPipeline):
    def __init__(self) -> None:
        super().__init__()
        self.moderated: list[ModerationEvent] = []

    async def moderate(self, event: ModerationEvent) -> None:
        self.moderated.append(event)
