"""OpenAI's chat completion parameters through the official `openai` SDK, end to end on
real vLLM (tiny model): sampling options reach the engine (a seed reproduces an answer,
penalties and `logit_bias` change it), logprobs come back whole and streamed,
`response_format` holds the answer to its JSON schema, `n` gives several choices with
the usage of all, and an unknown field is a 400 naming it."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from transformers import AutoTokenizer

from chatpipe.dev_stack import API_KEY

pytestmark = pytest.mark.vllm

QUESTION = [{"role": "user", "content": "Tell me about the sea."}]
CITY = {
    "type": "object",
    "additionalProperties": False,
    "required": ["city", "days"],
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
        "days": {"type": "integer", "enum": [1, 2, 3]},
    },
}


def sdk(stack) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{stack.base_url}/v1", api_key=API_KEY, max_retries=0)


async def answer(stack, **request) -> openai.types.chat.ChatCompletion:
    return await sdk(stack).chat.completions.create(
        model=stack.settings.inference.model_name, messages=QUESTION, **request
    )


async def test_a_seed_reproduces_a_sampled_answer_and_penalties_change_it(vllm_stack):
    sampled = {
        "temperature": 1.0,
        "max_tokens": 12,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.5,
    }
    first = await answer(vllm_stack, seed=11, **sampled)
    again = await answer(vllm_stack, seed=11, **sampled)
    other = await answer(vllm_stack, seed=12, **sampled)
    assert first.choices[0].message.content == again.choices[0].message.content
    assert first.choices[0].message.content != other.choices[0].message.content
    greedy = {"temperature": 0, "max_tokens": 24, "extra_body": {"ignore_eos": True}}
    plain = await answer(vllm_stack, **greedy)
    penalised = await answer(vllm_stack, frequency_penalty=2.0, presence_penalty=2.0, **greedy)
    assert plain.choices[0].message.content != penalised.choices[0].message.content


async def test_logit_bias_and_vllms_extras_reach_the_engine(vllm_stack, tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    [token] = tokenizer.encode("sea", add_special_tokens=False)[:1]
    biased = await answer(
        vllm_stack,
        temperature=0,
        max_tokens=4,
        logit_bias={str(token): 100},
        extra_body={"ignore_eos": True, "top_k": 5, "min_p": 0.01, "repetition_penalty": 1.0},
    )
    assert biased.choices[0].message.content == tokenizer.decode([token] * 4)
    with pytest.raises(openai.BadRequestError) as unknown_token:
        await answer(vllm_stack, logit_bias={str(len(tokenizer) + 5): 1})
    assert unknown_token.value.code == "invalid_logit_bias"
    assert unknown_token.value.body["param"] == "logit_bias"


async def test_logprobs_of_every_token_whole_and_streamed(vllm_stack):
    request = {"temperature": 0, "max_tokens": 8, "logprobs": True, "top_logprobs": 3}
    whole = await answer(vllm_stack, **request)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 3
        likeliest = [top.logprob for top in entry.top_logprobs]
        assert likeliest == sorted(likeliest, reverse=True)
        assert entry.logprob == pytest.approx(likeliest[0])  # greedy: the likeliest token
        assert entry.bytes == list(entry.token.encode())
    stream = await sdk(vllm_stack).chat.completions.create(
        model=vllm_stack.settings.inference.model_name,
        messages=QUESTION,
        stream=True,
        stream_options={"include_usage": True},
        **request,
    )
    streamed, usage = [], None
    async for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            streamed += choice.logprobs.content if choice.logprobs else []
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == [
        (e.token, round(e.logprob, 4)) for e in content
    ]
    assert len(streamed) == usage.completion_tokens
    plain = await answer(vllm_stack, temperature=0, max_tokens=4)
    assert plain.choices[0].logprobs is None


@pytest.mark.parametrize("stream", [False, True])
async def test_response_format_json_schema_holds_the_answer_to_the_schema(vllm_stack, stream):
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "trip", "schema": CITY, "strict": True},
    }
    client = sdk(vllm_stack)
    request = dict(
        model=vllm_stack.settings.inference.model_name,
        messages=QUESTION,
        max_tokens=64,
        temperature=1.0,
        seed=3,
        response_format=response_format,
    )
    if stream:
        chunks = await client.chat.completions.create(stream=True, **request)
        text = "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])
    else:
        text = (await client.chat.completions.create(**request)).choices[0].message.content
    jsonschema.validate(json.loads(text), CITY)


async def test_response_format_json_object_is_json(vllm_stack):
    reply = await answer(
        vllm_stack, max_tokens=200, temperature=0, response_format={"type": "json_object"}
    )
    text = reply.choices[0].message.content
    assert text.lstrip().startswith("{")
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


async def test_n_choices_with_the_usage_of_all(vllm_stack):
    sampled = {"temperature": 1.0, "seed": 5, "max_tokens": 6, "extra_body": {"ignore_eos": True}}
    reply = await answer(vllm_stack, n=2, **sampled)
    assert [choice.index for choice in reply.choices] == [0, 1]
    assert reply.choices[0].message.content != reply.choices[1].message.content
    assert reply.usage.completion_tokens == 12
    single = await answer(vllm_stack, n=1, **sampled)
    assert reply.usage.prompt_tokens == single.usage.prompt_tokens  # the prompt counts once
    assert reply.choices[0].message.content == single.choices[0].message.content
    stream = await sdk(vllm_stack).chat.completions.create(
        model=vllm_stack.settings.inference.model_name,
        messages=QUESTION,
        n=2,
        stream=True,
        stream_options={"include_usage": True},
        **sampled,
    )
    texts, finished, usage = {0: "", 1: ""}, set(), None
    async for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finished.add(choice.index)
    assert texts == {0: reply.choices[0].message.content, 1: reply.choices[1].message.content}
    assert finished == {0, 1} and usage.completion_tokens == 12


async def test_an_unknown_or_unsupported_field_is_400_naming_it(vllm_stack):
    with pytest.raises(openai.BadRequestError) as unknown:
        await answer(vllm_stack, max_tokens=4, extra_body={"temprature": 0.5})
    assert unknown.value.status_code == 400
    assert (unknown.value.code, unknown.value.body["param"]) == ("unknown_parameter", "temprature")
    assert "temprature" in unknown.value.message
    with pytest.raises(openai.BadRequestError) as unsupported:
        await answer(vllm_stack, max_tokens=4, modalities=["text", "audio"])
    assert (unsupported.value.code, unsupported.value.body["param"]) == (
        "unsupported_value",
        "modalities",
    )
