"""Context window management with the real parts: the tiny model's tokenizer and
chat template, the bundled all-MiniLM-L6-v2 embeddings, and a SQLite store.

Each test plays a conversation turn by turn as the gateway would: read the
current thread, build the prompt, store the user message and an answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio

from common.embeddings import SentenceEmbedder
from conversations.sqlite_store import SQLiteStore
from conversations.store import NewMessage
from gateway.context.builder import ContextBuilder
from gateway.context.summaries import SUMMARY_HEADING, is_summary_request
from gateway.context.tokens import TokenCounter
from gateway.context.window import BuiltContext, ContextPolicy
from schemas.events import Role

SYSTEM = "You are a helpful assistant. Answer briefly."
MAX_TOKENS = 64

TOPICS = [
    ("How long should sourdough bread proof before baking?",
     "Let the dough proof for four to six hours at room temperature, or overnight in the fridge."),
    ("Why did the stock market fall sharply this week?",
     "Rising interest rates and weak earnings reports pushed investors to sell shares."),
    ("Explain the rules of cricket in short.",
     "Two teams take turns to bat and bowl; the batting side scores runs between the wickets."),
    ("What is a list comprehension in Python?",
     "It builds a list from an iterable in one expression, such as squares of numbers."),
    ("What is the weather like in Spain in April?",
     "Spring in Spain is mild, around twenty degrees, with some rain in the north."),
    ("How do I change a flat tyre on a car?",
     "Loosen the wheel nuts, jack up the car, swap the wheel, then tighten the nuts again."),
    ("Which French verbs are irregular?",
     "Common irregular verbs include être, avoir, aller and faire."),
    ("Who founded the city of Rome?",
     "Legend says Romulus founded Rome in 753 BC after quarrelling with his brother Remus."),
    ("How do solar panels generate electricity?",
     "Photovoltaic cells turn sunlight into direct current, which an inverter converts."),
    ("What is a good beginner workout routine?",
     "Start with three full-body sessions a week: squats, push-ups, rows and planks."),
]  # fmt: skip

CAT = ("My cat is called Whiskers, a grey tabby who sleeps on the windowsill.",
       "Whiskers is a lovely name for a grey tabby cat!")  # fmt: skip


class CountingEmbedder:
    """The real embedder, counting the texts it is asked to embed."""

    def __init__(self, inner: SentenceEmbedder) -> None:
        self.inner, self.name, self.texts = inner, inner.name, 0

    def embed(self, texts: list[str]) -> np.ndarray:
        self.texts += len(texts)
        return self.inner.embed(texts)


@pytest.fixture(scope="session")
def counter(tiny_model_dir: Path) -> TokenCounter:
    return TokenCounter.from_dir(tiny_model_dir)


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


@pytest.fixture(scope="session")
def sentence_embedder() -> SentenceEmbedder:
    return SentenceEmbedder()


@pytest_asyncio.fixture
async def store() -> AsyncIterator[SQLiteStore]:
    store = SQLiteStore(":memory:")
    await store.open()
    await store.create_conversation("c1", "alice", org_id="acme")
    yield store
    await store.close()


def make_builder(counter: TokenCounter, policy: ContextPolicy, embedder=None) -> ContextBuilder:
    return ContextBuilder(
        system_prompt=SYSTEM,
        policy=lambda model, max_tokens: policy,
        counter=lambda model: counter,
        embedder=(lambda: embedder) if embedder is not None else None,
    )


async def turn(
    builder: ContextBuilder, store: SQLiteStore, question: str, answer: str, n: int
) -> BuiltContext:
    """Build the prompt for `question`, then store it and its answer."""
    tree = await store.get_tree("c1")
    built = await builder.build(store, "c1", tree.thread(), question, model="tiny-random",
                                max_tokens=MAX_TOKENS)  # fmt: skip
    await store.add_message(NewMessage(f"u{n}", "c1", Role.USER, question, parent_id=tree.leaf_id))
    await store.add_message(NewMessage(f"a{n}", "c1", Role.ASSISTANT, answer, parent_id=f"u{n}"))
    return built


def prompt_ids(tokenizer, built: BuiltContext) -> list[int]:
    """Token ids as vLLM makes them from the messages: template, then tokenize."""
    messages = [{"role": m.role.value, "content": m.content} for m in built.messages]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


async def play(policy: ContextPolicy, counter: TokenCounter, turns: int) -> list[BuiltContext]:
    """The prompts of a `turns`-long conversation on a fresh store."""
    store = SQLiteStore(":memory:")
    await store.open()
    await store.create_conversation("c1", "alice", org_id="acme")
    builder = make_builder(counter, policy)
    prompts = []
    for n in range(turns):
        question, answer = TOPICS[n % len(TOPICS)]
        prompts.append(await turn(builder, store, f"{question} ({n})", f"{answer} ({n})", n))
    await store.close()
    return prompts


def reused_prefixes(tokenizer, prompts: list[BuiltContext]) -> int:
    """Turns whose prompt starts with the previous turn's whole prompt, token for token."""
    ids = [prompt_ids(tokenizer, p) for p in prompts]
    return sum(cur[: len(prev)] == prev for prev, cur in pairwise(ids))


