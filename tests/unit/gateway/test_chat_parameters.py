"""Every field of OpenAI's chat completion request honoured or refused: the
mapping to the engine's sampling, the refusals (400 naming the field), logprobs from the
engine to the answer, and `n` choices, in process through the official SDK (scripted
pipeline, see test_gateway_app)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import openai
import orjson
import pytest

from gateway.admission.gates import Admission, Ask
from gateway.admission.rate_limits import text_tokens
from gateway.api_document import api_document
from gateway.cache.rules import refusal as cache_refusal
from gateway.openai.chat_completions.protocol import (
    ACCEPTED,
    REFUSED,
    chat_sampling,
    check_parameters,
)
from gateway.refusals import Invalid, Refused, Unacceptable
from gateway.streaming.generation import merged_deltas
from safety.core import SafetyConfig, SafetyCore
from schemas import sse
from schemas.api import ChatCompletionRequest
from schemas.codec import encode
from schemas.events import (
    DeliveryError,
    Delta,
    GenerationDone,
    SamplingOptions,
    TokenChunk,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from schemas.lifecycle import RequestStatus
from tests.support.gateway import ALICE, delta, done
from tests.support.limits import small_limits
from workers.core import DEFAULT_PACING, Attempt, JsonOutputInterrupted, PriorOutput
from workers.engine import EngineOutput
from workers.failures import client_error
from workers.sim_engine import plan_reply, sim_logprobs
from workers.vllm_engine import sampling_params, token_logprobs

LIMITS = small_limits(max_choices=4)
USER = {"role": "user", "content": "hi"}
SCHEMA = {"type": "object", "required": ["city"], "properties": {"city": {"type": "string"}}}
# The fields of the `openai` package's chat completion request, as this version has them.
OPENAI_FIELDS = {
    "messages",
    "model",
    "audio",
    "frequency_penalty",
    "function_call",
    "functions",
    "logit_bias",
    "logprobs",
    "max_completion_tokens",
    "max_tokens",
    "metadata",
    "modalities",
    "moderation",
    "n",
    "parallel_tool_calls",
    "prediction",
    "presence_penalty",
    "prompt_cache_key",
    "prompt_cache_options",
    "prompt_cache_retention",
    "reasoning_effort",
    "response_format",
    "safety_identifier",
    "seed",
    "service_tier",
    "stop",
    "store",
    "stream",
    "stream_options",
    "temperature",
    "tool_choice",
    "tools",
    "top_logprobs",
    "top_p",
    "user",
    "verbosity",
    "web_search_options",
}


def completion(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "tiny-random", "messages": [USER], **fields}
    )


def refused(**fields) -> Refused:
    with pytest.raises(Refused) as refusal:
        check_parameters(completion(**fields), LIMITS)
    return refusal.value


def logprob(token: str, value: float = -0.5) -> TokenLogprob:
    return TokenLogprob(token=token, logprob=value, top=(TopLogprob(token=token, logprob=value),))


# --- the table ------------------------------------------------------------------------


def test_every_field_of_the_sdks_request_is_declared():
    from openai.types.chat.completion_create_params import CompletionCreateParamsStreaming

    params = CompletionCreateParamsStreaming
    assert params.__required_keys__ | params.__optional_keys__ == OPENAI_FIELDS
    assert set(ChatCompletionRequest.model_fields) >= OPENAI_FIELDS


def test_an_unknown_field_is_400_naming_it():
    refusal = refused(frobnicate=1)
    assert isinstance(refusal, Unacceptable)
    assert (refusal.code, refusal.param) == ("unknown_parameter", "frobnicate")
    assert "frobnicate" in str(refusal)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_field_chatpipe_cannot_honour_is_refused_unless_null(name):
    refusal = refused(**{name: {"any": "thing"}})
    assert isinstance(refusal, Unacceptable)
    assert (refusal.code, refusal.param) == ("unsupported_parameter", name)
    check_parameters(completion(**{name: None}), LIMITS)


@pytest.mark.parametrize(
    ("name", "good", "bad"),
    [
        ("service_tier", "auto", "priority"),
        ("service_tier", "default", "flex"),
        ("store", False, True),
        ("prompt_cache_retention", "in_memory", "24h"),
        ("modalities", ["text"], ["text", "audio"]),
    ],
)
def test_a_field_taking_a_few_values_refuses_the_others(name, good, bad):
    check_parameters(completion(**{name: good}), LIMITS)
    assert name in ACCEPTED
    refusal = refused(**{name: bad})
    assert (refusal.code, refusal.param) == ("unsupported_value", name)


@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        ({"top_logprobs": 3}, "invalid_value", "top_logprobs"),
        ({"top_logprobs": 3, "logprobs": False}, "invalid_value", "top_logprobs"),
        ({"n": 5}, "too_many_choices", "n"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "nope"}},
                }
            },
            "invalid_response_format",
            "response_format.json_schema.schema",
        ),
    ],
)
def test_bad_combinations_are_refused_naming_the_field(fields, code, param):
    refusal = refused(**fields)
    assert (refusal.code, refusal.param) == (code, param)
    assert isinstance(refusal, Invalid if code == "too_many_choices" else Unacceptable)


def test_accepted_fields_with_no_effect_pass():
    check_parameters(
        completion(
            user="u",
            safety_identifier="s",
            prompt_cache_key="k",
            metadata={"a": "b"},
            stream_options={"include_obfuscation": False},
            parallel_tool_calls=True,
        ),
        LIMITS,
    )


# --- the mapping ----------------------------------------------------------------------


def test_sampling_fields_reach_the_engines_options():
    sampling = chat_sampling(
        completion(
            presence_penalty=0.5,
            frequency_penalty=-1.0,
            logit_bias={"42": 100, "7": -100},
            seed=3,
            stop=["x"],
            max_completion_tokens=9,
            top_p=0.9,
            temperature=0.2,
            min_p=0.1,
            top_k=5,
            repetition_penalty=1.1,
            logprobs=True,
            top_logprobs=2,
        ),
        LIMITS,
    )
    assert sampling == SamplingOptions(
        max_tokens=9,
        temperature=0.2,
        top_p=0.9,
        seed=3,
        stop=("x",),
        presence_penalty=0.5,
        frequency_penalty=-1.0,
        logit_bias={42: 100.0, 7: -100.0},
        min_p=0.1,
        top_k=5,
        repetition_penalty=1.1,
        logprobs=2,
    )


def test_logprobs_without_top_logprobs_is_the_sampled_token_only():
    assert chat_sampling(completion(logprobs=True), LIMITS).logprobs == 0
    assert chat_sampling(completion(logprobs=False), LIMITS).logprobs is None


@pytest.mark.parametrize(
    ("response_format", "expected"),
    [
        ({"type": "text"}, {}),
        ({"type": "json_object"}, {"json_object": True}),
        (
            {
                "type": "json_schema",
                "json_schema": {"name": "city", "schema": SCHEMA, "strict": True},
            },
            {"json_schema": SCHEMA},
        ),
        ({"type": "json_schema", "json_schema": {"name": "any"}}, {"json_object": True}),
    ],
)
def test_response_format_becomes_a_json_constraint(response_format, expected):
    sampling = chat_sampling(completion(response_format=response_format), LIMITS)
    assert {"json_object": sampling.json_object, "json_schema": sampling.json_schema} == {
        "json_object": False,
        "json_schema": None,
        **expected,
    }


def test_unset_options_leave_the_requests_json_short():
    assert json.loads(encode(SamplingOptions())) == {
        "max_tokens": 256,
        "seed": None,
        "stop": [],
        "ignore_eos": False,
    }
    chunk = TokenChunk(
        request_id="r",
        seq=0,
        conversation_id="c",
        message_id="m",
        model="t",
        reply_to="d",
        text="a",
        token_count=1,
        completion_tokens=1,
    )
    assert "logprobs" not in json.loads(encode(chunk))
    assert "logprobs" not in json.loads(encode(Delta(request_id="r", text="a")))


def test_the_engines_sampling_params_carry_each_option():
    params = sampling_params(
        SamplingOptions(
            presence_penalty=0.5,
            frequency_penalty=0.25,
            repetition_penalty=1.2,
            min_p=0.05,
            top_k=7,
            logit_bias={3: 5.0},
            logprobs=2,
            json_schema=SCHEMA,
            seed=1,
        )
    )
    assert (
        params.presence_penalty,
        params.frequency_penalty,
        params.repetition_penalty,
        params.min_p,
        params.top_k,
        params.logit_bias,
        params.logprobs,
        params.seed,
    ) == (0.5, 0.25, 1.2, 0.05, 7, {3: 5.0}, 2, 1)
    assert params.structured_outputs.json == SCHEMA
    assert sampling_params(SamplingOptions(json_object=True)).structured_outputs.json_object
    plain = sampling_params(SamplingOptions())
    assert (plain.structured_outputs, plain.logprobs, plain.presence_penalty) == (None, None, 0.0)
    assert (plain.temperature, plain.top_p) == (1.0, 1.0)  # vLLM's own


def test_what_a_request_leaves_unset_takes_the_models_sampling_defaults():
    model = {"temperature": 0.3, "top_p": 0.9, "repetition_penalty": 1.1, "max_tokens": 99}
    unset = sampling_params(SamplingOptions(max_tokens=7), model)
    assert (unset.temperature, unset.top_p, unset.repetition_penalty) == (0.3, 0.9, 1.1)
    assert unset.max_tokens == 7  # the request's (its default is the gateway's)
    given = sampling_params(SamplingOptions(temperature=0.8, top_p=0.5), model)
    assert (given.temperature, given.top_p, given.repetition_penalty) == (0.8, 0.5, 1.1)


def test_vllms_logprobs_become_the_tokens_with_their_likeliest_by_rank():
    def found(value, rank, token):
        return SimpleNamespace(logprob=value, rank=rank, decoded_token=token)

    # vLLM puts the sampled token first, then the top ones; the sampled one ranked 2nd.
    step = {5: found(-1.5, 2, "b"), 4: found(-0.3, 1, "a"), 6: found(float("-inf"), 3, "c")}
    [entry] = token_logprobs([5], [step], 2, tokenizer=None)
    assert (entry.token, entry.logprob) == ("b", -1.5)
    assert [(t.token, t.logprob) for t in entry.top] == [("a", -0.3), ("b", -1.5)]
    [sampled_only] = token_logprobs([5], [step], 0, tokenizer=None)
    assert sampled_only.top == ()
    assert token_logprobs([6], [step], 3, None)[0].logprob == -9999.0
    assert token_logprobs([5], [step], None, None) == ()


# --- logprobs through the worker, safety and the gateway --------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_chunk_carries_the_logprobs_of_the_outputs_it_coalesces():
    request = plan_request(logprobs=1)
    clock = Clock()
    attempt = Attempt(request, "w", DEFAULT_PACING, clock, clock)
    first = attempt.output(EngineOutput("a", 1, 1, 3, logprobs=(logprob("a"),)), 1)
    held = attempt.output(EngineOutput("b", 1, 2, 3, logprobs=(logprob("b"),)), 1)
    assert held is None and [e.token for e in first.logprobs] == ["a"]
    assert [e.token for e in attempt.tail().logprobs] == ["b"]


STREAM = dict(request_id="r", conversation_id="c", message_id="m", model="t", reply_to="d")


@pytest.mark.parametrize("window_chars", [0, 3])
def test_safety_releases_a_chunks_logprobs_with_the_end_of_its_text(window_chars):
    """A gate holding back the last characters holds the logprobs of their chunks too;
    every one comes out, in order, by the end."""
    core = SafetyCore(SafetyConfig(window_chars=window_chars))
    delivered: list[tuple[str, list[str]]] = []
    for seq, (text, tokens) in enumerate([("ab", "ab"), ("cd", "cd")]):
        chunk = TokenChunk(
            **STREAM,
            seq=seq,
            text=text,
            token_count=2,
            completion_tokens=2,
            logprobs=tuple(logprob(t) for t in tokens),
        )
        delivered += _deltas(core.checked(core.on_event(chunk, 0, seq, 0.0), None))
    end = GenerationDone(**STREAM, seq=2, status=RequestStatus.FINISHED_STOPPED, usage=Usage())
    delivered += _deltas(core.on_event(end, 0, 2, 0.0))
    assert "".join(text for text, _ in delivered) == "abcd"
    assert [token for _, tokens in delivered for token in tokens] == list("abcd")
    if window_chars:
        assert delivered[0] == ("a", [])  # "b" is held: its chunk's logprobs wait for it


def _deltas(outputs: list) -> list[tuple[str, list[str]]]:
    return [
        (o.event.text, [e.token for e in o.event.logprobs])
        for o in outputs
        if isinstance(getattr(o, "event", None), Delta)
    ]


def test_merged_deltas_keep_every_logprob_in_order():
    merged = merged_deltas(
        [
            Delta(request_id="r", seq=0, text="a", logprobs=(logprob("a"),)),
            Delta(request_id="r", seq=1, text="b", logprobs=(logprob("b"),)),
        ]
    )
    assert [(d.text, [e.token for e in d.logprobs]) for d in merged] == [("ab", ["a", "b"])]


def test_a_logprobs_request_is_not_answered_from_the_response_cache():
    request = plan_request(logprobs=0).model_copy(
        update={"sampling": SamplingOptions(temperature=0, logprobs=0)}
    )
    assert cache_refusal(request) == "logprobs"


# --- the sim engine and continuations ---------------------------------------------------


def plan_request(**sampling):
    from schemas.events import ChatMessage, GenerationRequest, Role

    return GenerationRequest(
        request_id="r",
        conversation_id="c",
        message_id="m",
        user_id="u",
        org_id="o",
        tier="free",
        model="tiny-random",
        reply_to="d",
        messages=(ChatMessage(role=Role.USER, content="[[sim:reply=one two]]"),),
        sampling=SamplingOptions(**sampling),
    )


def test_the_sim_answers_a_json_format_with_json_of_the_schema():
    import jsonschema

    text = "".join(plan_reply(plan_request(json_schema=SCHEMA)).tokens)
    jsonschema.validate(json.loads(text), SCHEMA)
    assert json.loads("".join(plan_reply(plan_request(json_object=True)).tokens)) == {}


def test_the_sims_logprobs_are_certain():
    assert [(e.token, e.logprob, len(e.top)) for e in sim_logprobs(("a", " b"), 1)] == [
        ("a", 0.0, 1),
        (" b", 0.0, 1),
    ]
    assert sim_logprobs(("a",), None) == ()


def test_a_json_answer_an_earlier_attempt_started_ends_in_an_error():
    request = plan_request(json_object=True)
    attempt = Attempt(request, "w", DEFAULT_PACING, Clock(), Clock())
    with pytest.raises(JsonOutputInterrupted) as interrupted:
        attempt.resume(PriorOutput("{", 1, 1, False))
    assert client_error(interrupted.value).code == "output_interrupted"


# --- the API document -------------------------------------------------------------------


def test_the_document_says_what_is_refused(app):
    document = api_document(app, LIMITS)
    schema = document["components"]["schemas"]["ChatCompletionRequest"]
    assert schema["additionalProperties"] is False
    assert schema["properties"]["audio"]["type"] == "null"
    assert {"enum": ["auto", "default"]} in schema["properties"]["service_tier"]["anyOf"]
    assert schema["properties"]["n"]["maximum"] == 4


# --- through the SDK -------------------------------------------------------------------


async def test_the_sdk_gets_400_naming_an_unknown_field(sdk, pipeline):
    with pytest.raises(openai.BadRequestError) as bad:
        await sdk.chat.completions.create(
            model="tiny-random", messages=[USER], extra_body={"frobnicate": True}
        )
    assert bad.value.code == "unknown_parameter"
    assert bad.value.body["param"] == "frobnicate"
    with pytest.raises(openai.BadRequestError) as audio:
        await sdk.chat.completions.create(
            model="tiny-random", messages=[USER], audio={"voice": "alloy", "format": "mp3"}
        )
    assert (audio.value.code, audio.value.body["param"]) == ("unsupported_parameter", "audio")
    assert pipeline.submitted == []


async def test_logprobs_come_back_in_the_answer(sdk, pipeline):
    pipeline.script(
        Delta(request_id="-", seq=0, text="Hel", logprobs=(logprob("Hel"),)),
        Delta(request_id="-", seq=1, text="lo", logprobs=(logprob("lo", -1.0),)),
        done(2),
    )
    answer = await sdk.chat.completions.create(
        model="tiny-random", messages=[USER], logprobs=True, top_logprobs=1
    )
    content = answer.choices[0].logprobs.content
    assert [(e.token, e.logprob, e.bytes) for e in content] == [
        ("Hel", -0.5, list(b"Hel")),
        ("lo", -1.0, list(b"lo")),
    ]
    assert [t.token for t in content[0].top_logprobs] == ["Hel"]
    assert pipeline.submitted[0].sampling.logprobs == 1


async def test_logprobs_come_back_in_the_stream(sdk, pipeline):
    pipeline.script(
        Delta(request_id="-", seq=0, text="Hel", logprobs=(logprob("Hel"),)),
        Delta(request_id="-", seq=1, text="lo", logprobs=(logprob("lo"),)),
        done(2),
    )
    stream = await sdk.chat.completions.create(
        model="tiny-random", messages=[USER], logprobs=True, stream=True
    )
    chunks = [chunk async for chunk in stream]
    tokens = [
        e.token for c in chunks for ch in c.choices if ch.logprobs for e in ch.logprobs.content
    ]
    assert "".join(tokens) == "Hello"


async def test_without_logprobs_the_answer_has_none(sdk, pipeline):
    pipeline.script(delta("Hi", 0), done(1))
    answer = await sdk.chat.completions.create(model="tiny-random", messages=[USER])
    assert answer.choices[0].logprobs is None


async def test_n_choices_are_n_generations_with_usage_of_all(sdk, pipeline):
    pipeline.script(delta("one", 0), done(1))
    pipeline.script(delta("two", 0), done(1))
    answer = await sdk.chat.completions.create(model="tiny-random", messages=[USER], n=2, seed=7)
    assert [(c.index, c.message.content) for c in answer.choices] == [(0, "one"), (1, "two")]
    first, second = pipeline.submitted
    assert first.request_id != second.request_id
    assert (first.sampling.seed, second.sampling.seed) == (7, 8)
    assert answer.usage.completion_tokens == 4 and answer.usage.prompt_tokens == 7


async def test_n_streamed_choices_carry_their_index(client, pipeline):
    pipeline.script(delta("one", 0), done(1))
    pipeline.script(delta("two", 0), done(1))
    response = await client.post(
        "/v1/chat/completions",
        headers=ALICE,
        json={
            "model": "tiny-random",
            "messages": [USER],
            "n": 2,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    messages = sse.parse_messages(response.text)
    chunks = [orjson.loads(m.data) for m in messages if not m.is_done]
    text = {0: "", 1: ""}
    reasons = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            text[choice["index"]] += choice["delta"].get("content") or ""
            if choice["finish_reason"]:
                reasons[choice["index"]] = choice["finish_reason"]
    assert text == {0: "one", 1: "two"} and reasons == {0: "stop", 1: "stop"}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4
    assert messages[-1].is_done


@pytest.mark.parametrize("n", [1, 3])
async def test_n_choices_reserve_n_answers_against_the_token_limits(sdk, pipeline, monkeypatch, n):
    charged: list[tuple[int, int]] = []

    async def admit(self, owner, tokens, model, generations=1):
        charged.append((tokens, generations))
        return Ask(owner, model, tokens, generations)

    monkeypatch.setattr(Admission, "admit", admit)
    for _ in range(n):
        pipeline.script(delta("x", 0), done(1))
    await sdk.chat.completions.create(model="tiny-random", messages=[USER], n=n, max_tokens=9)
    assert charged == [(text_tokens(["hi"], 9 * n), n)]
    assert len(pipeline.submitted) == n


async def test_a_choice_that_fails_fails_the_completion(sdk, pipeline):
    pipeline.script(delta("one", 0), done(1))
    pipeline.script(DeliveryError(request_id="-", code="engine_error", message="boom"))
    with pytest.raises(openai.InternalServerError):
        await sdk.chat.completions.create(model="tiny-random", messages=[USER], n=2)


async def test_a_streamed_choice_that_fails_ends_the_stream_and_cancels_the_others(
    client, pipeline
):
    pipeline.script(delta("one", 0), hold=True)
    pipeline.script(DeliveryError(request_id="-", code="engine_error", message="boom"))
    response = await client.post(
        "/v1/chat/completions",
        headers=ALICE,
        json={"model": "tiny-random", "messages": [USER], "n": 2, "stream": True},
    )
    messages = sse.parse_messages(response.text)
    errors = [
        json.loads(m.data)["error"]["code"]
        for m in messages
        if not m.is_done and "error" in json.loads(m.data)
    ]
    assert errors == ["engine_error"] and messages[-1].is_done
    first, _ = pipeline.submitted
    assert [request_id for request_id, _ in pipeline.cancelled] == [first.request_id]


class Vocabulary:
    """A context builder's vocabulary answer, for the logit_bias check."""

    async def vocab_size(self, model: str) -> int:
        return 100


async def test_logit_bias_names_only_tokens_the_model_has():
    from gateway.openai.chat_completions.serving import check_logit_bias

    await check_logit_bias(Vocabulary(), plan_request(logit_bias={99: 1.0}))
    await check_logit_bias(Vocabulary(), plan_request())
    with pytest.raises(Unacceptable) as refused_bias:
        await check_logit_bias(Vocabulary(), plan_request(logit_bias={5: 1.0, 100: -1.0}))
    assert (refused_bias.value.code, refused_bias.value.param) == (
        "invalid_logit_bias",
        "logit_bias",
    )
