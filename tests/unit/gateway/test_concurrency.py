"""Concurrent generations per API key: the gate on memory storage under a fake clock
(limits by key, org and tier; refusals; leases that expire unless their stream is read),
and the app over a pipeline the test feeds, where every way a generation ends gives its
lease back exactly once: done, error, cancel, a client gone, a stall, a refusal after
admission, a native stream held for a resume and resumed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx
import orjson
import pytest

from chatpipe.settings import Settings
from chatpipe.wiring import gateway_config
from conversations.answers import answer_started
from conversations.sqlite_store import SQLiteStore
from conversations.store import ApiKey, OrgSettings
from gateway.admission.concurrency import ConcurrencyGate, lease_key, lease_ttl_s
from gateway.admission.gates import Admission, Ask, Gate
from gateway.admission.lease_storage import (
    LeaseStorageError,
    MemoryLeases,
    Taken,
    lease_storage_from_uri,
)
from gateway.admission.rate_limits import RateLimiter, storage_from_uri
from gateway.config import ConcurrencyConfig
from gateway.deps import GatewayDeps
from gateway.errors import ApiError
from gateway.streaming.generation import SEND_TIMEOUT_S
from schemas.events import DeliverEvent, DeliveryDone, DeliveryError, GenerationRequest
from schemas.lifecycle import RequestStatus
from schemas.topics import Tier
from tests.support.chat import until
from tests.support.gateway import (
    ALICE,
    BOB,
    ScriptedPipeline,
    app_client,
    assert_error,
    delta,
    done,
    gateway_deps,
    is_background,
    new_conversation,
    post_scope,
)

TTL_S = 60.0
ANN = ApiKey("ann", "acme", Tier.PRO, key_id="k-ann")
CHAT = {"model": "tiny-random", "messages": [{"role": "user", "content": "hi"}]}
STREAMED = {**CHAT, "stream": True}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def gate(
    per_tier: dict[Tier, int] | None = None,
    storage: MemoryLeases | None = None,
    orgs: dict[str, OrgSettings] | None = None,
    clock: Clock | None = None,
) -> ConcurrencyGate:
    clock = clock or Clock()

    async def org_settings(org_id: str) -> OrgSettings:
        return (orgs or {}).get(org_id, OrgSettings(org_id))

    config = ConcurrencyConfig({Tier.PRO: 2} if per_tier is None else per_tier, "memory://", TTL_S)
    return ConcurrencyGate(config, storage or MemoryLeases(clock), org_settings, clock=clock)


async def admitted(concurrency: ConcurrencyGate, owner: ApiKey = ANN, generations: int = 1) -> Ask:
    ask = Ask(owner, "tiny-random", 10, generations)
    await concurrency.check(ask)
    return ask


# --- the gate -------------------------------------------------------------------------------


async def test_the_limit_is_the_keys_own_else_its_orgs_else_its_tiers() -> None:
    concurrency = gate(
        {Tier.PRO: 2, Tier.FREE: 1},
        orgs={
            "acme": OrgSettings("acme", max_concurrent_requests=5),
            "plain": OrgSettings("plain"),
        },
    )
    assert await concurrency.limit(ApiKey("u", "acme", Tier.PRO, max_concurrent_requests=9)) == 9
    assert await concurrency.limit(ApiKey("u", "acme", Tier.FREE)) == 5
    assert await concurrency.limit(ApiKey("u", "plain", Tier.FREE)) == 1
    assert await concurrency.limit(ApiKey("u", "other", Tier.ENTERPRISE)) is None  # not named


async def test_a_key_runs_its_limit_and_the_next_is_refused_until_one_ends() -> None:
    concurrency = gate()
    first, second = await admitted(concurrency), await admitted(concurrency)
    with pytest.raises(ApiError) as refused:
        await admitted(concurrency)
    error = refused.value
    assert (error.status_code, error.code) == (429, "too_many_concurrent_requests")
    assert error.headers == {"Retry-After": "1"}
    assert "2 of its 2 concurrent requests" in error.detail
    assert concurrency.held == 2

    other_key = await admitted(concurrency, ApiKey("ann", "acme", Tier.PRO, key_id="k-other"))
    assert len(other_key.leases) == 1, "another key of the same user counts apart"

    await first.leases.release()
    await first.leases.release()  # once only
    third = await admitted(concurrency)
    assert len(third.leases) == 1
    assert await concurrency.storage.held(lease_key(ANN)) == 2
    await second.leases.release()
    await third.leases.release()
    assert await concurrency.storage.held(lease_key(ANN)) == 0


async def test_n_choices_take_n_leases_and_more_than_the_limit_can_never_fit() -> None:
    concurrency = gate()
    both = await admitted(concurrency, generations=2)
    assert len(both.leases) == 2
    with pytest.raises(ApiError) as full:
        await admitted(concurrency)
    assert full.value.headers == {"Retry-After": "1"}
    await both.leases.release()
    with pytest.raises(ApiError) as never:
        await admitted(concurrency, generations=3)
    assert never.value.code == "too_many_concurrent_requests"
    assert not never.value.headers, "waiting cannot help: no Retry-After"
    assert "3 generations at once" in never.value.detail
    assert await concurrency.storage.held(lease_key(ANN)) == 0, "a refusal takes none"


async def test_no_limit_and_no_generation_take_no_lease() -> None:
    concurrency = gate({})
    assert len((await admitted(concurrency)).leases) == 0
    limited = gate()
    assert len((await admitted(limited, generations=0)).leases) == 0  # an embedding
    assert limited.held == 0


async def test_a_lease_read_is_renewed_and_one_left_unread_expires_for_every_gateway() -> None:
    clock = Clock()
    shared = MemoryLeases(clock)
    one, two = gate(storage=shared, clock=clock), gate(storage=shared, clock=clock)
    read, forgotten = (await admitted(one)).leases.claim(), (await admitted(one)).leases.claim()
    assert read is not None and forgotten is not None
    with pytest.raises(ApiError):
        await admitted(two)
    for _ in range(6):  # two TTLs of renewal rounds, a third of a TTL apart
        clock.now += TTL_S / 3
        read.touch()
        await one.renew()
    assert one.held == 1, "the lease nobody read has expired and is forgotten"
    assert await shared.held(lease_key(ANN)) == 1
    assert len((await admitted(two)).leases) == 1, "the other gateway may take its place"


async def test_a_gateway_that_died_frees_its_leases_after_the_ttl() -> None:
    clock = Clock()
    shared = MemoryLeases(clock)
    dead, alive = gate(storage=shared, clock=clock), gate(storage=shared, clock=clock)
    await admitted(dead)
    await admitted(dead)
    clock.now += TTL_S - 1
    with pytest.raises(ApiError):
        await admitted(alive)
    clock.now += 1
    assert len((await admitted(alive, generations=2)).leases) == 2
    await dead.aclose()


async def test_the_lease_ttl_outlives_a_stall_and_a_slow_clients_send() -> None:
    assert lease_ttl_s(30.0) == 2 * max(30.0, SEND_TIMEOUT_S)
    assert lease_ttl_s(200.0) == 400.0
    config = gateway_config(Settings(stream_stall_s=45.0)).concurrency
    assert config.lease_ttl_s == 90.0
    assert config.per_tier == {Tier.ENTERPRISE: 64, Tier.PRO: 16, Tier.FREE: 4}


class Unreachable(MemoryLeases):
    async def take(self, key: str, leases: Sequence[str], limit: int | None, ttl_s: float) -> Taken:
        raise LeaseStorageError("connection refused")


async def test_an_unreachable_storage_admits_without_a_lease() -> None:
    concurrency = gate(storage=Unreachable())
    asks = [await admitted(concurrency) for _ in range(3)]
    assert [len(ask.leases) for ask in asks] == [0, 0, 0]


def test_the_storage_is_the_rate_limits_uri() -> None:
    assert isinstance(lease_storage_from_uri("memory://"), MemoryLeases)
    assert type(lease_storage_from_uri("redis://127.0.0.1:1")).__name__ == "RedisLeases"
    with pytest.raises(ValueError, match="memory:// or one Redis"):
        lease_storage_from_uri("memcached://localhost:11211")


class Refuses(Gate):
    async def check(self, ask: Ask) -> dict[str, str]:
        raise ApiError(429, "rate_limited", "no")


async def test_a_later_gate_refusing_gives_the_leases_back(pipeline) -> None:
    concurrency = gate()
    admission = Admission([concurrency, Refuses()], pipeline)
    with pytest.raises(ApiError):
        await admission.admit(ANN, 10, "tiny-random", generations=2)
    assert concurrency.held == 0 and await concurrency.storage.held(lease_key(ANN)) == 0


# --- the app: every ending releases the lease ------------------------------------------------


class FedStream:
    """A request's events as the test feeds them (`feed`); a cancel ends it aborted."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self._arrived: asyncio.Queue[DeliverEvent] = asyncio.Queue()
        self.events: list[DeliverEvent] = []
        self.closed = False
        self.read = asyncio.Event()
        """Set once the relay has taken an event."""

    @property
    def ended(self) -> bool:
        return any(isinstance(e, DeliveryDone | DeliveryError) for e in self.events)

    def feed(self, *events: DeliverEvent) -> None:
        for event in events:
            self._arrived.put_nowait(event.model_copy(update={"request_id": self.request_id}))

    async def take(self) -> list[DeliverEvent]:
        batch = [await self._arrived.get()]
        while not self._arrived.empty():
            batch.append(self._arrived.get_nowait())
        self.events += batch
        self.read.set()
        return batch

    async def __aiter__(self) -> AsyncIterator[DeliverEvent]:
        while True:
            for event in await self.take():
                yield event

    async def aclose(self) -> None:
        self.closed = True


