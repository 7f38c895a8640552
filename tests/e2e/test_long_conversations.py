"""A conversation that outgrows a small context window, over HTTP through the whole
pipeline (sim engine; the gateway sizes prompts with the tiny model's tokenizer).

Every prompt the gateway queues stays under the window with its system prompt
first; with `summary` a rolling summary generated in the background takes the
place of the oldest turns; with `retrieve` the earlier exchange relevant to the
new message comes back although the window has moved past it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from bench.topic_log import find_events
from chatpipe.dev_stack import running_sim_stack, stack_settings
from chatpipe.wiring import Stack
from gateway.context.summaries import SUMMARY_HEADING, is_summary_request
from gateway.context.tokens import TokenCounter
from schemas import topics
from schemas.events import GenerationRequest, Role
from schemas.topics import Tier
from tests.support.conversations import new_conversation, new_user, say

WINDOW = 384
MAX_TOKENS = 20
LIMIT = WINDOW - MAX_TOKENS
"""What a prompt may take: the window less the answer's max_tokens."""
SYSTEM_PROMPT = "You are a helpful assistant. Answer briefly."

QUESTIONS = [
    "How long should sourdough bread proof before baking?",
    "Why did the stock market fall sharply this week?",
    "Explain the rules of cricket in short.",
    "What is a list comprehension in Python?",
    "What is the weather like in Spain in April?",
    "How do I change a flat tyre on a car?",
    "Which French verbs are irregular?",
    "Who founded the city of Rome?",
    "How do solar panels generate electricity?",
    "What is a good beginner workout routine?",
]
ANSWER = " [[sim:length=20]]"
"""Each question's answer: 20 sim words (~30 tokens)."""


@contextlib.asynccontextmanager
async def small_window_stack(tmp: Path, model_dir: Path, strategy: str) -> AsyncIterator[Stack]:
    settings = stack_settings(
        tmp, engine="sim", model=model_dir, sim_tokens_per_s=1000.0, max_slots=8,
        system_prompt=SYSTEM_PROMPT, context_window_tokens={"tiny-random": WINDOW},
        context_strategy={"tiny-random": strategy}, summary_max_tokens=40,
    )  # fmt: skip
    async with running_sim_stack(settings) as stack:
        yield stack


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def summary_stack(tiny_model_dir, tmp_path_factory) -> AsyncIterator[Stack]:
    async with small_window_stack(tmp_path_factory.mktemp("summary-stack"), tiny_model_dir,
                                  "summary") as stack:  # fmt: skip
        yield stack


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def retrieve_stack(tiny_model_dir, tmp_path_factory) -> AsyncIterator[Stack]:
    async with small_window_stack(tmp_path_factory.mktemp("retrieve-stack"), tiny_model_dir,
                                  "retrieve") as stack:  # fmt: skip
        yield stack


@pytest.fixture(scope="module")
def counter(tiny_model_dir: Path) -> TokenCounter:
    return TokenCounter.from_dir(tiny_model_dir)


async def turn_prompts(stack: Stack, cid: str, count: int) -> list[GenerationRequest]:
    """The `count` answers the gateway queued for `cid` (user tier), in order."""
    found = await find_events(stack.kafka, topics.requests_topic(Tier.PRO), GenerationRequest,
                              lambda r: r.conversation_id == cid, count=count)  # fmt: skip
    assert len(found) == count
    return sorted(found, key=lambda r: r.created_at)


def assert_within_window(requests: list[GenerationRequest], counter: TokenCounter) -> None:
    for request in requests:
        assert counter.count_prompt(list(request.messages)) <= LIMIT
        assert request.messages[0].role == Role.SYSTEM
        assert request.messages[0].content.startswith(SYSTEM_PROMPT)


async def test_summary_replaces_the_oldest_turns_and_every_prompt_fits(
    summary_stack: Stack, counter: TokenCounter
) -> None:
    async with await new_user(summary_stack) as client:
        cid = await new_conversation(client)
        for question in QUESTIONS:
            await say(client, cid, question + ANSWER, max_tokens=MAX_TOKENS)
        await _summaries(summary_stack, cid)
        last = await say(
            client, cid, "And what did we talk about first?" + ANSWER, max_tokens=MAX_TOKENS
        )
        # Read again: the background job may have stored a newer summary meanwhile, and
        # the last prompt carries whichever was the newest when it was built.
        summaries = await summary_stack.store.list_summaries(cid)

    requests = await turn_prompts(summary_stack, cid, len(QUESTIONS) + 1)
    assert_within_window(requests, counter)
    assert QUESTIONS[0] + ANSWER not in [m.content for m in requests[-1].messages]
    system = requests[-1].messages[0].content
    assert f"{SUMMARY_HEADING}\n" in system
    assert any(s.content in system for s in summaries)
    assert requests[-1].messages[-1].content.startswith("And what did we talk about first?")
    assert requests[-1].request_id == last.request["request_id"]

    asked = await find_events(
        summary_stack.kafka,
        topics.requests_topic(Tier.FREE),
        GenerationRequest,
        lambda r: r.conversation_id == cid and is_summary_request(r.messages),
    )
    assert asked and not asked[0].store
    assert asked[0].sampling.max_tokens == summary_stack.settings.context.summary_max_tokens


async def _summaries(stack: Stack, cid: str, timeout_s: float = 20) -> list:
    """The conversation's summaries once the background job has stored one."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not (summaries := await stack.store.list_summaries(cid)):
        assert asyncio.get_running_loop().time() < deadline, "no summary was stored"
        await asyncio.sleep(0.1)
    return summaries


CAT = "My cat is called Whiskers, a grey tabby who sleeps on the windowsill."
CAT_ANSWER = "Whiskers is a lovely name for a grey tabby cat!"


async def test_retrieve_brings_back_the_relevant_earlier_turn(
    retrieve_stack: Stack, counter: TokenCounter
) -> None:
    async with await new_user(retrieve_stack) as client:
        cid = await new_conversation(client)
        cat = await say(client, cid, f"{CAT} [[sim:reply={CAT_ANSWER}]]", max_tokens=MAX_TOKENS)
        for question in QUESTIONS[:8]:
            await say(client, cid, question + ANSWER, max_tokens=MAX_TOKENS)
        await say(client, cid, "What colour is my cat Whiskers?" + ANSWER, max_tokens=MAX_TOKENS)

    requests = await turn_prompts(retrieve_stack, cid, 10)
    assert_within_window(requests, counter)
    contents = [m.content for m in requests[-1].messages]
    told = f"{CAT} [[sim:reply={CAT_ANSWER}]]"
    assert QUESTIONS[0] + ANSWER not in contents, "the window never moved"
    # Not kept at the start of the window: retrieved, just before the new message.
    assert contents.count(told) == 1 and contents[1] != told
    assert contents[-3:] == [told, cat.text, "What colour is my cat Whiskers?" + ANSWER]