async def test_an_outgrown_window_keeps_prompts_under_the_limit_with_a_stable_prefix(
    counter, tokenizer
) -> None:
    limit = 320
    prompts = await play(ContextPolicy("truncate", limit, keep_ratio=0.5), counter, 40)

    token_ids = [prompt_ids(tokenizer, p) for p in prompts]
    assert max(len(ids) for ids in token_ids) <= limit
    assert all(p.prompt_tokens == len(ids) for p, ids in zip(prompts, token_ids, strict=True))
    assert all(p.messages[0].content == SYSTEM for p in prompts)
    assert prompts[-1].window_start > 20  # the conversation outgrew the window many times
    # a turn whose window did not move repeats the previous prompt whole (vLLM's
    # prefix cache serves it); dropping one turn at a time would almost never do so
    same_window = sum(p.window_start == q.window_start for p, q in pairwise(prompts))
    assert reused_prefixes(tokenizer, prompts) == same_window
    one_at_a_time = await play(ContextPolicy("truncate", limit, keep_ratio=1.0), counter, 40)
    assert same_window >= 3 * reused_prefixes(tokenizer, one_at_a_time)


async def test_summary_is_asked_for_then_heads_the_prompt(counter, tokenizer, store) -> None:
    limit = 320
    builder = make_builder(counter, ContextPolicy("summary", limit))
    summaries = []
    for n in range(24):
        question, answer = TOPICS[n % len(TOPICS)]
        built = await turn(builder, store, f"{question} ({n})", f"{answer} ({n})", n)
        assert len(prompt_ids(tokenizer, built)) <= limit
        assert built.messages[0].content.startswith(SYSTEM)
        if built.summary_job is not None:  # the gateway would run it on the small model
            job, request = built.summary_job, built.summary_job.messages[-1].content
            assert is_summary_request(job.messages) and job.messages[0].role == Role.USER
            # the first summary starts at the first turn, later ones roll the last one forward
            assert f"SUMMARY through {summaries[-1]}" in request if summaries else "(0)" in request
            text = f"SUMMARY through {job.through_message_id}"
            await store.save_summary("c1", job.through_message_id, text)
            summaries.append(job.through_message_id)

    assert summaries, "the conversation never asked for a summary"
    assert built.summary_through is not None
    system = built.messages[0].content
    assert SUMMARY_HEADING in system and f"SUMMARY through {built.summary_through}" in system
    covered = int(built.summary_through.removeprefix("a"))
    turns = " ".join(m.content for m in built.messages[1:])
    assert not any(f"({n})" in turns for n in range(covered + 1))  # folded into the summary
    assert f"({covered + 1})" in turns  # and the prompt goes on right after it


async def test_retrieve_brings_back_the_earlier_turn_about_the_cat(
    counter, sentence_embedder, store
) -> None:
    embedder = CountingEmbedder(sentence_embedder)
    policy = ContextPolicy("retrieve", 360, retrieve_top_k=2, retrieve_budget_ratio=0.3)
    builder = make_builder(counter, policy, embedder)
    await turn(builder, store, *CAT, 0)
    for n, (question, answer) in enumerate(TOPICS, start=1):
        await turn(builder, store, question, answer, n)

    texts_before = embedder.texts
    built = await builder.build(store, "c1", (await store.get_tree("c1")).thread(),
                                "Remind me, what is the name of my cat?", model="tiny-random",
                                max_tokens=MAX_TOKENS)  # fmt: skip

    assert built.window_start > 1  # the cat exchange fell out of the window
    assert built.retrieved_ids == ("u0", "a0")
    contents = [m.content for m in built.messages]
    assert contents[-3:] == [*CAT, "Remind me, what is the name of my cat?"]
    assert contents[0] == SYSTEM and built.prompt_tokens <= 360
    # embeddings are cached in the store: this turn embedded the query and the last turn only
    assert embedder.texts - texts_before == 1 + 2
    cached = await store.load_embeddings("c1", embedder.name)
    assert {f"u{n}" for n in range(len(TOPICS) + 1)} <= set(cached)