class FedPipeline(ScriptedPipeline):
    """The scripted pipeline, whose users' requests the test feeds (`fed`) and whose
    resumed streams too (`following`)."""

    def __init__(self) -> None:
        super().__init__()
        self.fed: list[FedStream] = []
        self.following: dict[str, FedStream] = {}

    async def submit(self, request: GenerationRequest) -> Any:
        if self.fail_submit or is_background(request):
            return await super().submit(request)
        self.submitted.append(request)
        stream = FedStream(request.request_id)
        self.fed.append(stream)
        return stream

    async def follow(
        self, request_id: str, conversation_id: str, partition: int, offset: int
    ) -> Any:
        """The answer as chat.answers holds it: its marker, what was read so far, then
        what the test feeds."""
        [request] = [r for r in self.started if r.request_id == request_id]
        played = next(s for s in self.fed if s.request_id == request_id)
        follower = FedStream(request_id)
        follower.feed(answer_started(request), *played.events)
        self.followed.append((request_id, offset))
        self.following[request_id] = follower
        return follower

    async def cancel(self, request_id: str, reason: str = "client_disconnected") -> None:
        await super().cancel(request_id, reason)
        for stream in self.fed:  # the worker stops; the answer ends aborted
            if stream.request_id == request_id:
                stream.feed(done(9, RequestStatus.FINISHED_ABORTED))


