"""The gateway's front door, in process (real SQLite store, scripted pipeline, real
`limits` memory storage): what a request may carry, who may ask for which model,
which messages the input check reads, what a refused request costs, and what the
OpenAPI document says about all of it."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from limits.storage import MemoryStorage  # noqa: F401  (the storage the URI below makes)

from chatpipe.settings import Settings
from conversations.store import ApiKey
from gateway.admission.limits import BUS_HEADROOM_BYTES, BUS_MESSAGE_BYTES, bus_bytes
from gateway.admission.rate_limits import RateLimiter
from gateway.app import create_app
from gateway.deps import GatewayDeps
from gateway.edge.body_limits import BodyLimits
from gateway.native.background import generate_text, own_request
from moderation.classifiers import JudgeClassifier, RuleClassifier
from moderation.policy import SafetyPolicy
from schemas.codec import encode
from schemas.events import (
    ChatMessage,
    GenerationRequest,
    Role,
    StreamPosition,
    WorkAssignment,
)
from schemas.topics import Tier
from tests.support.gateway import (
    ALICE,
    BOB,
    REPLY_TO,
    ModeratedPipeline,
    assert_error,
    delta,
    done,
    gateway_deps,
    new_conversation,
    word_context,
)

SEED_LIMIT = 2**64


class CountingContext:
    """The deployment's context builder, counting its (expensive) builds."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.builds = 0
        self.tokenized = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def build(self, *args, **kwargs):
        self.builds += 1
        return await self.inner.build(*args, **kwargs)

    async def prompt_tokens(self, *args, **kwargs):
        self.tokenized += 1
        return await self.inner.prompt_tokens(*args, **kwargs)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        model_name="tiny-random", served_models=["tiny-random", "big"],
        tier_models={Tier.FREE: ["tiny-random"]},
        max_message_chars=2_000_000, default_max_tokens=16, max_tokens_limit=100,
        max_messages=8, max_stop_sequences=2, max_stop_chars=8, max_body_bytes=4 << 20,
        max_model_len=10_000_000, user_requests_per_minute=3, org_requests_per_minute=100,
        user_tokens_per_minute=10_000_000, org_tokens_per_minute=10_000_000,
        database_path=tmp_path / "chat.db")  # fmt: skip


@pytest.fixture
def pipeline() -> ModeratedPipeline:
    return ModeratedPipeline()


@pytest.fixture
def context(settings: Settings) -> CountingContext:
    return CountingContext(word_context(settings))


@pytest.fixture
def safety() -> SafetyPolicy:
    """`forbidden` is blocked everywhere; `bigword` only for the pro tier on model big."""
    everywhere = RuleClassifier({"banned": ["forbidden"]})
    strict = RuleClassifier({"banned": ["forbidden"], "big-only": ["bigword"]})
    return SafetyPolicy(input={"*": [everywhere], "pro/big": [strict]})


@pytest.fixture
def deps(settings, store, pipeline, limiter, context, safety) -> GatewayDeps:
    return gateway_deps(settings, store, pipeline, context, reply_wait_s=0.3,
                        rate_limiter=limiter, safety=safety)  # fmt: skip


@pytest.fixture
async def client(deps: GatewayDeps) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(deps)
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client
    await deps.background.close()


async def requests_used(limiter: RateLimiter, key: str) -> int:
    owner = {
        "key-alice": ApiKey("alice", "org-a", Tier.PRO),
        "key-bob": ApiKey("bob", "org-b", Tier.FREE),
    }[key]
    headers = await limiter.headers(owner)
    return int(headers["x-ratelimit-limit-requests"]) - int(
        headers["x-ratelimit-remaining-requests"]
    )


def completion(content: str = "hi", **fields: object) -> dict:
    return {"model": "tiny-random", "messages": [{"role": "user", "content": content}], **fields}


def raw_json(body: str) -> dict:
    return {"content": body.encode(), "headers": {**ALICE, "Content-Type": "application/json"}}


