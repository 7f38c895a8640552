"""The gateway's HTTP layer in process: real SQLite store, scripted pipeline.

`ScriptedPipeline` implements `gateway.pipeline.Pipeline`: each submit plays
the next script of delivery events, then ends or (hold=True) stays open the
way a generation still running does. Disconnects are driven through the raw
ASGI interface, since httpx's ASGITransport only reports a disconnect once the
response is complete.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from chatpipe.settings import Settings
from chatpipe.wiring import gateway_config
from conversations.answers import answer_started
from conversations.sqlite_store import SQLiteStore
from conversations.store import NewMessage, RequestRecord
from gateway.app import create_app
from gateway.context.builder import ContextBuilder
from gateway.context.summaries import SUMMARY_INSTRUCTIONS, TITLE_INSTRUCTIONS
from gateway.context.tokens import TokenCounter
from gateway.deps import GatewayDeps
from schemas import sse
from schemas.events import (
    DeliverEvent,
    DeliveryDone,
    DeliveryError,
    Delta,
    FeedbackEvent,
    GenerationRequest,
    Queued,
    Retract,
    Role,
    Usage,
    UsageEvent,
)
from schemas.lifecycle import RequestStatus
from schemas.topics import Tier

ALICE = {"Authorization": "Bearer key-alice"}
BOB = {"Authorization": "Bearer key-bob"}
REPLY_TO = "chat.deliver.gw-test"
USAGE = Usage(prompt_tokens=7, completion_tokens=2, cached_tokens=3)


def is_background(request: GenerationRequest) -> bool:
    """A title or summary the gateway asks for on its own."""
    return bool(request.messages) and request.messages[0].content in (
        TITLE_INSTRUCTIONS,
        SUMMARY_INSTRUCTIONS,
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
        self.resumed: list[tuple[str, str]] = []
        self.feedback_events: list[FeedbackEvent] = []
        self.usage_events: list[UsageEvent] = []

    @property
    def reply_to(self) -> str:
        return REPLY_TO

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


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        model_name="tiny",
        max_message_chars=50,
        default_max_tokens=16,
        max_tokens_limit=100,
        request_timeout_s=30.0,
        database_path=tmp_path / "chat.db",
    )


@pytest.fixture
def pipeline() -> ScriptedPipeline:
    return ScriptedPipeline()


class WordTokenizer:
    """One token per word; no chat template (TokenCounter renders `role: content`)."""

    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [0] * len(text.split())


def word_context(settings: Settings) -> ContextBuilder:
    """The deployment's context policy, counting words instead of loading a tokenizer."""
    built = ContextBuilder.from_config(gateway_config(settings).context)
    return ContextBuilder(
        system_prompt=settings.system_prompt,
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


@pytest.fixture
def deps(settings: Settings, store: SQLiteStore, pipeline: ScriptedPipeline) -> GatewayDeps:
    return gateway_deps(settings, store, pipeline, reply_wait_s=0.3)


@pytest.fixture
async def app(deps: GatewayDeps):
    yield create_app(deps)
    await deps.background.close()  # the app's lifespan does this; ASGITransport runs none


@pytest.fixture
async def client(app) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client


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


# --- auth and errors ------------------------------------------------------------------


async def test_healthz_needs_no_key(client):
    response = await client.get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Basic a2V5"}, {"Authorization": "Bearer "}]
)
async def test_missing_key_is_401(client, headers):
    for method, path in [("get", "/v1/models"), ("post", "/v1/conversations")]:
        response = await client.request(method, path, headers=headers, json={})
        error = assert_error(response, 401, "missing_api_key")
        assert error["type"] == "authentication_error"
        assert response.headers["www-authenticate"] == "Bearer"


async def test_unknown_key_is_401(client):
    response = await client.get("/v1/models", headers={"Authorization": "Bearer nope"})
    assert_error(response, 401, "invalid_api_key")