@pytest.fixture
def pipeline() -> FedPipeline:
    return FedPipeline()


@pytest.fixture
def concurrency(store: SQLiteStore) -> ConcurrencyGate:
    """Alice (pro) may run 2 generations at once, bob (free) 1."""
    config = ConcurrencyConfig({Tier.PRO: 2, Tier.FREE: 1}, "memory://", TTL_S)
    return ConcurrencyGate(config, MemoryLeases(), store.get_org_settings)


@pytest.fixture
def deps(
    settings: Settings, store: SQLiteStore, pipeline: FedPipeline, concurrency: ConcurrencyGate
) -> GatewayDeps:
    return gateway_deps(settings, store, pipeline, reply_wait_s=0.3, concurrency=concurrency)


async def held(concurrency: ConcurrencyGate, store: SQLiteStore, key: str = "key-alice") -> int:
    """The leases `key` holds in storage; the gateway's own count must agree."""
    owner = await store.find_api_key(key)
    assert owner is not None
    in_storage = await concurrency.storage.held(lease_key(owner))
    assert concurrency.held >= in_storage
    return in_storage


async def streams_started(pipeline: FedPipeline, count: int) -> list[FedStream]:
    await until(lambda: len(pipeline.fed) >= count, timeout_s=5, interval_s=0.01)
    return pipeline.fed