# --- values that cannot be run or encoded: 422 before anything is stored or charged -----


@pytest.mark.parametrize("seed", [SEED_LIMIT, SEED_LIMIT * 10, -1])
async def test_a_seed_outside_uint64_is_422_and_costs_nothing(
    client, store, pipeline, limiter, seed
):
    cid = await new_conversation(client)
    used = await requests_used(limiter, "key-alice")
    response = await client.post(
        f"/v1/conversations/{cid}/messages", json={"content": "hi", "seed": seed}, headers=ALICE
    )
    assert assert_error(response, 422, "invalid_request")["param"] == "seed"
    response = await client.post("/v1/chat/completions", json=completion(seed=seed), headers=ALICE)
    assert assert_error(response, 422, "invalid_request")["param"] == "seed"
    assert await store.list_messages(cid) == []
    assert pipeline.submitted == []
    assert await requests_used(limiter, "key-alice") == used


async def test_the_largest_uint64_seed_runs(client, pipeline):
    pipeline.script(delta("a", 0), done(1))
    response = await client.post(
        "/v1/chat/completions", json=completion(seed=SEED_LIMIT - 1), headers=ALICE
    )
    assert response.status_code == 200, response.text
    assert pipeline.submitted[0].sampling.seed == SEED_LIMIT - 1
    assert len(encode(pipeline.submitted[0])) > 0  # the bus can carry it


@pytest.mark.parametrize(
    "body",
    [
        '{"content": "a \\ud800 lone high surrogate"}',
        '{"content": "hi", "model": "\\udfff"}',
    ],
)
async def test_a_lone_surrogate_in_a_turn_is_422_and_costs_nothing(
    client, store, pipeline, limiter, body
):
    cid = await new_conversation(client)
    used = await requests_used(limiter, "key-alice")
    response = await client.post(f"/v1/conversations/{cid}/messages", **raw_json(body))
    assert_error(response, 422, "invalid_request")
    assert await store.list_messages(cid) == []
    assert pipeline.submitted == []
    assert await requests_used(limiter, "key-alice") == used


@pytest.mark.parametrize(
    "body",
    [
        '{"model": "tiny-random", "messages": [{"role": "user", "content": "\\ud83d"}]}',
        (
            '{"model": "tiny-random", "messages": [{"role": "user", "content": '
            '[{"type": "text", "text": "\\udc00"}]}]}'
        ),
        (
            '{"model": "tiny-random", "messages": [{"role": "user", "content": "hi"}], '
            '"stop": ["\\ud800"]}'
        ),
    ],
)
async def test_a_lone_surrogate_in_a_completion_is_422(client, pipeline, body):
    response = await client.post("/v1/chat/completions", **raw_json(body))
    assert_error(response, 422, "invalid_request")
    assert pipeline.submitted == []


async def test_a_lone_surrogate_in_a_title_is_422(client):
    response = await client.post("/v1/conversations", **raw_json('{"title": "\\ud800"}'))
    assert_error(response, 422, "invalid_request")


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"stop": ["a", "b", "c"]}, "too_many_stop_sequences"),
        ({"stop": "123456789"}, "stop_too_long"),
        ({"stop": ["ok", "123456789"]}, "stop_too_long"),
        ({"stop": ""}, "invalid_request"),  # vLLM refuses an empty stop: never queue one
        ({"stop": ["ok", ""]}, "invalid_request"),
        ({"temperature": 2.5}, "invalid_request"),
        ({"top_p": 0}, "invalid_request"),
        ({"max_tokens": 0}, "invalid_request"),
        ({"max_tokens": 101}, "max_tokens_too_large"),
    ],
)
async def test_completion_bounds_are_422(client, pipeline, limiter, fields, code):
    used = await requests_used(limiter, "key-alice")
    response = await client.post("/v1/chat/completions", json=completion(**fields), headers=ALICE)
    assert_error(response, 422, code)
    assert pipeline.submitted == []
    assert await requests_used(limiter, "key-alice") == used