async def test_malformed_json_is_400(client):
    cid = await new_conversation(client)
    response = await client.post(
        f"/v1/conversations/{cid}/messages",
        content=b'{"content": "hi"',
        headers={**ALICE, "Content-Type": "application/json"},
    )
    assert_error(response, 400, "invalid_json")
    response = await client.post(
        "/v1/chat/completions", content=b"[[", headers={**ALICE, "Content-Type": "application/json"}
    )
    assert_error(response, 400, "invalid_json")


async def test_invalid_fields_are_422_naming_the_field(client):
    cid = await new_conversation(client)
    response = await client.post(f"/v1/conversations/{cid}/messages", json={}, headers=ALICE)
    assert assert_error(response, 422, "invalid_request")["param"] == "content"
    response = await client.post(
        f"/v1/conversations/{cid}/messages",
        json={"content": "hi", "temperature": 9},
        headers=ALICE,
    )
    assert assert_error(response, 422, "invalid_request")["param"] == "temperature"
    response = await client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "robot", "content": "x"}]},
        headers=ALICE,
    )
    assert assert_error(response, 422, "invalid_request")["param"] == "messages.0.role"


async def test_unknown_route_uses_the_error_shape(client):
    assert_error(await client.get("/nowhere"), 404, "not_found")


async def test_unknown_and_foreign_conversations_are_404(client, pipeline):
    bobs = await new_conversation(client, BOB)
    for cid in ["missing", bobs]:
        assert_error(
            await client.get(f"/v1/conversations/{cid}", headers=ALICE),
            404,
            "conversation_not_found",
        )
        response = await client.post(
            f"/v1/conversations/{cid}/messages", json={"content": "hi"}, headers=ALICE
        )
        assert_error(response, 404, "conversation_not_found")
    assert (await client.get(f"/v1/conversations/{bobs}", headers=BOB)).status_code == 200
    assert pipeline.submitted == []


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"content": "hi", "model": "gpt-9"}, 404, "model_not_found"),
        ({"content": ""}, 400, "empty_message"),
        ({"content": "  \n "}, 400, "empty_message"),
        ({"content": "x" * 51}, 413, "message_too_long"),
        ({"content": "hi", "max_tokens": 101}, 422, "max_tokens_too_large"),
        ({"content": "hi", "max_tokens": 0}, 422, "invalid_request"),
    ],
)
async def test_rejected_messages_are_not_stored_or_sent(
    client, store, pipeline, body, status, code
):
    cid = await new_conversation(client)
    response = await client.post(f"/v1/conversations/{cid}/messages", json=body, headers=ALICE)
    assert_error(response, status, code)
    assert await store.list_messages(cid) == []
    assert pipeline.submitted == []


