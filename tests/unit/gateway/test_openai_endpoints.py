"""`/v1/completions` and `/v1/embeddings` in process: the request each
maps to, every field honoured or refused with a 400 naming it, the answer's shape through
the official `openai` SDK, with a scripted pipeline and a stand-in embedding model."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import numpy as np
import openai
import orjson
import pytest

from chatpipe.settings import Settings
from chatpipe.wiring import gateway_config
from common.embeddings import BUNDLED_MODEL, EmbeddingModel
from conversations.store import ApiKey
from gateway.admission.rate_limits import RateLimiter, storage_from_uri
from gateway.app import create_app
from gateway.cache.rules import refusal
from gateway.context.builder import ContextBuilder
from gateway.context.tokens import TokenCounter
from gateway.deps import GatewayDeps
from gateway.openai.completions.protocol import completion_prompt, to_generation_request
from gateway.openai.embeddings.api_router import (
    check_input_tokens,
    embedding_inputs,
    embedding_list,
)
from gateway.refusals import TooLarge, Unacceptable
from moderation.classifiers import RuleClassifier
from moderation.policy import SafetyPolicy
from schemas import sse
from schemas.api import CompletionRequest, EmbeddingRequest
from schemas.events import Delta, Retract, TokenLogprob, TopLogprob
from schemas.lifecycle import RequestStatus
from schemas.topics import Tier
from tests.support.chat import until
from tests.support.documents import WordEmbedder
from tests.support.gateway import (
    ALICE,
    ModeratedPipeline,
    WordTokenizer,
    assert_error,
    delta,
    disconnect_after_hold,
    done,
    gateway_deps,
)
from workers.sim_engine import plan_reply, prompt_token_count

OWNER = ApiKey("alice", "org-a", Tier.PRO)


class FakeEmbeddingModel(WordEmbedder):
    """`EmbeddingModel` by hashed words: a token a word plus two (as [CLS] and [SEP]);
    `gate`, when set, holds every `embed` until it is set."""

    max_input_tokens = 8

    def __init__(self) -> None:
        super().__init__(dims=16)
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    @property
    def dimensions(self) -> int:
        return self.dims

    def token_counts(self, texts: list[str]) -> list[int]:
        return [len(text.split()) + 2 for text in texts]

    def embed(self, texts: list[str]) -> np.ndarray:
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        return super().embed(texts)


class VocabularyWordTokenizer(WordTokenizer):
    """A word a token, in a vocabulary of 1,000 (what `logit_bias` is checked against)."""

    def __len__(self) -> int:
        return 1000


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        model_name="tiny-random",
        max_message_chars=60,
        default_max_tokens=32,
        max_tokens_limit=100,
        max_model_len=20,
        max_embedding_inputs=3,
        user_requests_per_minute=100,
        user_tokens_per_minute=10_000_000,
        org_tokens_per_minute=10_000_000,
        database_path=tmp_path / "chat.db",
    )


@pytest.fixture
def embedder() -> FakeEmbeddingModel:
    return FakeEmbeddingModel()


@pytest.fixture
def pipeline() -> ModeratedPipeline:
    """The request-limits tests' pipeline (not the gateway folder's plain scripted one)."""
    return ModeratedPipeline()


@pytest.fixture
def deps(settings, store, pipeline, embedder, limiter) -> GatewayDeps:
    """The deployment's gateway, counting words for tokens, with the stand-in embedding
    model; `forbidden` is blocked by the input check."""
    built = ContextBuilder.from_config(gateway_config(settings).context)
    context = ContextBuilder(system_prompt="", policy=built.policy,
                             counter=lambda model: TokenCounter(VocabularyWordTokenizer()),
                             embedder=lambda: embedder)  # fmt: skip
    safety = SafetyPolicy(input={"*": [RuleClassifier({"banned": ["forbidden"]})]})
    return gateway_deps(settings, store, pipeline, context, rate_limiter=limiter, safety=safety)


@pytest.fixture
async def app(deps: GatewayDeps):
    yield create_app(deps)
    await deps.background.close()


@pytest.fixture
async def client(app) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client


@pytest.fixture
async def sdk(client) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url="http://test/v1", api_key="key-alice",
                                  http_client=client, max_retries=0) as sdk:  # fmt: skip
        yield sdk


# --- /v1/completions: the request -----------------------------------------------------


async def test_a_completion_queues_its_prompt_untemplated_with_its_sampling(sdk, pipeline):
    pipeline.script(delta("Hel", 0), delta("lo", 1), done(2, RequestStatus.FINISHED_LENGTH))
    completion = await sdk.completions.create(
        model="tiny-random",
        prompt="Once upon a time",
        max_tokens=9,
        temperature=0.5,
        top_p=0.9,
        seed=7,
        stop=["\n", "."],
        user="u-1",
    )
    [request] = pipeline.submitted
    assert request.prompt == "Once upon a time" and request.messages == ()
    assert request.last_user_message == "Once upon a time"
    sampling = request.sampling
    assert (
        sampling.max_tokens,
        sampling.temperature,
        sampling.top_p,
        sampling.seed,
        sampling.stop,
    ) == (9, 0.5, 0.9, 7, ("\n", "."))
    assert not request.store and request.user_id == "alice"
    assert completion.object == "text_completion"
    assert completion.id == f"cmpl-{request.request_id}" and completion.model == "tiny-random"
    [choice] = completion.choices
    assert (choice.text, choice.finish_reason, choice.index) == ("Hello", "length", 0)
    assert (
        completion.usage.prompt_tokens,
        completion.usage.completion_tokens,
        completion.usage.total_tokens,
    ) == (7, 2, 9)


async def test_max_tokens_defaults_to_openais_16_and_a_list_of_one_prompt_is_taken(sdk, pipeline):
    pipeline.script(delta("x", 0), done(1))
    await sdk.completions.create(model="tiny-random", prompt=["just one"])
    [request] = pipeline.submitted
    assert request.prompt == "just one" and request.sampling.max_tokens == 16


async def test_echo_puts_the_prompt_before_the_completion(sdk, pipeline):
    pipeline.script(delta(" world", 0), done(1))
    completion = await sdk.completions.create(model="tiny-random", prompt="Hello", echo=True)
    assert completion.choices[0].text == "Hello world"
    pipeline.script(delta(" world", 0), done(1))
    stream = await sdk.completions.create(
        model="tiny-random", prompt="Hello", echo=True, stream=True
    )
    assert "".join([c.choices[0].text async for c in stream if c.choices]) == "Hello world"


async def test_a_streamed_completion_sends_text_completion_chunks_then_usage_then_done(
    client, pipeline
):
    pipeline.script(delta("Hel", 0), delta("lo", 1), done(2))
    response = await client.post(
        "/v1/completions",
        headers=ALICE,
        json={
            "model": "tiny-random",
            "prompt": "Say",
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    assert response.headers["content-type"].startswith("text/event-stream")
    messages = sse.parse_messages(response.text)
    assert messages[-1].is_done and all(m.event is None for m in messages)
    chunks = [orjson.loads(m.data) for m in messages[:-1]]
    assert {c["object"] for c in chunks} == {"text_completion"}
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("cmpl-")
    texts = [(c["choices"][0]["text"], c["choices"][0]["finish_reason"]) for c in chunks[:-1]]
    assert "".join(t for t, _ in texts) == "Hello" and texts[-1][1] == "stop"
    assert [reason for _, reason in texts[:-1]] == [None] * (len(texts) - 1)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 9


async def test_a_retracted_completion_ends_content_filter_with_the_replacement(sdk, pipeline):
    pipeline.script(
        delta("bad", 0),
        Retract(request_id="-", seq=1, message_id="m", reason="policy", replacement="[removed]"),
        done(2),
    )
    completion = await sdk.completions.create(model="tiny-random", prompt="x")
    assert completion.choices[0].text == "[removed]"
    assert completion.choices[0].finish_reason == "content_filter"


@pytest.mark.parametrize("stream", [True, False])
async def test_a_client_that_goes_cancels_its_completion(app, pipeline, stream):
    pipeline.script(delta("partial", 0), hold=True)
    body = {"model": "tiny-random", "prompt": "hi", "stream": stream}
    await disconnect_after_hold(app, pipeline, "/v1/completions", body)
    assert pipeline.cancelled == [(pipeline.submitted[0].request_id, "client_disconnected")]
    assert pipeline.streams[0].closed


def test_a_completion_is_never_answered_from_the_response_cache(settings):
    body = CompletionRequest(model="tiny-random", prompt="p", temperature=0)
    request = to_generation_request(body, OWNER, gateway_config(settings), "r")
    assert refusal(request) == "other_input"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("n", 2),
        ("best_of", 3),
        ("suffix", "end"),
        ("logprobs", 2),
    ],
)
async def test_fields_chatpipe_cannot_honour_are_400_naming_them(client, pipeline, field, value):
    body = {"model": "tiny-random", "prompt": "x", field: value}
    if field == "logprobs":
        body["echo"] = True  # the prompt's log probabilities are not returned
    response = await client.post("/v1/completions", headers=ALICE, json=body)
    assert assert_error(response, 400, "unsupported_parameter")["param"] == field
    assert pipeline.submitted == []


def logged(text: str, seq: int, *tokens: tuple[str, float]) -> Delta:
    return Delta(
        request_id="-",
        seq=seq,
        text=text,
        logprobs=tuple(
            TokenLogprob(token=t, logprob=p, top=(TopLogprob(token=t, logprob=p),))
            for t, p in tokens
        ),
    )


LOGGED = [logged("Hel", 0, ("H", -0.5), ("el", -1.0)), logged("lo", 1, ("lo", -0.25))]


async def test_a_completions_logprobs_come_in_openais_legacy_shape(sdk, pipeline):
    pipeline.script(*LOGGED, done(2))
    whole = await sdk.completions.create(model="tiny-random", prompt="x", logprobs=1)
    assert pipeline.submitted[0].sampling.logprobs == 1
    logprobs = whole.choices[0].logprobs
    assert logprobs.tokens == ["H", "el", "lo"] and whole.choices[0].text == "Hello"
    assert logprobs.token_logprobs == [-0.5, -1.0, -0.25]
    assert logprobs.top_logprobs == [{"H": -0.5}, {"el": -1.0}, {"lo": -0.25}]
    assert logprobs.text_offset == [0, 1, 3]

    pipeline.script(*LOGGED, done(2))
    stream = await sdk.completions.create(model="tiny-random", prompt="x", logprobs=1, stream=True)
    chunks = [chunk.choices[0] async for chunk in stream if chunk.choices]
    shown = [c.logprobs for c in chunks if c.logprobs is not None]  # deltas may come joined
    assert [t for lp in shown for t in lp.tokens] == logprobs.tokens
    assert [o for lp in shown for o in lp.text_offset] == logprobs.text_offset
    assert chunks[-1].logprobs is None and chunks[-1].finish_reason == "stop"


async def test_a_completion_without_logprobs_has_none(sdk, pipeline):
    pipeline.script(*LOGGED, done(2))
    whole = await sdk.completions.create(model="tiny-random", prompt="x")
    assert whole.choices[0].logprobs is None and pipeline.submitted[0].sampling.logprobs is None


async def test_their_defaults_are_taken(client, pipeline):
    pipeline.script(delta("x", 0), done(1))
    response = await client.post(
        "/v1/completions",
        headers=ALICE,
        json={
            "model": "tiny-random",
            "prompt": "x",
            "n": 1,
            "best_of": 1,
            "logprobs": None,
            "suffix": None,
            "echo": False,
        },
    )
    assert response.status_code == 200, response.text


async def test_sampling_parameters_pass_to_the_engine_as_a_chat_completions_do(sdk, pipeline):
    pipeline.script(delta("x", 0), done(1))
    await sdk.completions.create(
        model="tiny-random",
        prompt="x",
        presence_penalty=0.5,
        frequency_penalty=-1.0,
        logit_bias={"0": -100},
        extra_body={"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.2},
    )
    sampling = pipeline.submitted[0].sampling
    assert (
        sampling.presence_penalty,
        sampling.frequency_penalty,
        sampling.logit_bias,
        sampling.top_k,
        sampling.min_p,
        sampling.repetition_penalty,
    ) == (0.5, -1.0, {0: -100}, 5, 0.1, 1.2)


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"prompt": [1, 2, 3]}, 400, "unsupported_prompt", "prompt"),
        ({"prompt": [[1, 2], [3]]}, 400, "unsupported_prompt", "prompt"),
        ({"prompt": ["one", "two"]}, 400, "unsupported_prompt", "prompt"),
        ({"prompt": []}, 400, "unsupported_prompt", "prompt"),
        ({"prompt": ""}, 400, "empty_prompt", "prompt"),
        ({"prompt": "x" * 61}, 413, "prompt_too_long", "prompt"),
        ({"prompt": "x", "max_tokens": 101}, 422, "max_tokens_too_large", "max_tokens"),
        ({"prompt": "x", "temperature": 3}, 422, "invalid_request", "temperature"),
        ({"prompt": "x", "functions": []}, 400, "unknown_parameter", "functions"),
        ({"prompt": "x", "logit_bias": {"1000": 5}}, 400, "invalid_logit_bias", "logit_bias"),
        ({"prompt": "x", "model": "gpt-9"}, 404, "model_not_found", "model"),
        ({"prompt": "x", "model": BUNDLED_MODEL}, 404, "model_not_found", "model"),
        ({"prompt": "a forbidden word"}, 400, "content_blocked", "content"),
        ({"prompt": "a " * 25}, 413, "context_too_long", "prompt"),
    ],
)
async def test_bad_completions_are_refused_with_a_json_error_naming_the_field(
    client, pipeline, body, status, code, param
):
    response = await client.post(
        "/v1/completions", headers=ALICE, json={"model": "tiny-random", **body}
    )
    assert assert_error(response, status, code)["param"] == param
    assert pipeline.submitted == []


def test_a_prompt_is_one_string():
    assert completion_prompt(["a b"], 10) == "a b"
    with pytest.raises(Unacceptable):
        completion_prompt([[1]], 10)
    with pytest.raises(TooLarge):
        completion_prompt("x" * 11, 10)


def test_a_completion_is_a_fresh_unstored_request_of_its_owner(settings):
    config = gateway_config(settings)
    body = CompletionRequest(model="tiny-random", prompt="p", ignore_eos=True)
    request = to_generation_request(body, OWNER, config, "chat.deliver.gw")
    other = to_generation_request(body, OWNER, config, "chat.deliver.gw")
    assert request.conversation_id != other.conversation_id
    assert (request.tier, request.cache_salt, request.store) == (Tier.PRO, "org-a", False)
    assert request.sampling.ignore_eos and request.prompt == "p"
    assert "prompt" in request.model_dump(mode="json")
    assert "prompt" not in request.model_copy(update={"prompt": None}).model_dump(mode="json")


def test_the_sim_engine_answers_a_prompt_as_it_would_a_message():
    request = to_generation_request(
        CompletionRequest(model="tiny-random", prompt="a b [[sim:reply=hi there]]"),
        OWNER,
        gateway_config(Settings(model_name="tiny-random")),
        "r",
    )
    assert "".join(plan_reply(request).tokens) == "hi there"
    assert prompt_token_count(request) == 4


def test_the_engine_tokenizes_a_prompt_as_it_is(tiny_model_dir):
    from transformers import AutoTokenizer

    from workers.vllm_engine import VllmEngine

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    text = f"{tokenizer.eos_token}plain text, no template"
    request = to_generation_request(
        CompletionRequest(model="tiny-random", prompt=text),
        OWNER,
        gateway_config(Settings(model_name="tiny-random")),
        "r",
    )
    engine = SimpleNamespace(_tokenizer=tokenizer)
    prompt, prompt_tokens = VllmEngine._prompt(engine, request, None)
    assert prompt["prompt_token_ids"] == tokenizer.encode(text, add_special_tokens=True)
    assert tokenizer.eos_token_id in prompt["prompt_token_ids"]  # the caller's own tokens
    assert prompt_tokens == TokenCounter(tokenizer).count_completion_prompt(text)
    assert prompt["cache_salt"] == "org-a"


async def test_completions_are_charged_to_the_rate_limits(settings, store, pipeline, limiter):
    settings = settings.replace(**{"user_requests_per_minute": 1})
    deps = gateway_deps(
        settings,
        store,
        pipeline,
        rate_limiter=RateLimiter(
            gateway_config(settings).rate_limits, storage_from_uri("memory://")
        ),
    )
    transport = httpx.ASGITransport(create_app(deps))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        pipeline.script(delta("x", 0), done(1))
        first = await client.post(
            "/v1/completions", headers=ALICE, json={"model": "tiny-random", "prompt": "x"}
        )
        assert first.status_code == 200
        second = await client.post(
            "/v1/completions", headers=ALICE, json={"model": "tiny-random", "prompt": "x"}
        )
        assert_error(second, 429, "rate_limited")
    assert len(pipeline.submitted) == 1


# --- /v1/embeddings -------------------------------------------------------------------


async def test_embeddings_as_floats_and_base64_in_input_order(sdk, embedder):
    texts = ["the cat sat", "a dog barked loudly"]
    floats = await sdk.embeddings.create(model=BUNDLED_MODEL, input=texts, encoding_format="float")
    expected = WordEmbedder(dims=16).embed(texts)
    assert [e.index for e in floats.data] == [0, 1] and floats.model == BUNDLED_MODEL
    assert np.allclose(np.array([e.embedding for e in floats.data]), expected)
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == 3 + 2 + 4 + 2
    raw = await sdk.embeddings.with_raw_response.create(
        model=BUNDLED_MODEL, input="the cat sat", encoding_format="base64"
    )
    encoded = orjson.loads(raw.content)["data"][0]["embedding"]
    vector = np.frombuffer(base64.b64decode(encoded), dtype="<f4")
    assert np.array_equal(vector, expected[0])
    assert embedder.calls == [2, 1]


async def test_an_embedding_is_billed_on_chat_usage_and_a_refused_one_is_not(sdk, client, pipeline):
    answer = await sdk.embeddings.create(model=BUNDLED_MODEL, input=["the cat sat", "a dog"])
    refused = await client.post(
        "/v1/embeddings", headers=ALICE, json={"model": BUNDLED_MODEL, "input": ["a", ""]}
    )
    assert refused.status_code == 400

    [usage] = pipeline.usage_events
    assert (usage.user_id, usage.org_id, usage.model) == ("alice", "org-a", BUNDLED_MODEL)
    assert usage.prompt_tokens == answer.usage.prompt_tokens == 3 + 2 + 2 + 2
    assert (usage.completion_tokens, usage.cached_tokens, usage.gpu_ms) == (0, 0, 0.0)
    assert usage.status == RequestStatus.FINISHED_STOPPED
    assert usage.request_id.startswith("emb-") and usage.conversation_id == ""


async def test_the_sdks_default_base64_decodes_to_the_floats(sdk):
    default = await sdk.embeddings.create(model=BUNDLED_MODEL, input="the cat sat")
    floats = await sdk.embeddings.create(
        model=BUNDLED_MODEL, input="the cat sat", encoding_format="float", dimensions=16
    )
    assert np.allclose(default.data[0].embedding, floats.data[0].embedding)


async def test_the_models_list_names_the_embedding_model_and_each_models_kind(sdk):
    models = (await sdk.models.list()).data
    assert [(m.id, m.kind) for m in models] == [
        ("tiny-random", "chat"),
        (BUNDLED_MODEL, "embedding"),
    ]
    started = {m.created for m in models}
    assert len(started) == 1 and abs(started.pop() - time.time()) < 600
    assert [m.created for m in (await sdk.models.list()).data] == [m.created for m in models]


async def test_a_model_is_retrieved_by_its_id(sdk):
    listed = {m.id: m for m in (await sdk.models.list()).data}
    for model in ("tiny-random", BUNDLED_MODEL):
        assert await sdk.models.retrieve(model) == listed[model]


async def test_an_unknown_model_is_not_found_naming_it(client):
    response = await client.get("/v1/models/gpt-9", headers={"Authorization": "Bearer key-alice"})
    assert response.status_code == 404
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("model_not_found", "model")
    assert "gpt-9" in error["message"]


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"input": [1, 2]}, 400, "unsupported_input", "input"),
        ({"input": [[1, 2]]}, 400, "unsupported_input", "input"),
        ({"input": []}, 400, "empty_input", "input"),
        ({"input": ""}, 400, "empty_input", "input"),
        ({"input": ["a", ""]}, 400, "empty_input", "input.1"),
        ({"input": ["a", "b", "c", "d"]}, 413, "too_many_inputs", "input"),
        (
            {"input": ["short", "one two three four five six seven"]},
            413,
            "input_too_long",
            "input.1",
        ),
        ({"input": "x", "dimensions": 8}, 400, "unsupported_dimensions", "dimensions"),
        ({"input": "x", "encoding_format": "int8"}, 422, "invalid_request", "encoding_format"),
        ({"input": "x", "truncate": True}, 400, "unknown_parameter", "truncate"),
        ({"input": "x", "model": "tiny-random"}, 404, "model_not_found", "model"),
    ],
)
async def test_bad_embedding_requests_are_refused_with_a_json_error(
    client, embedder, body, status, code, param
):
    response = await client.post(
        "/v1/embeddings", headers=ALICE, json={"model": BUNDLED_MODEL, **body}
    )
    assert assert_error(response, status, code)["param"] == param
    assert embedder.calls == []


async def test_embeddings_need_a_key(client):
    response = await client.post("/v1/embeddings", json={"model": BUNDLED_MODEL, "input": "x"})
    assert_error(response, 401, "missing_api_key")


async def test_embedding_runs_off_the_event_loop(client, embedder):
    embedder.gate = threading.Event()
    import asyncio

    embedding = asyncio.create_task(
        client.post("/v1/embeddings", headers=ALICE, json={"model": BUNDLED_MODEL, "input": "x"})
    )
    await until(embedder.entered.is_set, timeout_s=None, interval_s=0.01)
    health = await client.get("/healthz")  # served while the model is busy
    assert health.status_code == 200 and not embedding.done()
    embedder.gate.set()
    assert (await embedding).status_code == 200


def test_embedding_inputs_and_answer_pure():
    body = EmbeddingRequest(model="m", input="one text")
    assert embedding_inputs(body, "m", 1) == ["one text"]
    with pytest.raises(TooLarge):
        check_input_tokens([3, 9], 8, "m")
    answer = embedding_list(np.eye(2, dtype=np.float32), [1, 2], "m", "float")
    assert [e.embedding for e in answer.data] == [[1.0, 0.0], [0.0, 1.0]]
    assert answer.usage.total_tokens == 3
    assert isinstance(FakeEmbeddingModel(), EmbeddingModel)
    assert not isinstance(WordEmbedder(), EmbeddingModel)


def test_the_api_document_declares_both_routes_and_the_completion_limits(deps, settings):
    document = create_app(deps).openapi()
    assert {"/v1/completions", "/v1/embeddings"} <= set(document["paths"])
    prompt = document["components"]["schemas"]["CompletionRequest"]["properties"]["prompt"]
    [text] = [branch for branch in prompt["anyOf"] if branch.get("type") == "string"]
    assert text["maxLength"] == settings.gateway.max_message_chars
    max_tokens = document["components"]["schemas"]["CompletionRequest"]["properties"]["max_tokens"]
    assert max_tokens["maximum"] == settings.gateway.max_tokens_limit