async def test_more_messages_than_max_messages_is_422(client, pipeline, settings):
    messages = [{"role": "user", "content": "x"}] * (settings.gateway.max_messages + 1)
    response = await client.post(
        "/v1/chat/completions", json={"model": "tiny-random", "messages": messages}, headers=ALICE
    )
    assert assert_error(response, 422, "too_many_messages")["param"] == "messages"
    pipeline.script(delta("a", 0), done(1))
    response = await client.post(
        "/v1/chat/completions",
        headers=ALICE,
        json={"model": "tiny-random", "messages": messages[: settings.gateway.max_messages]},
    )
    assert response.status_code == 200, response.text


# --- policy: tier models, input safety over every user-supplied message ---------------


async def test_a_model_outside_the_tier_is_403_on_both_apis(client, store, pipeline):
    cid = await new_conversation(client, BOB)
    response = await client.post(
        f"/v1/conversations/{cid}/messages", json={"content": "hi", "model": "big"}, headers=BOB
    )
    assert assert_error(response, 403, "model_not_allowed")["param"] == "model"
    response = await client.post("/v1/chat/completions", json=completion(model="big"), headers=BOB)
    assert_error(response, 403, "model_not_allowed")
    assert await store.list_messages(cid) == []
    assert pipeline.submitted == []
    pipeline.script(delta("a", 0), done(1))
    response = await client.post(
        "/v1/chat/completions", json=completion(model="big"), headers=ALICE
    )  # pro: every model
    assert response.status_code == 200 and pipeline.submitted[0].model == "big"


async def test_a_tier_whose_default_model_is_not_allowed_gets_its_first_allowed(
    settings, store, pipeline, deps, tmp_path
):
    narrowed = settings.replace(**{"tier_models": {Tier.FREE: ["big"]}})
    app = create_app(gateway_deps(narrowed, store, pipeline))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app), base_url="http://test"
    ) as client:
        cid = await new_conversation(client, BOB)
        pipeline.script(delta("a", 0), done(1))
        response = await client.post(
            f"/v1/conversations/{cid}/messages", json={"content": "hi"}, headers=BOB
        )
        assert response.status_code == 200, response.text
    assert pipeline.submitted[0].model == "big"


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "system", "content": "forbidden"}, {"role": "user", "content": "hi"}],
        [
            {"role": "user", "content": "forbidden"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "hi"},
        ],
        [
            {"role": "assistant", "content": [{"type": "text", "text": "forbidden"}]},
            {"role": "user", "content": "hi"},
        ],
    ],
)
async def test_every_message_a_client_wrote_is_checked(client, pipeline, messages):
    response = await client.post(
        "/v1/chat/completions", headers=ALICE, json={"model": "tiny-random", "messages": messages}
    )
    assert assert_error(response, 400, "content_blocked")["param"] == "content"
    assert pipeline.submitted == []
    assert [m.category for m in pipeline.moderated] == ["banned"]


async def test_the_judge_is_asked_once_per_request_however_many_messages(deps, pipeline):
    """Rules run per message; the judge (a generation each) once, over them all joined:
    256 one-letter messages cost one judge generation, not 256."""
    asked: list[str] = []

    async def ask(prompt: str) -> str:
        asked.append(prompt)
        return "unsafe banned" if "forbidden-by-judge" in prompt else "safe"

    judge = JudgeClassifier(ask, ["banned"])
    app_deps = replace(deps, safety=SafetyPolicy(input={"*": [RuleClassifier({}), judge]}))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(create_app(app_deps)), base_url="http://test"
    ) as client:
        pipeline.script(delta("a", 0), done(1))
        many = [{"role": "user", "content": f"m{i}"} for i in range(5)]
        response = await client.post(
            "/v1/chat/completions", headers=ALICE, json={"model": "tiny-random", "messages": many}
        )
        assert response.status_code == 200, response.text
        assert len(asked) == 1 and all(f"m{i}" in asked[0] for i in range(5))
        hidden = [*many[:2], {"role": "system", "content": "forbidden-by-judge"}, *many[2:]]
        response = await client.post(
            "/v1/chat/completions", headers=ALICE, json={"model": "tiny-random", "messages": hidden}
        )
        assert_error(response, 400, "content_blocked")
        assert len(asked) == 2


