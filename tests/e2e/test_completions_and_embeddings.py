"""`/v1/completions` and `/v1/embeddings` through the official `openai` SDK:
text completions on real vLLM (tiny model), streamed and not, from the prompt as
it is (no chat template); embeddings from the bundled all-MiniLM-L6-v2 in the gateway, as
floats and base64; completions' usage billed as chat's; bad input a 4xx JSON error."""

from __future__ import annotations

import base64
import uuid

import numpy as np
import openai
import pytest
from transformers import AutoTokenizer

from common.prompt import prompt_token_ids
from conversations.store import ApiKey
from ledger.charges import Account
from ledger.store import SQLiteLedger
from schemas.topics import Tier
from tests.support.limits import until_used
from tests.support.tool_calls import sdk

PROMPT = "The quick brown fox jumps over the lazy dog and"


async def as_owner(stack, user: str, org: str) -> openai.AsyncOpenAI:
    """The SDK with a new key of `user` in `org`."""
    key = f"key-{user}-{uuid.uuid4().hex[:6]}"
    await stack.store.add_api_key(key, ApiKey(user_id=user, org_id=org, tier=Tier.PRO))
    return openai.AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0)


# --- completions on real vLLM ---------------------------------------------------------


@pytest.mark.vllm
async def test_a_completion_is_generated_from_the_raw_prompt_streamed_and_not(
    vllm_stack, tiny_model_dir
):
    client, model = sdk(vllm_stack), vllm_stack.settings.inference.model_name
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    raw_tokens = len(tokenizer.encode(PROMPT, add_special_tokens=True))
    templated = len(prompt_token_ids(tokenizer, [{"role": "user", "content": PROMPT}]))
    assert templated > raw_tokens  # so the usage tells which prompt the engine ran
    whole = await client.completions.create(
        model=model, prompt=PROMPT, max_tokens=8, temperature=0, extra_body={"ignore_eos": True}
    )
    [choice] = whole.choices
    assert whole.object == "text_completion" and whole.id.startswith("cmpl-")
    assert choice.finish_reason == "length" and choice.text
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (raw_tokens, 8)
    assert whole.usage.total_tokens == raw_tokens + 8

    stream = await client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = [chunk async for chunk in stream]
    assert {c.object for c in chunks} == {"text_completion"} and len({c.id for c in chunks}) == 1
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == choice.text  # greedy: the same answer, streamed
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == raw_tokens


@pytest.mark.vllm
async def test_echo_and_stop_on_real_vllm(vllm_stack):
    client, model = sdk(vllm_stack), vllm_stack.settings.inference.model_name
    echoed = await client.completions.create(
        model=model, prompt=PROMPT, max_tokens=4, temperature=0, echo=True
    )
    plain = await client.completions.create(model=model, prompt=PROMPT, max_tokens=4, temperature=0)
    assert echoed.choices[0].text == PROMPT + plain.choices[0].text
    stop = plain.choices[0].text.strip()[:1]
    if stop:
        cut = await client.completions.create(
            model=model, prompt=PROMPT, max_tokens=4, temperature=0, stop=[stop]
        )
        assert stop not in cut.choices[0].text and cut.choices[0].finish_reason == "stop"


# --- completions on the sim stack: billing, refusals ----------------------------------


async def test_a_completions_usage_is_billed_as_a_chat_answers(sim_stack):
    org, user = f"org-{uuid.uuid4().hex[:6]}", f"user-{uuid.uuid4().hex[:6]}"
    client = await as_owner(sim_stack, user, org)
    completion = await client.completions.create(
        model=sim_stack.settings.inference.model_name, prompt="bill me [[sim:reply=one two three]]"
    )
    assert completion.choices[0].text == "one two three"
    usage = completion.usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (5, 3)  # sim: a token a word
    ledger = SQLiteLedger(sim_stack.settings.storage.database_path)
    await ledger.open()
    try:
        assert await until_used(ledger, Account.user(org, user), 8) == 8
    finally:
        await ledger.close()


async def test_a_completions_logprobs_name_its_tokens_where_they_stand(sim_stack):
    client, model = sdk(sim_stack), sim_stack.settings.inference.model_name
    reply = "[[sim:reply=one two three]]"
    whole = await client.completions.create(model=model, prompt=reply, logprobs=1)
    [choice] = whole.choices
    logprobs = choice.logprobs
    assert "".join(logprobs.tokens) == choice.text == "one two three"
    assert logprobs.text_offset == [choice.text.index(t) for t in logprobs.tokens]
    assert logprobs.top_logprobs == [{t: 0.0} for t in logprobs.tokens]  # sim: each certain
    assert logprobs.token_logprobs == [0.0] * len(logprobs.tokens)
    stream = await client.completions.create(model=model, prompt=reply, logprobs=1, stream=True)
    shown = [c.choices[0].logprobs async for c in stream if c.choices and c.choices[0].logprobs]
    assert [o for lp in shown for o in lp.text_offset] == logprobs.text_offset


