"""Classifiers behind one interface: rules and PII, embedding similarity,
and an LLM judge asked through the pipeline itself.

A classifier looks at a piece of text and returns a `Verdict` naming the
category it trips, or None. Rules are cheap and run inline; the embedding
classifier runs its model in a thread; the judge is a generation of its own.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from common.embeddings import Embedder

EMAIL = re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)*\.[a-zA-Z]{2,}\b")
PHONE = re.compile(
    r"(?<![\w+])(?:\+\d{1,3}(?:[\s.-]?\d{2,4}){2,4}"  # international: +44 20 7946 0958
    r"|\(?\d{3}\)?[\s.-]\d{3}[\s.-]\d{4})(?![\s.-]?\d)"  # national: (415) 555-0123
)
CARD = re.compile(r"(?<!\d)(?:\d[ -]?){12,18}\d(?!\d)")
DIGIT = re.compile(r"\d")


@dataclass(frozen=True, slots=True)
class Verdict:
    category: str
    reason: str
    classifier: str


class Classifier(Protocol):
    name: str
    settings: Mapping[str, object]
    """What it trips on, as plain values: two classifiers of one name with equal settings
    give the same verdicts (`SafetyPolicy.output_policy` digests them)."""

    async def classify(self, text: str) -> Verdict | None: ...


def luhn_valid(number: str) -> bool:
    digits = [int(c) for c in number if c.isdigit()]
    if not 13 <= len(digits) <= 19:
        return False
    total = 0
    for i, digit in enumerate(reversed(digits)):
        if i % 2 == 1:
            digit = digit * 2 - 9 if digit > 4 else digit * 2
        total += digit
    return total % 10 == 0


class RuleClassifier:
    """Keyword/regex categories plus PII: e-mail addresses, phone numbers, and card
    numbers that pass the Luhn check (so order numbers do not trip it)."""

    name = "rules"

    def __init__(self, categories: dict[str, list[str]], pii: Iterable[str] = ()) -> None:
        rules = [
            (category, pattern) for category, patterns in categories.items() for pattern in patterns
        ]
        # One pass over the text for every rule (this runs on each chunk of each stream).
        self._any = (
            re.compile("|".join(f"(?:{pattern})" for _, pattern in rules), re.IGNORECASE)
            if rules
            else None
        )
        self._patterns = [
            (category, re.compile(pattern, re.IGNORECASE)) for category, pattern in rules
        ]
        self._pii = set(pii)
        self.settings: Mapping[str, object] = {"categories": categories, "pii": sorted(self._pii)}

    async def classify(self, text: str) -> Verdict | None:
        return self.check(text)

    def check(self, text: str) -> Verdict | None:
        if self._any is not None and self._any.search(text):
            for category, pattern in self._patterns:
                if pattern.search(text):
                    return Verdict(category, f"matched {pattern.pattern!r}", self.name)
        if "email" in self._pii and "@" in text and EMAIL.search(text):
            return Verdict("pii", "an e-mail address", self.name)
        if not DIGIT.search(text):
            return None
        if "card" in self._pii and any(luhn_valid(m.group()) for m in CARD.finditer(text)):
            return Verdict("pii", "a payment card number", self.name)
        if "phone" in self._pii and PHONE.search(text):
            return Verdict("pii", "a phone number", self.name)
        return None


class EmbeddingClassifier:
    """Trips when the text is semantically close to a category's exemplars."""

    name = "embedding"

    def __init__(
        self, embedder: Embedder, exemplars: dict[str, list[str]], threshold: float
    ) -> None:
        self._embedder = embedder
        self._categories = [c for c, texts in exemplars.items() for _ in texts]
        self._vectors = embedder.embed([t for texts in exemplars.values() for t in texts])
        self.threshold = threshold
        self.settings: Mapping[str, object] = {
            "model": embedder.name,
            "exemplars": exemplars,
            "threshold": threshold,
        }

    async def classify(self, text: str) -> Verdict | None:
        if not text.strip() or not self._categories:
            return None
        [vector] = await asyncio.to_thread(self._embedder.embed, [text])
        scores = self._vectors @ vector
        best = int(np.argmax(scores))
        if scores[best] < self.threshold:
            return None
        return Verdict(self._categories[best], f"similarity {scores[best]:.2f}", self.name)


JUDGE_PROMPT = """Task: check if there is unsafe content in the text below according to
these categories: {categories}.

<BEGIN TEXT>
{text}
<END TEXT>

Answer with one line: "safe", or "unsafe" followed by the violated category."""


def judge_verdict(answer: str, categories: list[str], name: str = "judge") -> Verdict | None:
    """Parse a Llama-Guard-style answer: "safe" or "unsafe <category>"."""
    words = answer.strip().lower().split()
    if not words or words[0] != "unsafe":
        return None
    category = next((c for c in categories if c.lower() in words[1:]), "unsafe")
    return Verdict(category, "the judge model flagged it", name)


class ClassifierFailed(RuntimeError):
    """A classifier gave no verdict (the judge's generation failed, was retracted or
    timed out): the text is neither passed nor blocked, the check is unavailable."""


class JudgeClassifier:
    """Asks a model served by the pipeline itself; `ask` sends a prompt and returns
    the answer text (the wiring binds it to a low-priority generation)."""

    name = "judge"

    def __init__(self, ask: Callable[[str], Awaitable[str]], categories: list[str]) -> None:
        self._ask = ask
        self._categories = categories
        self.settings: Mapping[str, object] = {"categories": categories}

    async def classify(self, text: str) -> Verdict | None:
        prompt = JUDGE_PROMPT.format(categories=", ".join(self._categories), text=text)
        try:
            answer = await self._ask(prompt)
        except Exception as exc:  # no verdict is never a pass
            raise ClassifierFailed(f"{self.name}: {type(exc).__name__}: {exc}") from exc
        return judge_verdict(answer, self._categories, self.name)


async def first_verdict(classifiers: Iterable[Classifier], text: str) -> Verdict | None:
    """Run classifiers in order, cheapest first as configured; stop at the first hit.
    A classifier that raises (the judge with no verdict) raises here: the caller's check
    then fails or blocks, it never passes."""
    for classifier in classifiers:
        verdict = await classifier.classify(text)
        if verdict is not None:
            return verdict
    return None