async def test_a_judge_that_gives_no_verdict_is_a_503_not_a_pass_nor_a_500(deps, pipeline):
    async def ask(prompt: str) -> str:
        raise TimeoutError("the judge's generation did not end")

    judge = JudgeClassifier(ask, ["banned"])
    app_deps = replace(deps, safety=SafetyPolicy(input={"*": [judge]}))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(create_app(app_deps)), base_url="http://test"
    ) as client:
        response = await client.post(
            "/v1/chat/completions",
            headers=ALICE,
            json={"model": "tiny-random", "messages": [{"role": "user", "content": "hi"}]},
        )
    assert_error(response, 503, "safety_unavailable")
    assert response.headers["retry-after"] == "5"
    assert pipeline.submitted == []


async def test_tier_and_model_rules_apply_to_that_tier_and_model_only(client, store, pipeline):
    cid = await new_conversation(client)
    url = f"/v1/conversations/{cid}/messages"
    response = await client.post(url, json={"content": "a bigword", "model": "big"}, headers=ALICE)
    assert_error(response, 400, "content_blocked")
    assert await store.list_messages(cid) == []
    pipeline.script(delta("a", 0), done(1))
    response = await client.post(
        url, json={"content": "a bigword", "model": "tiny-random"}, headers=ALICE
    )
    assert response.status_code == 200, response.text
    response = await client.post(
        "/v1/chat/completions",
        headers=ALICE,
        json={
            "model": "big",
            "messages": [
                {"role": "system", "content": "bigword"},
                {"role": "user", "content": "hi"},
            ],
        },
    )
    assert_error(response, 400, "content_blocked")


async def test_regenerating_with_a_stricter_model_checks_the_question_again(client, pipeline):
    cid = await new_conversation(client)
    pipeline.script(delta("a", 0), done(1))
    posted = await client.post(
        f"/v1/conversations/{cid}/messages",
        json={"content": "a bigword", "model": "tiny-random"},
        headers=ALICE,
    )
    assert posted.status_code == 200
    question = pipeline.submitted[0].parent_id
    response = await client.post(
        f"/v1/conversations/{cid}/messages/{question}/regenerate",
        json={"model": "big"},
        headers=ALICE,
    )
    assert_error(response, 400, "content_blocked")
    assert len(pipeline.submitted) == 1


# --- cheap before expensive; size on the bus ------------------------------------------


async def test_a_rate_limited_turn_builds_no_prompt(client, context, limiter, store):
    cid = await new_conversation(client)
    for _ in range(3):  # user_requests_per_minute
        response = await client.post(
            f"/v1/conversations/{cid}/messages/nope/edit", json={"content": "hi"}, headers=ALICE
        )
        assert_error(response, 404, "message_not_found")
    builds = context.builds
    response = await client.post(
        f"/v1/conversations/{cid}/messages", json={"content": "hi"}, headers=ALICE
    )
    assert_error(response, 429, "rate_limited")
    assert context.builds == builds == 0
    assert await store.list_messages(cid) == []


async def test_a_turn_is_charged_for_its_whole_prompt(client, deps, limiter, pipeline):
    cid = await new_conversation(client)
    pipeline.script(delta("a", 0), done(1))
    first = "word " * 400
    await client.post(f"/v1/conversations/{cid}/messages", json={"content": first}, headers=ALICE)
    owner = ApiKey("alice", "org-a", Tier.PRO)
    before = await limiter.headers(owner)
    pipeline.script(delta("b", 0), done(1))
    response = await client.post(
        f"/v1/conversations/{cid}/messages", json={"content": "hi", "max_tokens": 10}, headers=ALICE
    )
    assert response.status_code == 200
    after = await limiter.headers(owner)
    charged = int(before["x-ratelimit-remaining-tokens"]) - int(
        after["x-ratelimit-remaining-tokens"]
    )
    prompt = sum(len(m.content) for m in pipeline.submitted[-1].messages)
    assert charged == math.ceil(prompt / 4) + 10
    assert charged > len(first) / 4  # the history, not just the new message