async def assert_released(concurrency: ConcurrencyGate, store: SQLiteStore) -> None:
    await until(lambda: concurrency.held == 0, timeout_s=5, interval_s=0.01)
    assert await held(concurrency, store) == 0


def too_many(response: httpx.Response) -> None:
    assert_error(response, 429, "too_many_concurrent_requests")
    assert response.headers["retry-after"] == "1"


async def test_streams_past_the_limit_are_refused_and_admitted_again_once_one_ends(
    client, pipeline, concurrency, store
) -> None:
    running = [
        asyncio.create_task(client.post("/v1/chat/completions", json=STREAMED, headers=ALICE))
        for _ in range(2)
    ]
    first, second = await streams_started(pipeline, 2)
    assert await held(concurrency, store) == 2
    too_many(await client.post("/v1/chat/completions", json=STREAMED, headers=ALICE))
    too_many(await client.post("/v1/chat/completions", json=CHAT, headers=ALICE))
    assert len(pipeline.submitted) == 2, "a refused request is never queued"
    bob = asyncio.create_task(client.post("/v1/chat/completions", json=STREAMED, headers=BOB))
    await streams_started(pipeline, 3)  # another key has its own leases

    first.feed(delta("a", 0), done(1))
    assert (await running[0]).status_code == 200
    third = asyncio.create_task(client.post("/v1/chat/completions", json=STREAMED, headers=ALICE))
    await streams_started(pipeline, 4)
    assert await held(concurrency, store) == 2
    second.feed(DeliveryError(request_id="-", code="engine_error", message="boom"))
    pipeline.fed[2].feed(done(0))
    pipeline.fed[3].feed(done(0))
    for task in (running[1], bob, third):
        assert (await task).status_code == 200
    await assert_released(concurrency, store)


async def test_a_lease_is_released_before_the_end_is_shown(app, pipeline, concurrency, store):
    """A client that starts its next request as soon as it reads the end is admitted."""
    seen_at_end: list[int] = []

    async def on_body(body: bytes) -> None:
        if b'"finish_reason":"stop"' in body:
            seen_at_end.append(concurrency.held)

    task = asyncio.create_task(asgi(app, "/v1/chat/completions", STREAMED, on_body=on_body))
    [stream] = await streams_started(pipeline, 1)
    assert concurrency.held == 1
    stream.feed(delta("a", 0), done(1))
    await task
    assert seen_at_end == [0]


async def test_a_cancel_a_stall_and_a_client_gone_each_release_the_lease(
    app, client, pipeline, concurrency, store, settings
) -> None:
    # Stop: the generation's stream ends aborted.
    cid = await new_conversation(client)
    turn = asyncio.create_task(
        client.post(f"/v1/conversations/{cid}/messages", json={"content": "hi"}, headers=ALICE)
    )
    [stream] = await streams_started(pipeline, 1)
    stream.feed(delta("a", 0))
    await until(lambda: stream.read.is_set(), timeout_s=5, interval_s=0.01)
    stopped = await client.post(f"/v1/requests/{stream.request_id}/cancel", headers=ALICE)
    assert stopped.status_code == 202
    assert (await turn).status_code == 200
    await assert_released(concurrency, store)

    # The client goes away: an OpenAI stream is cancelled at once, streamed or not.
    for body in (STREAMED, CHAT):
        gone = asyncio.Event()
        task = asyncio.create_task(asgi(app, "/v1/chat/completions", body, disconnect=gone))
        started = await streams_started(pipeline, len(pipeline.fed) + 1)
        started[-1].feed(delta("partial", 0))
        await until(lambda s=started[-1]: s.read.is_set(), timeout_s=5, interval_s=0.01)
        assert concurrency.held == 1
        gone.set()
        await task
        await assert_released(concurrency, store)