@pytest.mark.parametrize(
    ("request_body", "error", "code", "param"),
    [
        ({"prompt": [1, 2, 3]}, openai.BadRequestError, "unsupported_prompt", "prompt"),
        (
            {"prompt": "x", "logprobs": 1, "echo": True},
            openai.BadRequestError,
            "unsupported_parameter",
            "logprobs",
        ),
        ({"prompt": "x", "suffix": "y"}, openai.BadRequestError, "unsupported_parameter", "suffix"),
        (
            {"prompt": "x", "extra_body": {"guided_json": {}}},
            openai.BadRequestError,
            "unknown_parameter",
            "guided_json",
        ),
        ({"prompt": "x", "model": "nope"}, openai.NotFoundError, "model_not_found", "model"),
    ],
)
async def test_bad_completions_are_4xx_json_naming_the_field(
    sim_stack, request_body, error, code, param
):
    client = sdk(sim_stack)
    with pytest.raises(error) as refused:
        await client.completions.create(
            **{"model": sim_stack.settings.inference.model_name, **request_body}
        )
    assert refused.value.code == code and refused.value.param == param
    assert refused.value.body["code"] == code  # the SDK parsed a JSON error body


# --- embeddings: the bundled MiniLM in the gateway ------------------------------------


async def minilm_id(client) -> str:
    [model] = [m.id for m in (await client.models.list()).data if "MiniLM" in m.id]
    return model


async def test_embeddings_as_floats_and_base64_with_usage(sim_stack):
    client = sdk(sim_stack)
    model = await minilm_id(client)
    texts = [
        "A cat sits on the mat.",
        "A kitten is sitting on a rug.",
        "Quarterly revenue rose by four percent.",
    ]
    floats = await client.embeddings.create(model=model, input=texts, encoding_format="float")
    vectors = np.array([e.embedding for e in floats.data])
    assert vectors.shape == (3, 384) and floats.model == model
    assert [e.index for e in floats.data] == [0, 1, 2]
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.2  # the model's meaning
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > len(texts) * 2

    raw = await client.embeddings.with_raw_response.create(
        model=model, input=texts[0], encoding_format="base64"
    )
    encoded = raw.http_response.json()["data"][0]["embedding"]
    assert isinstance(encoded, str)
    assert np.allclose(np.frombuffer(base64.b64decode(encoded), dtype="<f4"), vectors[0], atol=1e-6)
    default = await client.embeddings.create(model=model, input=texts[0], dimensions=384)
    assert np.allclose(default.data[0].embedding, vectors[0], atol=1e-6)


async def test_an_embeddings_tokens_are_billed_to_its_user_and_org(sim_stack):
    org, user = f"org-{uuid.uuid4().hex[:6]}", f"user-{uuid.uuid4().hex[:6]}"
    client = await as_owner(sim_stack, user, org)
    answer = await client.embeddings.create(
        model=await minilm_id(client), input=["bill me", "and me too"]
    )
    tokens = answer.usage.prompt_tokens
    ledger = SQLiteLedger(sim_stack.settings.storage.database_path)
    await ledger.open()
    try:
        for account in (Account.user(org, user), Account.org(org)):
            assert await until_used(ledger, account, tokens) == tokens
    finally:
        await ledger.close()


@pytest.mark.parametrize(
    ("request_body", "error", "code"),
    [
        ({"input": "x", "dimensions": 128}, openai.BadRequestError, "unsupported_dimensions"),
        ({"input": [[101, 102]]}, openai.BadRequestError, "unsupported_input"),
        ({"input": ""}, openai.BadRequestError, "empty_input"),
        ({"input": "word " * 400}, openai.APIStatusError, "input_too_long"),
        ({"input": ["x"] * 65}, openai.APIStatusError, "too_many_inputs"),
    ],
)
async def test_bad_embedding_requests_are_4xx_json(sim_stack, request_body, error, code):
    client = sdk(sim_stack)
    with pytest.raises(error) as refused:
        await client.embeddings.create(model=await minilm_id(client), **request_body)
    assert 400 <= refused.value.status_code < 500 and refused.value.code == code


async def test_a_chat_model_embeds_nothing_and_minilm_completes_nothing(sim_stack):
    client = sdk(sim_stack)
    with pytest.raises(openai.NotFoundError):
        await client.embeddings.create(model=sim_stack.settings.inference.model_name, input="x")
    with pytest.raises(openai.NotFoundError):
        await client.completions.create(model=await minilm_id(client), prompt="x")