async def test_a_request_the_bus_cannot_carry_is_413_before_anything_is_stored(
    client, store, pipeline, limiter
):
    room = BUS_MESSAGE_BYTES - BUS_HEADROOM_BYTES
    huge = "x" * room
    cid = await new_conversation(client)
    response = await client.post(
        f"/v1/conversations/{cid}/messages", json={"content": huge}, headers=ALICE
    )
    assert_error(response, 413, "request_too_large")
    assert await store.list_messages(cid) == []
    used = await requests_used(limiter, "key-alice")
    response = await client.post("/v1/chat/completions", json=completion(huge), headers=ALICE)
    assert_error(response, 413, "request_too_large")
    assert await requests_used(limiter, "key-alice") == used  # refused before the charge
    assert pipeline.submitted == []
    pipeline.script(delta("a", 0), done(1))
    response = await client.post(
        "/v1/chat/completions", json=completion("x" * (room // 2)), headers=ALICE
    )
    assert response.status_code == 200


async def test_a_background_job_the_bus_cannot_carry_is_dropped_not_sent(deps, pipeline):
    """Titles and summaries are built from history: one too large for the bus is given up
    (no title or summary), never queued to fail at a later hop."""
    owner = ApiKey(user_id="alice", org_id="acme", tier=Tier.FREE)
    huge = (ChatMessage(role=Role.USER, content="x" * BUS_MESSAGE_BYTES),)
    own = deps.own_requests
    request = own_request(own, owner, "c1", deps.config.limits.default_model, huge, 16)
    assert await generate_text(own, request) is None
    assert pipeline.submitted == []


def test_bus_bytes_bounds_the_assignment_the_scheduler_sends():
    """The scheduler wraps the request in a WorkAssignment with a stream position, a
    worker id and, when it routes, another model: the estimate covers all of it."""
    request = GenerationRequest(
        request_id="r" * 32,
        conversation_id="c" * 32,
        message_id="m" * 32,
        user_id="u",
        org_id="o",
        tier=Tier.FREE,
        model="tiny-random",
        reply_to=REPLY_TO,
        messages=(ChatMessage(role=Role.USER, content='\x00"\\ é 😀' * 1000),),
    )
    estimate = bus_bytes(request, ["tiny-random", "a-much-longer-fallback-model-name"])
    routed = request.model_copy(
        update={
            "model": "a-much-longer-fallback-model-name",
            "requested_model": "tiny-random",
            "attempt": 7,
            "stream": StreamPosition(partition=11, start_offset=2**40, attempt_offset=2**41),
        }
    )
    sent = WorkAssignment(
        worker_id="worker-" + "9" * 40, incarnation="f" * 32, request=routed, epoch=123456
    )
    assert len(encode(sent)) <= estimate < len(encode(sent)) + 1024


# --- errors and surfaces -------------------------------------------------------------


async def test_an_unexpected_error_reaches_the_client_without_its_text(deps, store):
    async def broken(*args, **kwargs):
        raise RuntimeError("sqlite at /secret/path: password=hunter2")

    store.create_conversation = broken
    app = create_app(deps)
    transport = httpx.ASGITransport(app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        response = await client.post("/v1/conversations", json={}, headers=ALICE)
    assert_error(response, 500, "internal_error")
    assert "hunter2" not in response.text and "secret" not in response.text


async def test_a_failed_queue_reaches_the_client_without_its_text(client, pipeline):
    pipeline.fail_submit = True  # raises ConnectionError("broker down")
    response = await client.post("/v1/chat/completions", json=completion(), headers=ALICE)
    assert_error(response, 503, "pipeline_unavailable")
    assert "broker" not in response.text


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json"])
async def test_api_docs_only_when_on(deps, path):
    for api_docs, status in ((False, 404), (True, 200)):
        app = create_app(deps, api_docs=api_docs)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app), base_url="http://test"
        ) as client:
            assert (await client.get(path)).status_code == status


def test_the_document_declares_every_error_as_error_body_and_the_limits(deps, settings):
    document = create_app(deps).openapi()
    json.dumps(document)  # serves as JSON
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            responses = operation["responses"]
            for status, response in responses.items():
                if int(status) >= 400:
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (path, status)
            if path.startswith("/v1/"):
                assert "401" in responses, (method, path)
            if "requestBody" in operation:
                assert {"400", "408", "413", "422"} <= set(responses), (method, path)
            if "{" in path:
                assert "404" in responses, (method, path)
    turn = document["paths"]["/v1/conversations/{conversation_id}/messages"]["post"]
    assert {"403", "409", "429", "503"} <= set(turn["responses"])
    schemas = document["components"]["schemas"]
    completion_fields = schemas["ChatCompletionRequest"]["properties"]
    assert completion_fields["messages"]["maxItems"] == settings.gateway.max_messages
    assert completion_fields["model"]["enum"] == ["tiny-random", "big"]
    [text, array, _] = completion_fields["stop"]["anyOf"]
    assert text["maxLength"] == array["items"]["maxLength"] == settings.gateway.max_stop_chars
    assert array["maxItems"] == settings.gateway.max_stop_sequences
    [seed, _] = completion_fields["seed"]["anyOf"]
    assert (seed["minimum"], seed["maximum"]) == (0, SEED_LIMIT - 1)
    [max_tokens, _] = schemas["PostMessage"]["properties"]["max_tokens"]["anyOf"]
    assert max_tokens["maximum"] == settings.gateway.max_tokens_limit
    assert schemas["PostMessage"]["properties"]["content"]["maxLength"] == (
        settings.gateway.max_message_chars
    )
    assert "HTTPValidationError" not in schemas
    stream = turn["responses"]["200"]["content"]["text/event-stream"]["schema"]
    assert stream["type"] == "object" and stream["required"] == ["data"]
    assert "404" in document["paths"]["/v1/conversations"]["get"]["responses"]


async def test_a_cursor_the_server_did_not_issue_is_404_without_the_stores_text(client):
    response = await client.get("/v1/conversations", params={"cursor": "\x11YL"}, headers=ALICE)
    error = assert_error(response, 404, "cursor_not_found")
    assert error["param"] == "cursor" and "YL" not in error["message"]


# --- the body middleware, at the ASGI level --------------------------------------------


async def _echo_length(scope, receive, send) -> None:
    message = await receive()
    body = str(len(message["body"])).encode()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": body})


async def _call(app, headers: list[tuple[bytes, bytes]], chunks: list[bytes], *,
                stall: bool = False, path: str = "/") -> tuple[int, bytes, int]:  # fmt: skip
    """Run one request through `app`; (status, body, chunks the app's receive handed out)."""
    import anyio

    sent: list[dict] = []
    handed = 0

    async def receive() -> dict:
        nonlocal handed
        if handed < len(chunks):
            handed += 1
            more = handed < len(chunks) or stall
            return {"type": "http.request", "body": chunks[handed - 1], "more_body": more}
        await anyio.sleep_forever()

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "headers": headers}
    await app(scope, receive, send)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], body, handed


