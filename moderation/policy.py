"""Which classifiers run where, and how much output is held back (settings → stages).

Classifier lists are configured per `"<tier>/<model>"`, per `"<tier>"`, or for
every request with `"*"`, the most specific key winning. Names: `rules`,
`embedding`, `judge`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from chatpipe.settings import Settings
from moderation.classifiers import (
    Classifier,
    EmbeddingClassifier,
    JudgeClassifier,
    RuleClassifier,
)
from safety.output_gate import OutputGate
from schemas.topics import Tier

Ask = Callable[[str], Awaitable[str]]


@dataclass
class SafetyPolicy:
    input: dict[str, list[Classifier]] = field(default_factory=dict)
    output: dict[str, list[Classifier]] = field(default_factory=dict)
    window_chars: int = 0
    overlap_chars: int = 64
    sentences: bool = False

    def gate(self) -> OutputGate:
        return OutputGate(self.window_chars, self.overlap_chars, self.sentences)

    def input_classifiers(self, tier: Tier | None, model: str) -> list[Classifier]:
        return _lookup(self.input, tier, model)

    def output_classifiers(self, tier: Tier | None, model: str) -> list[Classifier]:
        return _lookup(self.output, tier, model)

    @staticmethod
    def replacement(category: str) -> str:
        return f"[This answer was removed: {category}]"


def _lookup(table: dict[str, list[Classifier]], tier: Tier | None,
            model: str) -> list[Classifier]:
    for key in (f"{tier}/{model}", str(tier), "*"):
        if key in table:
            return table[key]
    return []


def build_policy(settings: Settings, ask: Ask | None = None) -> SafetyPolicy:
    """Classifier instances are shared across keys; the embedding model loads only
    when some key names `embedding`, the judge only when one names `judge`."""
    s = settings
    made: dict[tuple[str, str], Classifier] = {}

    def make(name: str, direction: str) -> Classifier:
        if (name, direction) in made:
            return made[(name, direction)]
        if name == "rules":
            pii = s.safety_input_pii if direction == "input" else s.safety_output_pii
            classifier: Classifier = RuleClassifier(s.safety_rule_categories, pii)
        elif name == "embedding":
            from common.embeddings import SentenceEmbedder

            shared = made.get(("embedding", "any"))
            classifier = shared or EmbeddingClassifier(
                SentenceEmbedder(), s.safety_embedding_exemplars, s.safety_embedding_threshold)
            made[("embedding", "any")] = classifier
        elif name == "judge":
            if ask is None or not s.safety_judge_model:
                raise ValueError("the judge classifier needs CHATPIPE_SAFETY_JUDGE_MODEL")
            classifier = JudgeClassifier(ask, sorted(s.safety_rule_categories))
        else:
            raise ValueError(f"unknown classifier {name!r}")
        made[(name, direction)] = classifier
        return classifier

    return SafetyPolicy(
        input={key: [make(n, "input") for n in names]
               for key, names in s.safety_input_classifiers.items()},
        output={key: [make(n, "output") for n in names]
                for key, names in s.safety_output_classifiers.items()},
        window_chars=s.safety_window_chars,
        overlap_chars=s.safety_overlap_chars,
        sentences=s.safety_sentence_window,
    )
