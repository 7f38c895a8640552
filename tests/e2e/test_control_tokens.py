"""Control tokens are text, over HTTP on both APIs with real vLLM:
a user message holding the tiny model's own special tokens, shaped as a system turn,
is run as ordinary text — the prompt the engine reports is the one whose content is
text tokens, and the native API's context builder counted exactly that."""

from __future__ import annotations

import pytest

from bench.topic_log import find_events
from common.prompt import prompt_token_ids
from gateway.context.tokens import TokenCounter
from schemas import topics
from schemas.events import GenerationRequest
from tests.support.chat import post_message
from tests.support.control_tokens import forged_turn
from tests.support.stack import client_for

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def counts(tokenizer, request: GenerationRequest) -> tuple[int, int]:
    """(tokens with every content as text, tokens of the prompt rendered and read
    again, where the forged strings are control tokens)."""
    messages = [{"role": m.role.value, "content": m.content} for m in request.messages]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return (
        len(prompt_token_ids(tokenizer, messages)),
        len(tokenizer.encode(rendered, add_special_tokens=False)),
    )


async def queued(stack, request_id: str) -> GenerationRequest:
    [request] = await find_events(
        stack.kafka,
        topics.requests_topic(stack.settings.gateway.default_tier),
        GenerationRequest,
        lambda r: r.request_id == request_id,
    )
    return request


async def test_openai_api_runs_a_forged_system_turn_as_text(vllm_stack, tokenizer):
    async with client_for(vllm_stack) as client:
        response = await client.post(
            "/v1/chat/completions",
            json={
                "model": vllm_stack.settings.inference.model_name,
                "max_tokens": 4,
                "temperature": 0,
                "messages": [{"role": "user", "content": forged_turn(tokenizer)}],
            },
        )
    assert response.status_code == 200, response.text
    answer = response.json()
    request = await queued(vllm_stack, answer["id"].removeprefix("chatcmpl-"))
    as_text, as_control = counts(tokenizer, request)
    assert answer["usage"]["prompt_tokens"] == as_text != as_control


async def test_native_api_runs_a_forged_system_turn_as_text_and_counts_it(vllm_stack, tokenizer):
    async with client_for(vllm_stack) as client:
        created = await client.post("/v1/conversations", json={"title": "forged"})
        result = await post_message(
            client,
            created.json()["conversation_id"],
            {"content": forged_turn(tokenizer), "max_tokens": 4, "temperature": 0},
        )
    assert result.ended_with_done, result
    request = await queued(vllm_stack, result.request["request_id"])
    as_text, as_control = counts(tokenizer, request)
    prompt_tokens = result.of("done")[0].json()["usage"]["prompt_tokens"]
    assert prompt_tokens == as_text != as_control
    assert TokenCounter(tokenizer).count_prompt(list(request.messages)) == prompt_tokens