async def test_shedding_tier_is_503_with_retry_after_before_anything_is_stored(
    client, store, pipeline
):
    cid = await new_conversation(client)
    pipeline.shedding[Tier.PRO] = 7.2
    response = await client.post(
        f"/v1/conversations/{cid}/messages", json={"content": "hi"}, headers=ALICE
    )
    assert_error(response, 503, "overloaded")
    assert response.headers["retry-after"] == "8"
    assert await store.list_messages(cid) == []
    completion = await client.post(
        "/v1/chat/completions",
        headers=ALICE,
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert_error(completion, 503, "overloaded")
    assert pipeline.submitted == []
    pipeline.shedding.clear()
    pipeline.script(done(0))
    assert (
        await client.post(
            f"/v1/conversations/{cid}/messages", json={"content": "hi"}, headers=ALICE
        )
    ).status_code == 200


# --- native API -----------------------------------------------------------------------


async def test_conversation_round_trip(client, store):
    cid = await new_conversation(client)
    await store.add_message(NewMessage("m1", cid, Role.USER, "hello"))
    response = await client.get(f"/v1/conversations/{cid}", headers=ALICE)
    assert response.status_code == 200
    body = response.json()
    assert body["conversation_id"] == cid and body["title"] == "t"
    assert [(m["message_id"], m["role"], m["content"]) for m in body["messages"]] == [
        ("m1", "user", "hello")
    ]


async def test_native_stream_wire_format(client, store, pipeline):
    cid = await new_conversation(client)
    pipeline.script(
        Queued(request_id="-", position=2, eta_ms=300),
        delta("Hel", 0),
        delta("lo\n", 1),
        done(2),
    )
    response = await client.post(
        f"/v1/conversations/{cid}/messages", json={"content": "hi", "seed": 3}, headers=ALICE
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    [request] = pipeline.submitted
    user, answer = await store.list_messages(cid)
    assert (answer.content, answer.status) == ("Hello\n", RequestStatus.FINISHED_STOPPED), (
        "stored before the end was sent"
    )
    opened = json.dumps(
        {
            "request_id": request.request_id,
            "message_id": request.message_id,
            "user_message_id": user.message_id,
        },
        separators=(",", ":"),
    )
    usage = '{"prompt_tokens":7,"completion_tokens":2,"cached_tokens":3}'
    assert response.text == (
        f"event: request\ndata: {opened}\n\n"
        'event: queued\ndata: {"position":2,"eta_ms":300}\n\n'
        'id: 0\nevent: delta\ndata: {"delta":"Hel"}\n\n'
        'id: 1\nevent: delta\ndata: {"delta":"lo\\n"}\n\n'
        'id: 2\nevent: done\ndata: {"finish_reason":"stop","status":"finished_stopped",'
        f'"usage":{usage}}}\n\n'
        "data: [DONE]\n\n"
    )
    assert response.headers["x-request-id"] == request.request_id
    assert pipeline.cancelled == []


async def test_native_request_carries_owner_and_prompt(client, store, pipeline, settings):
    cid = await new_conversation(client)
    pipeline.script(done(0))
    await client.post(
        f"/v1/conversations/{cid}/messages",
        json={"content": "hi", "temperature": 0, "max_tokens": 5},
        headers=ALICE,
    )
    [request] = pipeline.submitted
    user, answer = await store.list_messages(cid)
    assert (user.role, user.content, user.parent_id) == (Role.USER, "hi", None)
    assert (answer.message_id, answer.parent_id, answer.request_id) == (
        request.message_id,
        user.message_id,
        request.request_id,
    )
    record = await store.get_request(request.request_id)
    assert record is not None and (record.user_id, record.reply_to) == ("alice", REPLY_TO)
    assert pipeline.started == [request], "the marker on chat.answers comes first"
    assert request.conversation_id == cid and request.parent_id == user.message_id
    assert (request.user_id, request.org_id, request.tier) == ("alice", "org-a", Tier.PRO)
    assert request.cache_salt == "org-a" and request.reply_to == REPLY_TO and request.store
    assert request.model == "tiny"
    assert [(m.role, m.content) for m in request.messages] == [
        (Role.SYSTEM, settings.system_prompt),
        (Role.USER, "hi"),
    ]
    assert (request.sampling.max_tokens, request.sampling.temperature) == (5, 0.0)
    assert request.deadline == pytest.approx(request.created_at + settings.request_timeout_s, 1)
    assert request.message_id not in (user.message_id, request.request_id)


async def test_the_answer_is_stored_when_its_end_arrives_and_the_next_turn_sees_it(
    client, store, pipeline
):
    cid = await new_conversation(client)
    pipeline.script(delta("yo", 0), done(1))
    pipeline.script(done(0))
    await client.post(f"/v1/conversations/{cid}/messages", json={"content": "hi"}, headers=ALICE)
    first = pipeline.submitted[0]
    shown = (await client.get(f"/v1/conversations/{cid}", headers=ALICE)).json()
    assert [(m["content"], m["status"]) for m in shown["messages"]] == [
        ("hi", "finished_stopped"),
        ("yo", "finished_stopped"),
    ]
    response = await client.post(
        f"/v1/conversations/{cid}/messages", json={"content": "again"}, headers=ALICE
    )
    assert response.status_code == 200
    second = pipeline.submitted[1]
    assert [(m.role, m.content) for m in second.messages] == [
        (Role.SYSTEM, "You are a helpful assistant."),
        (Role.USER, "hi"),
        (Role.ASSISTANT, "yo"),
        (Role.USER, "again"),
    ]
    messages = await store.list_messages(cid)
    assert messages[2].parent_id == first.message_id


async def test_a_turn_while_the_previous_answer_streams_waits_then_is_409(
    client, store, pipeline, deps
):
    cid = await new_conversation(client)
    pipeline.script(done(0))
    await client.post(f"/v1/conversations/{cid}/messages", json={"content": "hi"}, headers=ALICE)
    first = pipeline.submitted[0]
    user, answer = await store.list_messages(cid)
    # Another answer to the same message, still streaming (say, on another gateway).
    streaming = NewMessage(
        "m2",
        cid,
        Role.ASSISTANT,
        "",
        parent_id=user.message_id,
        status=RequestStatus.IN_PROGRESS,
        request_id="r2",
    )
    await store.start_answer(streaming, RequestRecord("r2", cid, "m2", "alice", 0, 9, REPLY_TO))
    started = asyncio.get_running_loop().time()
    response = await client.post(
        f"/v1/conversations/{cid}/messages", json={"content": "again"}, headers=ALICE
    )
    assert_error(response, 409, "reply_pending")
    assert asyncio.get_running_loop().time() - started >= deps.config.reply_wait_s
    assert len(pipeline.submitted) == 1 and len(await store.list_messages(cid)) == 3

    async def finish_soon() -> None:
        await asyncio.sleep(0.1)
        await store.finish_answer(
            dataclasses.replace(streaming, content="ok", status=RequestStatus.FINISHED_STOPPED)
        )

    pipeline.script(done(0))
    finishing = asyncio.create_task(finish_soon())
    response = await client.post(
        f"/v1/conversations/{cid}/messages", json={"content": "again"}, headers=ALICE
    )
    await finishing
    assert response.status_code == 200, "waits for the answer to end, then goes on"
    assert [m.content for m in pipeline.submitted[1].messages][-2:] == ["ok", "again"]
    assert first.message_id != "m2"


async def test_a_store_read_that_hangs_does_not_hold_a_turn_past_the_wait(
    client, store, pipeline, deps, monkeypatch
):
    cid = await new_conversation(client)
    pipeline.script(done(0))
    await client.post(f"/v1/conversations/{cid}/messages", json={"content": "hi"}, headers=ALICE)
    user, _ = await store.list_messages(cid)
    streaming = NewMessage(
        "m2",
        cid,
        Role.ASSISTANT,
        "",
        parent_id=user.message_id,
        status=RequestStatus.IN_PROGRESS,
        request_id="r2",
    )
    await store.start_answer(streaming, RequestRecord("r2", cid, "m2", "alice", 0, 9, REPLY_TO))

    async def hangs(message_id: str):
        await asyncio.sleep(3600)

    monkeypatch.setattr(store, "get_message", hangs)
    started = asyncio.get_running_loop().time()
    response = await client.post(
        f"/v1/conversations/{cid}/messages", json={"content": "again"}, headers=ALICE
    )
    assert_error(response, 409, "reply_pending")
    assert asyncio.get_running_loop().time() - started < deps.config.reply_wait_s + 2


async def test_failed_submit_records_a_failed_answer(client, store, pipeline):
    cid = await new_conversation(client)
    pipeline.fail_submit = True
    response = await client.post(
        f"/v1/conversations/{cid}/messages", json={"content": "hi"}, headers=ALICE
    )
    assert_error(response, 503, "pipeline_unavailable")
    user, answer = await store.list_messages(cid)
    assert answer.parent_id == user.message_id and answer.status == RequestStatus.FINISHED_ERROR
    pipeline.fail_submit = False
    pipeline.script(done(0))
    response = await client.post(
        f"/v1/conversations/{cid}/messages", json={"content": "again"}, headers=ALICE
    )
    assert response.status_code == 200


async def test_native_error_and_retract_events(client, pipeline):
    cid = await new_conversation(client)
    pipeline.script(
        delta("bad", 0),
        Retract(request_id="-", seq=1, message_id="m", reason="policy", replacement="[removed]"),
        DeliveryError(request_id="-", seq=2, code="overloaded", message="busy", retry_after=5),
    )
    response = await client.post(
        f"/v1/conversations/{cid}/messages", json={"content": "hi"}, headers=ALICE
    )
    messages = sse.parse_messages(response.text)
    assert [(m.event, m.id) for m in messages] == [
        ("request", None),
        ("delta", "0"),
        ("retract", "1"),
        ("error", "2"),
        (None, None),
    ]
    assert json.loads(messages[2].data) == {
        "message_id": "m",
        "reason": "policy",
        "replacement": "[removed]",
    }
    assert json.loads(messages[3].data) == {
        "code": "overloaded",
        "message": "busy",
        "retry_after": 5,
    }
    assert messages[-1].is_done
    assert pipeline.cancelled == []


async def test_native_stream_cut_short_reports_and_is_held_for_a_resume(client, pipeline, settings):
    cid = await new_conversation(client)
    pipeline.script(delta("a", 0))  # ends without done: e.g. the gateway is stopping
    response = await client.post(
        f"/v1/conversations/{cid}/messages", json={"content": "hi"}, headers=ALICE
    )
    messages = sse.parse_messages(response.text)
    assert [m.event for m in messages] == ["request", "delta", "error", None]
    assert json.loads(messages[2].data)["code"] == "stream_interrupted"
    assert pipeline.cancelled == []
    assert pipeline.held == [(pipeline.submitted[0].request_id, settings.resume_grace_s)]


# --- OpenAI-compatible API ------------------------------------------------------------


@pytest.fixture
async def sdk(app) -> AsyncIterator[openai.AsyncOpenAI]:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app))
    async with openai.AsyncOpenAI(
        base_url="http://test/v1", api_key="key-alice", http_client=http, max_retries=0
    ) as client:
        yield client