async def test_a_declared_length_over_the_limit_is_refused_unread():
    app = BodyLimits(_echo_length, max_bytes=1024, read_timeout_s=5)
    status, body, handed = await _call(app, [(b"content-length", b"10485760")], [b"x" * 512])
    assert status == 413 and json.loads(body)["error"]["code"] == "body_too_large"
    assert handed == 0


async def test_a_chunked_body_is_refused_as_it_passes_the_limit():
    app = BodyLimits(_echo_length, max_bytes=1024, read_timeout_s=5)
    status, _, handed = await _call(app, [], [b"x" * 400] * 100)
    assert status == 413 and handed == 3


async def test_a_body_that_stops_coming_is_408():
    app = BodyLimits(_echo_length, max_bytes=1024, read_timeout_s=0.2)
    status, body, _ = await _call(app, [], [b"x" * 10], stall=True)
    assert status == 408 and json.loads(body)["error"]["code"] == "body_timeout"


async def test_a_body_within_the_limits_reaches_the_app_whole():
    app = BodyLimits(_echo_length, max_bytes=1024, read_timeout_s=5)
    assert await _call(app, [], [b"x" * 300] * 3) == (200, b"900", 3)


async def test_an_upload_route_has_a_larger_limit_of_its_own():
    app = BodyLimits(_echo_length, max_bytes=1024, read_timeout_s=5, larger={"/v1/files": 4096})
    assert await _call(app, [], [b"x" * 1000] * 4, path="/v1/files") == (200, b"4000", 4)
    status, _, _ = await _call(app, [], [b"x" * 1000] * 5, path="/v1/files")
    assert status == 413
    status, _, _ = await _call(
        app, [(b"content-length", b"4000")], [b"x" * 4000], path="/v1/conversations"
    )
    assert status == 413


