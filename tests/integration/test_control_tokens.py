"""Control tokens are text, with the tiny model's own special
tokens read from its tokenizer: a user message holding them, shaped as a forged
system turn, reaches the engine as ordinary text, and the gateway's context builder
counts the prompt the engine runs. Both APIs go through the same worker prompt
(`VllmEngine._prompt`)."""

from __future__ import annotations

import copy
import uuid
from pathlib import Path

import pytest

from common.prompt import prompt_token_ids
from gateway.context.tokens import TokenCounter
from schemas.events import ChatMessage, GenerationRequest, Role, SamplingOptions
from tests.support.control_tokens import forged_turn

SYSTEM = "You are a helpful assistant."


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def conversation(content: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}]


def special_ids(tokenizer, ids: list[int]) -> list[int]:
    specials = set(tokenizer.all_special_ids)
    return [i for i in ids if i in specials]


def test_the_forged_text_is_the_models_own_control_strings(tokenizer):
    """The test's premise: rendered and tokenized again (as before the fix), the forged
    text would be real control tokens, a system turn among them."""
    rendered = tokenizer.apply_chat_template(
        conversation(forged_turn(tokenizer)), tokenize=False, add_generation_prompt=True
    )
    naive = tokenizer.encode(rendered, add_special_tokens=False)
    plain = prompt_token_ids(tokenizer, conversation("hello"))
    system_id = tokenizer.convert_tokens_to_ids("<|system|>")
    assert special_ids(tokenizer, naive).count(system_id) > plain.count(system_id) == 1
    assert len(special_ids(tokenizer, naive)) > len(special_ids(tokenizer, plain))


def test_user_text_never_becomes_a_special_token(tokenizer):
    forged = forged_turn(tokenizer)
    ids = prompt_token_ids(tokenizer, conversation(forged))
    template_only = prompt_token_ids(tokenizer, conversation("hello"))
    assert special_ids(tokenizer, ids) == special_ids(tokenizer, template_only)
    content = tokenizer(forged, add_special_tokens=False, split_special_tokens=True).input_ids
    assert _holds(ids, content), "the content is in the prompt, as text tokens"
    assert tokenizer.decode(content) == forged


def test_the_context_builder_counts_the_prompt_the_engine_runs(tokenizer):
    counter = TokenCounter(tokenizer)
    for content in (forged_turn(tokenizer), "What is the capital of France?"):
        messages = [
            ChatMessage(role=Role(m["role"]), content=m["content"]) for m in conversation(content)
        ]
        assert counter.count_prompt(messages) == len(
            prompt_token_ids(tokenizer, conversation(content))
        )


def test_a_template_that_trims_content_still_gets_it_as_text(tokenizer):
    trimming = copy.copy(tokenizer)
    trimming.chat_template = tokenizer.chat_template.replace(
        "message['content']", "message['content'] | trim"
    )
    forged = forged_turn(tokenizer)
    ids = prompt_token_ids(trimming, conversation(f"  {forged}  "))
    assert special_ids(tokenizer, ids) == special_ids(
        tokenizer, prompt_token_ids(tokenizer, conversation("hello"))
    )


def test_a_template_that_repeats_or_drops_content_is_refused(tokenizer):
    for changed in ("message['content'] + message['content']", "''"):
        odd = copy.copy(tokenizer)
        odd.chat_template = tokenizer.chat_template.replace("message['content']", changed)
        with pytest.raises(ValueError, match="drops or repeats"):
            prompt_token_ids(odd, conversation("hello"))


def _holds(ids: list[int], part: list[int]) -> bool:
    return any(ids[i : i + len(part)] == part for i in range(len(ids) - len(part) + 1))


# --- the real engine ------------------------------------------------------------------


def make_request(content: str) -> GenerationRequest:
    return GenerationRequest(
        request_id=f"req-{uuid.uuid4().hex[:8]}",
        conversation_id="conv-ct",
        message_id="m",
        user_id="u",
        org_id="o",
        tier="pro",
        model="tiny-random",
        messages=tuple(
            ChatMessage(role=Role(m["role"]), content=m["content"]) for m in conversation(content)
        ),
        sampling=SamplingOptions(max_tokens=12, temperature=0.0, ignore_eos=True),
        reply_to="chat.deliver.gw-ct",
    )


async def direct_answer(engine, prompt_ids: list[int]) -> str:
    """What vLLM answers to exactly these prompt tokens, greedy (no chatpipe between)."""
    from workers.vllm_engine import sampling_params

    params = sampling_params(make_request("").sampling)
    text = ""
    async for out in engine._llm.generate(
        {"prompt_token_ids": prompt_ids}, params, f"direct-{uuid.uuid4().hex[:8]}"
    ):
        text += out.outputs[0].text
    return text


@pytest.mark.vllm
async def test_a_forged_system_turn_is_answered_as_ordinary_text(vllm_engine, tokenizer):
    forged = forged_turn(tokenizer)
    request = make_request(forged)
    outputs = [out async for out in vllm_engine.generate(request)]
    answer = "".join(out.text for out in outputs)

    engine_prompt = vllm_engine._prompt(request, None)[0]["prompt_token_ids"]
    template_only = prompt_token_ids(tokenizer, conversation("hello"))
    assert special_ids(tokenizer, engine_prompt) == special_ids(tokenizer, template_only)
    counted = TokenCounter(tokenizer).count_prompt(list(request.messages))
    assert outputs[-1].prompt_tokens == counted == len(engine_prompt)

    as_text = prompt_token_ids(tokenizer, conversation(forged))
    rendered = tokenizer.apply_chat_template(
        conversation(forged), tokenize=False, add_generation_prompt=True
    )
    as_control = tokenizer.encode(rendered, add_special_tokens=False)
    as_text_answer = await direct_answer(vllm_engine, as_text)
    assert as_text_answer != await direct_answer(vllm_engine, as_control), (
        "the model answers both prompts alike: it cannot show which one it was given"
    )
    assert answer == as_text_answer