async def test_models_list(sdk):
    models = await sdk.models.list()
    assert [m.id for m in models.data] == ["tiny"]


async def test_openai_non_stream(sdk, pipeline, store):
    pipeline.script(delta("Hel", 0), delta("lo", 1), done(2, RequestStatus.FINISHED_LENGTH))
    completion = await sdk.chat.completions.create(
        model="tiny",
        messages=[
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ],
        max_completion_tokens=9,
        stop="\n",
        temperature=0.5,
    )
    [request] = pipeline.submitted
    assert completion.id == f"chatcmpl-{request.request_id}"
    assert completion.choices[0].message.content == "Hello"
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage.total_tokens == 9
    assert completion.usage.prompt_tokens_details.cached_tokens == 3
    assert not request.store and request.parent_id is None
    assert await store.get_conversation(request.conversation_id) is None
    assert [(m.role, m.content) for m in request.messages] == [
        (Role.SYSTEM, "be brief"),
        (Role.USER, "hi"),
    ]
    assert request.sampling.max_tokens == 9 and request.sampling.stop == ("\n",)
    assert pipeline.cancelled == []


async def test_openai_stream_with_usage(sdk, pipeline):
    pipeline.script(Queued(request_id="-", position=1), delta("Hel", 0), delta("lo", 1), done(2))
    stream = await sdk.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello"
    assert [c.choices[0].finish_reason for c in chunks[:-1]] == [None, None, None, "stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 2
    assert all(c.usage is None for c in chunks[:-1])
    assert len({c.id for c in chunks}) == 1


async def test_openai_stream_raw_ends_with_done(client, pipeline):
    pipeline.script(delta("a", 0), done(1))
    response = await client.post(
        "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True},
        headers=ALICE,
    )
    messages = sse.parse_messages(response.text)
    assert messages[-1].is_done and all(m.event is None for m in messages)
    chunks = [orjson.loads(m.data) for m in messages[:-1]]
    assert [c["choices"][0]["delta"].get("content") for c in chunks] == ["", "a", None]
    assert all(c["usage"] is None for c in chunks)  # no usage chunk unless asked for


async def test_openai_errors(sdk, pipeline):
    with pytest.raises(openai.NotFoundError) as missing:
        await sdk.chat.completions.create(
            model="gpt-9", messages=[{"role": "user", "content": "x"}]
        )
    assert missing.value.code == "model_not_found"
    pipeline.script(DeliveryError(request_id="-", code="overloaded", message="busy", retry_after=4))
    with pytest.raises(openai.InternalServerError) as shed:
        await sdk.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
    assert shed.value.status_code == 503 and shed.value.response.headers["retry-after"] == "4"
    pipeline.script(
        delta("a", 0), DeliveryError(request_id="-", seq=1, code="engine", message="boom")
    )
    stream = await sdk.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "x"}], stream=True
    )
    with pytest.raises(openai.APIError, match="boom"):
        async for _ in stream:
            pass
    pipeline.fail_submit = True
    with pytest.raises(openai.InternalServerError) as down:
        await sdk.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}])
    assert down.value.status_code == 503 and down.value.code == "pipeline_unavailable"