async def test_a_stalled_stream_releases_its_lease(settings, store, concurrency) -> None:
    quick = settings.replace(stream_stall_s=0.2)
    pipeline = FedPipeline()
    async with app_client(quick, store, pipeline, concurrency=concurrency) as (client, _):
        task = asyncio.create_task(
            client.post("/v1/chat/completions", json=STREAMED, headers=ALICE)
        )
        await streams_started(pipeline, 1)
        response = await task
    assert '"stalled"' in response.text
    assert pipeline.cancelled == [(pipeline.submitted[0].request_id, "stalled")]
    await assert_released(concurrency, store)


async def test_refused_after_admission_the_request_gives_its_lease_back(
    client, pipeline, concurrency, store
) -> None:
    cid = await new_conversation(client)
    first = asyncio.create_task(
        client.post(f"/v1/conversations/{cid}/messages", json={"content": "one"}, headers=ALICE)
    )
    [stream] = await streams_started(pipeline, 1)
    # Admitted, then refused: the previous answer is still streaming.
    pending = await client.post(
        f"/v1/conversations/{cid}/messages", json={"content": "two"}, headers=ALICE
    )
    assert_error(pending, 409, "reply_pending")
    assert await held(concurrency, store) == 1
    stream.feed(done(0))
    assert (await first).status_code == 200
    # Admitted, then the pipeline cannot take it.
    pipeline.fail_submit = True
    for path, body in (
        (f"/v1/conversations/{cid}/messages", {"content": "three"}),
        ("/v1/chat/completions", STREAMED),
        ("/v1/completions", {"model": "tiny-random", "prompt": "hi", "stream": True}),
    ):
        assert_error(await client.post(path, json=body, headers=ALICE), 503, "pipeline_unavailable")
        assert await held(concurrency, store) == 0


async def test_n_choices_hold_n_leases_each_until_its_own_answer_ends(
    client, pipeline, concurrency, store
) -> None:
    task = asyncio.create_task(
        client.post("/v1/chat/completions", json={**STREAMED, "n": 2}, headers=ALICE)
    )
    one, two = await streams_started(pipeline, 2)
    assert await held(concurrency, store) == 2
    too_many(await client.post("/v1/chat/completions", json=STREAMED, headers=ALICE))
    one.feed(done(0))
    await until(lambda: concurrency.held == 1, timeout_s=5, interval_s=0.01)
    two.feed(done(0))
    assert (await task).status_code == 200
    await assert_released(concurrency, store)
    over = await client.post("/v1/chat/completions", json={**CHAT, "n": 3}, headers=ALICE)
    assert_error(over, 429, "too_many_concurrent_requests")
    assert "retry-after" not in over.headers


async def test_completions_and_responses_hold_a_lease_to_their_end(
    client, pipeline, concurrency, store
) -> None:
    requests = [
        ("/v1/completions", {"model": "tiny-random", "prompt": "hi"}),
        ("/v1/completions", {"model": "tiny-random", "prompt": "hi", "stream": True}),
        ("/v1/responses", {"model": "tiny-random", "input": "hi"}),
        ("/v1/responses", {"model": "tiny-random", "input": "hi", "stream": True}),
        ("/v1/responses", {"model": "tiny-random", "input": "hi", "store": False}),
    ]
    for path, body in requests:
        task = asyncio.create_task(client.post(path, json=body, headers=ALICE))
        started = await streams_started(pipeline, len(pipeline.fed) + 1)
        assert await held(concurrency, store) == 1, path
        started[-1].feed(delta("x", 0), done(1))
        assert (await task).status_code == 200, (path, body)
        await assert_released(concurrency, store)

    body = {"model": "tiny-random", "input": "hi", "background": True}
    background = await client.post("/v1/responses", json=body, headers=ALICE)
    assert background.json()["status"] == "queued"
    assert await held(concurrency, store) == 1, "the answer runs on after the reply"
    pipeline.fed[-1].feed(done(0))
    await assert_released(concurrency, store)


