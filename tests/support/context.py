"""Context-building helpers."""

from __future__ import annotations

from gateway.context.tokens import TokenCounter
from gateway.context.window import (
    Counting,
)


class WordTokenizer:
    """One token per word; no chat template (TokenCounter renders `role: content`)."""

    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [0] * len(text.split())


def counting() -> Counting:
    counter = TokenCounter(WordTokenizer())
    return Counting(counter.estimate, counter.count_prompt)
