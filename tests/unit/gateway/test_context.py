"""Context window core (`gateway.context.window`) and the builder around it, with a
word-counting tokenizer: cut rule, prefix stability, summaries, retrieval."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conversations.sqlite_store import SQLiteStore
from conversations.store import StoredMessage
from gateway.context.builder import ContextBuilder
from gateway.context.summaries import (
    SUMMARY_HEADING,
    clean_title,
    fallback_title,
    is_summary_request,
    summary_request,
    title_request,
)
from gateway.context.tokens import TokenCounter
from gateway.context.window import (
    BuiltContext,
    ContextPolicy,
    assemble,
    exchanges,
    replay_cut,
)
from schemas.events import ChatMessage, Role
from schemas.lifecycle import RequestStatus
from tests.support.context import WordTokenizer, counting

SYSTEM = "be brief"


def stored(message_id: str, role: Role, content: str, seq: int = 0) -> StoredMessage:
    return StoredMessage(
        message_id=message_id, conversation_id="c1", seq=seq, role=role, content=content,
        parent_id=None, model=None, tokens=0, status=RequestStatus.FINISHED_STOPPED,
        request_id=None, created_at=0.0,
    )  # fmt: skip


def words(n: int, tag: str) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def conversation(turns: int, size: int = 10) -> list[StoredMessage]:
    """`turns` exchanges of a `size`-word question and answer."""
    out = []
    for i in range(turns):
        out.append(stored(f"u{i}", Role.USER, words(size, f"q{i}-"), 2 * i))
        out.append(stored(f"a{i}", Role.ASSISTANT, words(size, f"r{i}-"), 2 * i + 1))
    return out


def build(thread, new: str, **policy) -> BuiltContext:
    return assemble(thread, new, SYSTEM, ContextPolicy(**policy), counting(), conversation_id="c1")


# --- the cut rule ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("costs", "starts", "budget", "keep", "cut"),
    [
        ([], [], 10, 5, 0),  # nothing
        ([3, 3, 3], [True, False, True], 10, 5, 0),  # fits
        ([4, 4, 4, 4], [True, False, True, True], 10, 5, 2),  # cut to keep at a start
        ([4, 4, 4, 4], [True, False, False, True], 10, 5, 3),  # no start leaves keep: last
        ([2, 2, 2, 2, 2, 2], [True] * 6, 7, 4, 4),  # replayed: cuts at item 3, then at 4
        ([30], [True], 10, 5, 0),  # a new message over budget alone stays
    ],
)
def test_replay_cut(costs, starts, budget, keep, cut) -> None:
    assert replay_cut(costs, starts, budget, keep) == cut


def test_the_cut_moves_in_blocks_not_every_turn() -> None:
    costs, cuts = [], []
    for _ in range(40):
        costs.append(5)
        cuts.append(replay_cut(costs, [True] * len(costs), budget=50, keep=25))

    assert cuts == sorted(cuts)  # never moves back
    # 10 turns fit; a cut keeps 5 and 5 more fill the window again: a new prefix
    # once every 6 turns, not on every turn
    assert sorted(set(cuts)) == [0, 6, 12, 18, 24, 30]
    assert all(sum(costs[c : i + 1]) <= 50 for i, c in enumerate(cuts))


def test_exchanges_group_a_question_with_its_answers() -> None:
    thread = [*conversation(2), stored("a1b", Role.ASSISTANT, "again")]

    assert [[m.message_id for m in g] for g in exchanges(thread)] == [
        ["u0", "a0"], ["u1", "a1", "a1b"],
    ]  # fmt: skip


# --- truncate -------------------------------------------------------------------------


def test_a_growing_conversation_stays_under_the_limit_with_a_stable_prefix() -> None:
    thread: list[StoredMessage] = []
    previous: BuiltContext | None = None
    starts = []
    for turn in range(30):
        built = build(thread, words(10, f"q{turn}-"), max_prompt_tokens=150)
        assert built.fits and built.prompt_tokens <= 150
        assert built.messages[0] == ChatMessage(role=Role.SYSTEM, content=SYSTEM)
        assert built.messages[-1].content == words(10, f"q{turn}-")
        if previous is not None and built.window_start == previous.window_start:
            assert built.messages[: len(previous.messages)] == previous.messages
        starts.append(built.window_start)
        previous = built
        thread.append(stored(f"u{turn}", Role.USER, words(10, f"q{turn}-")))
        thread.append(stored(f"a{turn}", Role.ASSISTANT, words(10, f"r{turn}-")))

    assert starts[-1] > 0  # history was cut
    assert len(set(starts)) <= len(starts) // 4  # but in blocks: most turns keep the prefix


def test_truncation_starts_at_a_user_turn() -> None:
    built = build(conversation(10), "next", max_prompt_tokens=60)

    assert built.messages[1].role == Role.USER


def test_nothing_is_cut_when_it_fits() -> None:
    built = build(conversation(2), "next", max_prompt_tokens=1000)

    assert len(built.messages) == 6 and built.window_start == 0


def test_a_message_too_long_for_the_window_does_not_fit() -> None:
    built = build(conversation(2), words(200, "w"), max_prompt_tokens=100)

    assert not built.fits and built.messages[0].role == Role.SYSTEM
    assert built.messages[1:] == (ChatMessage(role=Role.USER, content=words(200, "w")),)


# --- summary --------------------------------------------------------------------------


def test_a_summary_replaces_the_turns_it_covers() -> None:
    thread = conversation(6)
    built = assemble(thread, "next", SYSTEM, ContextPolicy("summary", 1000), counting(),
                     summary=("a2", "they talked about cats"))  # fmt: skip

    assert built.messages[0].content == f"{SYSTEM}\n\n{SUMMARY_HEADING}\nthey talked about cats"
    assert [m.content for m in built.messages[1:3]] == [words(10, "q3-"), words(10, "r3-")]
    assert built.summary_through == "a2"


def test_a_summary_of_another_branch_is_ignored() -> None:
    built = assemble(conversation(2), "next", SYSTEM, ContextPolicy("summary", 1000), counting(),
                     summary=("elsewhere", "not this thread"))  # fmt: skip

    assert built.messages[0].content == SYSTEM and built.summary_through is None


def test_a_summary_is_asked_for_past_the_trigger() -> None:
    under = build(conversation(3), "next", strategy="summary", max_prompt_tokens=200)
    over = build(conversation(7), "next", strategy="summary", max_prompt_tokens=200)

    assert under.summary_job is None
    job = over.summary_job
    assert job is not None and job.conversation_id == "c1"
    # keep 50% of the history budget: the older exchanges are folded into the summary
    assert job.through_message_id.startswith("a") and job.covered_tokens > 0
    request = job.messages[-1].content
    assert words(10, "q0-") in request and "next" not in request


def test_a_rolling_summary_includes_the_previous_one() -> None:
    built = assemble(conversation(12), "next", SYSTEM, ContextPolicy("summary", 200), counting(),
                     summary=("a1", "OLD SUMMARY"))  # fmt: skip

    assert built.summary_job is not None
    assert "OLD SUMMARY" in built.summary_job.messages[-1].content
    assert words(10, "q0-") not in built.summary_job.messages[-1].content


# --- retrieve -------------------------------------------------------------------------


def test_retrieval_brings_back_a_relevant_evicted_exchange_before_the_new_message() -> None:
    thread = conversation(12)
    relevance = {m.message_id: 0.0 for m in thread} | {"u1": 0.9, "a1": 0.4, "u3": 0.2}

    built = assemble(thread, "the question", SYSTEM, ContextPolicy("retrieve", 200), counting(),
                     relevance=relevance)  # fmt: skip

    assert built.retrieved_ids == ("u1", "a1")  # the whole exchange, nothing under 0.3
    contents = [m.content for m in built.messages]
    assert contents[-3:] == [words(10, "q1-"), words(10, "r1-"), "the question"]
    assert built.window_start > 3 and built.prompt_tokens <= 200


def test_retrieval_keeps_to_top_k_and_its_budget() -> None:
    thread = conversation(30)
    relevance = {m.message_id: 0.9 for m in thread}

    few = assemble(thread, "q", SYSTEM, ContextPolicy("retrieve", 400, retrieve_top_k=2),
                   counting(), relevance=relevance)  # fmt: skip

    assert len(few.retrieved_ids) == 4 and few.prompt_tokens <= 400


# --- builder --------------------------------------------------------------------------


def builder(strategy: str = "truncate", window: int = 1000) -> ContextBuilder:
    return ContextBuilder(
        system_prompt=SYSTEM,
        policy=lambda model, max_tokens: ContextPolicy(strategy, window - max_tokens),  # type: ignore[arg-type]
        counter=lambda model: TokenCounter(WordTokenizer()),
    )


async def test_builder_answers_a_regeneration_from_the_thread() -> None:
    thread = [*conversation(2), stored("u2", Role.USER, "last question")]

    built = await builder().build(SQLiteStore(":memory:"), "c1", thread, None, model="m",
                                  max_tokens=10)  # fmt: skip

    assert built.messages[-1] == ChatMessage(role=Role.USER, content="last question")
    assert [m.content for m in built.messages].count("last question") == 1
    with pytest.raises(ValueError):
        await builder().build(SQLiteStore(":memory:"), "c1", conversation(1), None, model="m",
                              max_tokens=10)  # fmt: skip


async def test_builder_skips_failed_answers_and_reads_stored_summaries() -> None:
    store = SQLiteStore(":memory:")
    await store.open()
    thread = conversation(3)
    thread[3] = replace(thread[3], content="", status=RequestStatus.FINISHED_ERROR)  # a1 failed
    await store.save_summary("c1", "a0", "SUMMARY")

    built = await builder("summary").build(store, "c1", thread, "next", model="m", max_tokens=10)

    assert SUMMARY_HEADING in built.messages[0].content and "SUMMARY" in built.messages[0].content
    assert [m.role for m in built.messages[1:]] == [Role.USER, Role.USER, Role.ASSISTANT, Role.USER]
    await store.close()


# --- titles ---------------------------------------------------------------------------


def test_titles_are_cleaned_and_fall_back_to_the_first_message() -> None:
    assert clean_title('"Naming a Cat."\nextra') == "Naming a Cat"
    assert clean_title("Title: Sourdough basics") == "Sourdough basics"
    assert fallback_title("  what   is\nmy cat called ") == "what is my cat called"
    long = fallback_title("word " * 40)
    assert len(long) <= 80 and long.endswith("…")
    answered = "Kafka Topic: a topic in the science fiction genre since the 1920s."
    assert clean_title(answered, "What is a Kafka topic?") == "What is a Kafka topic?"
    assert clean_title("Hello there!", "hi") == "Hello there"


def test_a_title_is_asked_for_after_examples_and_a_summary_in_one_message() -> None:
    asked = title_request("plan my trip")
    assert asked[0].role == Role.SYSTEM and asked[-1].content == "Title for: plan my trip"
    assert [m.role for m in asked[1:3]] == [Role.USER, Role.ASSISTANT]
    [summary] = summary_request("Bob likes tea.", [ChatMessage(role=Role.USER, content="hi")])
    assert summary.role == Role.USER and is_summary_request((summary,))
    assert summary.content.endswith("Summary so far: Bob likes tea.\n\nUser: hi")
