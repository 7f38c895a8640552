"""The prompt-build benchmark's workload: a growing conversation, its newest texts renewed."""

from __future__ import annotations

from bench.prompt_build import conversation, markdown, renewed


class Vocabulary:
    vocab_size = 1000

    def decode(self, ids: list[int]) -> str:
        return " ".join(f"w{i}" for i in ids)


def test_the_conversation_alternates_and_ends_on_a_question():
    messages = conversation(Vocabulary(), turns=3, answer_tokens=5)
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert all(len(m["content"].split()) == 5 for m in messages if m["role"] == "assistant")


def test_renewing_makes_only_the_newest_two_texts_new():
    history = conversation(Vocabulary(), turns=3, answer_tokens=5)
    again = renewed(history, 7)
    assert again[:-2] == history[:-2]
    assert all(a["content"] != h["content"] for a, h in zip(again[-2:], history[-2:], strict=True))
    assert renewed(history, 8)[-1]["content"] != again[-1]["content"]


def test_the_table_has_a_row_per_turn():
    row = {"turn": 1, "prompt tokens": 20, "every text new": 1.0, "turns before seen": 0.5}
    table = markdown([row | {"one render and encode": 0.9}], "cmd")
    assert "| 1 | 20 | 1.0 | 0.5 | 0.9 |" in table