async def test_a_deeply_nested_body_is_400_not_a_crash(client):
    response = await client.post("/v1/chat/completions", **raw_json("[" * 200_000))
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"]


async def test_a_completion_over_the_models_window_is_413_not_an_engine_error(
    settings, store, pipeline
):
    small = settings.replace(**{"max_model_len": 300})
    context = CountingContext(word_context(small))
    app = create_app(gateway_deps(small, store, pipeline, context))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app), base_url="http://test"
    ) as client:
        pipeline.script(delta("a", 0), done(1))
        response = await client.post(
            "/v1/chat/completions", json=completion("a few words"), headers=ALICE
        )
        assert response.status_code == 200
        assert context.tokenized == 0  # too short to need counting
        pipeline.script(delta("a", 0), done(1))
        response = await client.post(
            "/v1/chat/completions", json=completion("w " * 290), headers=ALICE
        )
        assert context.tokenized == 1
        assert response.status_code == 200  # 290 words fit 300 tokens
        response = await client.post(
            "/v1/chat/completions", json=completion("w " * 300), headers=ALICE
        )
        assert_error(response, 413, "context_too_long")
    assert len(pipeline.submitted) == 2


def test_a_gateway_run_alone_serves_no_docs_unless_asked(deps, settings):
    from chatpipe.wiring import gateway_server
    from gateway.edge.slow_clients import GuardedProtocol

    def docs_url(server) -> str | None:
        return server.config.app.openapi_url

    assert docs_url(gateway_server(deps, settings, docs_by_default=False)) is None
    asked = settings.replace(**{"api_docs": True})
    assert docs_url(gateway_server(deps, asked, docs_by_default=False)) == "/openapi.json"
    up = gateway_server(deps, settings)  # chatpipe up
    assert docs_url(up) == "/openapi.json"
    refused = settings.replace(**{"api_docs": False})
    assert docs_url(gateway_server(deps, refused)) is None
    assert issubclass(up.config.http, GuardedProtocol)
    assert up.config.http.header_timeout_s == settings.gateway.header_read_timeout_s


async def test_the_model_list_shows_what_the_callers_tier_may_use(client):
    async def listed(headers) -> list[str]:
        response = await client.get("/v1/models", headers=headers)
        return [card["id"] for card in response.json()["data"]]

    assert await listed(BOB) == ["tiny-random"]  # free: tiny only
    assert await listed(ALICE) == ["tiny-random", "big"]
