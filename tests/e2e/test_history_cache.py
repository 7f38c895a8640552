"""The growing-history cost with the real vLLM engine: a 10-turn conversation whose
cached prompt tokens rise with its history, as the prefix cache serves every
turn but the newest.

vLLM caches whole blocks (128 tokens on the CPU build), so the system prompt
here is long enough to fill more than one by itself. The test prints the
measured share of prompt tokens served from the cache:

    .venv/bin/python -m pytest -s tests/e2e/test_history_cache.py
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from itertools import pairwise

import pytest
import pytest_asyncio

from chatpipe.dev_stack import stack_settings
from chatpipe.wiring import Stack, running_stack
from tests.support.conversations import new_conversation, new_user, say

pytestmark = pytest.mark.vllm

TURNS = 10
BLOCK = 128
LONG_SYSTEM_PROMPT = " ".join(
    [
        "You are a helpful assistant for a team of engineers who run a chat service.",
        "Answer in plain English, briefly, and say so when you do not know an answer.",
        "Prefer concrete steps, commands and numbers over general advice.",
        "When a question is ambiguous, state the reading you chose before you answer it.",
        "Never invent configuration options, flags, file names or version numbers.",
        "Quote error messages exactly as the user gave them, and explain each part.",
        "When you suggest a change, say what it costs and how to undo it.",
        "Keep a friendly, direct tone; do not apologise more than once in an answer.",
        "Use lists for sequences of steps and short paragraphs for explanations.",
        "If the user asks for code, give complete, runnable examples with their imports.",
        "Point out risks to data, security or availability before anything else.",
    ]
    * 2
)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def long_prompt_stack(vllm_engine, tiny_model_dir, tmp_path_factory
                            ) -> AsyncIterator[Stack]:  # fmt: skip
    """A pipeline on the session's vLLM engine whose system prompt passes a cache block."""
    settings = stack_settings(
        tmp_path_factory.mktemp("history-stack"),
        engine="vllm",
        model=tiny_model_dir,
        system_prompt=LONG_SYSTEM_PROMPT,
    )
    async with running_stack(settings, vllm_engine) as stack:
        yield stack


async def test_cached_prompt_tokens_rise_with_the_history(long_prompt_stack: Stack) -> None:
    async with await new_user(long_prompt_stack) as client:
        cid = await new_conversation(client)
        for n in range(TURNS):
            await say(
                client,
                cid,
                f"Question {n}: how do I read the log of stage {n}?",
                max_tokens=32,
                ignore_eos=True,
                temperature=0,
            )
        usage = (await client.get(f"/v1/conversations/{cid}/usage")).json()

    turns = usage["turns"]
    prompt = [t["prompt_tokens"] for t in turns]
    cached = [t["cached_tokens"] for t in turns]
    later_prompt, later_cached = sum(prompt[1:]), sum(cached[1:])
    print(
        f"\nhistory cache over {TURNS} turns: prompt tokens {prompt}, cached {cached}; "
        f"cached/prompt {usage['cached_tokens'] / usage['prompt_tokens']:.3f} overall, "
        f"{later_cached / later_prompt:.3f} after the first turn, "
        f"{cached[-1] / prompt[-1]:.3f} on the last"
    )
    assert len(turns) == TURNS
    assert prompt[0] > BLOCK, "the system prompt alone should fill a cache block"
    assert all(a < b for a, b in pairwise(prompt)), "each prompt carries the whole history"
    assert all(a <= b for a, b in pairwise(cached[1:])), cached
    assert all(c % 16 == 0 and c <= p for c, p in zip(cached, prompt, strict=True))
    # Each turn reuses the previous turn's prompt, less at most the block it ended in
    # (answers are tokenized again) and the turn before it.
    for previous, now in pairwise(zip(prompt, cached, strict=True)):
        assert now[1] >= previous[0] - 2 * BLOCK, (prompt, cached)
    assert cached[-1] / prompt[-1] > 0.6