# --- client disconnect cancels the generation -----------------------------------------


async def disconnect_after_hold(app, pipeline, path: str, body: dict) -> list[dict]:
    """Drive the app over raw ASGI; disconnect once the scripted events are all out."""
    sent: list[dict] = []
    first_receive = True

    async def receive() -> dict:
        nonlocal first_receive
        if first_receive:
            first_receive = False
            return {"type": "http.request", "body": orjson.dumps(body), "more_body": False}
        while not pipeline.streams:
            await asyncio.sleep(0.01)
        await pipeline.streams[-1].held.wait()
        await asyncio.sleep(0.05)  # let the last event reach the client
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
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
            (b"authorization", b"Bearer key-alice"),
            (b"content-type", b"application/json"),
        ],
    }
    await asyncio.wait_for(app(scope, receive, send), timeout=5)
    return sent


def body_text(sent: list[dict]) -> str:
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body").decode()


async def test_disconnect_holds_native_stream_for_a_resume(app, client, pipeline, settings):
    cid = await new_conversation(client)
    pipeline.script(delta("partial", 0), hold=True)
    sent = await disconnect_after_hold(
        app, pipeline, f"/v1/conversations/{cid}/messages", {"content": "hi"}
    )
    assert '"partial"' in body_text(sent) and "[DONE]" not in body_text(sent)
    [request] = pipeline.submitted
    assert pipeline.cancelled == [], "the generation goes on for the resume grace"
    assert pipeline.held == [(request.request_id, settings.resume_grace_s)]


async def test_disconnect_cancels_openai_stream(app, pipeline):
    pipeline.script(delta("partial", 0), hold=True)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    sent = await disconnect_after_hold(app, pipeline, "/v1/chat/completions", body)
    assert '"partial"' in body_text(sent)
    assert pipeline.cancelled == [(pipeline.submitted[0].request_id, "client_disconnected")]
    assert pipeline.streams[0].closed


async def test_disconnect_cancels_openai_non_stream(app, pipeline):
    pipeline.script(delta("partial", 0), hold=True)
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    await disconnect_after_hold(app, pipeline, "/v1/chat/completions", body)
    assert pipeline.cancelled == [(pipeline.submitted[0].request_id, "client_disconnected")]
    assert pipeline.streams[0].closed