async def test_a_dropped_native_stream_holds_its_lease_through_the_hold_and_a_resume(
    app, client, pipeline, concurrency, store
) -> None:
    cid = await new_conversation(client)
    gone = asyncio.Event()
    task = asyncio.create_task(
        asgi(app, f"/v1/conversations/{cid}/messages", {"content": "hi"}, disconnect=gone)
    )
    [stream] = await streams_started(pipeline, 1)
    stream.feed(delta("a", 0))
    await until(lambda: stream.read.is_set(), timeout_s=5, interval_s=0.01)
    gone.set()
    await task
    request_id = stream.request_id
    assert pipeline.held and pipeline.held[0][0] == request_id
    assert await held(concurrency, store) == 1, "held for the resume grace, it still runs"

    resumed = asyncio.create_task(client.get(f"/v1/requests/{request_id}/events", headers=ALICE))
    await until(lambda: pipeline.followed, timeout_s=5, interval_s=0.01)
    await until(lambda: concurrency.held == 2, timeout_s=5, interval_s=0.01)
    await pipeline.end_hold(request_id)  # the resume ends the hold: its lease goes
    assert await held(concurrency, store) == 1, "the resumed stream holds it now"
    follower = pipeline.following[request_id]
    follower.feed(done(1))
    assert (await resumed).status_code == 200
    await assert_released(concurrency, store)


async def test_an_orgs_own_limit_and_a_keys_own_limit_win_over_the_tiers(
    client, pipeline, concurrency, store
) -> None:
    await store.set_org_settings(OrgSettings("org-b", max_concurrent_requests=2))
    bobs = [
        asyncio.create_task(client.post("/v1/chat/completions", json=STREAMED, headers=BOB))
        for _ in range(2)
    ]
    await streams_started(pipeline, 2)
    too_many(await client.post("/v1/chat/completions", json=STREAMED, headers=BOB))
    await store.add_api_key(
        "key-carol", ApiKey("carol", "org-b", Tier.FREE, max_concurrent_requests=1)
    )
    carol = {"Authorization": "Bearer key-carol"}
    first = asyncio.create_task(client.post("/v1/chat/completions", json=STREAMED, headers=carol))
    await streams_started(pipeline, 3)
    too_many(await client.post("/v1/chat/completions", json=STREAMED, headers=carol))
    for stream in pipeline.fed:
        stream.feed(done(0))
    for task in (*bobs, first):
        assert (await task).status_code == 200


async def test_a_refusal_for_concurrency_is_not_charged_to_the_rate_limits(
    settings, store, concurrency
) -> None:
    pipeline = FedPipeline()
    limiter = RateLimiter(gateway_config(settings).rate_limits, storage_from_uri("memory://"))
    async with app_client(
        settings, store, pipeline, concurrency=concurrency, rate_limiter=limiter
    ) as (client, _):
        bob = asyncio.create_task(client.post("/v1/chat/completions", json=STREAMED, headers=BOB))
        await streams_started(pipeline, 1)
        refused = await client.post("/v1/chat/completions", json=STREAMED, headers=BOB)
        too_many(refused)
        limit = int(refused.headers["x-ratelimit-limit-requests"])
        assert refused.headers["x-ratelimit-remaining-requests"] == str(limit - 1)
        pipeline.fed[0].feed(done(0))
        assert (await bob).status_code == 200


async def test_embeddings_take_no_lease(concurrency, pipeline) -> None:
    admission = Admission([concurrency], pipeline)
    ask = await admission.admit(ApiKey("bob", "org-b", Tier.FREE), 10, "minilm", generations=0)
    assert len(ask.leases) == 0 and concurrency.held == 0


# --- helpers ----------------------------------------------------------------------------


async def asgi(
    app,
    path: str,
    body: dict,
    *,
    key: str = "key-alice",
    disconnect: asyncio.Event | None = None,
    on_body=None,
) -> list[dict]:
    """POST `body` to `path` over raw ASGI; the client disconnects once `disconnect` is
    set; `on_body` sees each body chunk as it is sent."""
    sent: list[dict] = []
    first = True

    async def receive() -> dict:
        nonlocal first
        if first:
            first = False
            return {"type": "http.request", "body": orjson.dumps(body), "more_body": False}
        await (disconnect or asyncio.Event()).wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)
        if on_body is not None and message["type"] == "http.response.body":
            await on_body(message.get("body", b""))

    scope = post_scope(path, key)
    await asyncio.wait_for(app(scope, receive, send), timeout=10)
    return sent
