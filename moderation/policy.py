"""Which classifiers run where: the gateway's input check and the safety stage's output
check both look up their classifiers here.

Classifier lists are configured per `"<tier>/<model>"`, per `"<tier>"`, or for
every request with `"*"`, the most specific key winning. Names: `rules`,
`embedding`, `judge`. `SafetyPolicy.output_policy` names the output check a request gets
as a digest, equal for two requests exactly when their answers are checked alike: the
response cache keys on it, so an answer kept for one policy is never replayed under
another. `build_policy` makes them from a `PolicyConfig` (built from
the deployment's settings in `chatpipe/wiring.py`), once per process: the gateway
and the safety stage share one policy when they run together.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from moderation.classifiers import (
    Classifier,
    EmbeddingClassifier,
    JudgeClassifier,
    RuleClassifier,
)
from schemas.topics import Tier

Ask = Callable[[str], Awaitable[str]]


@dataclass(frozen=True)
class PolicyConfig:
    """What the classifiers are made of."""

    input_classifiers: dict[str, list[str]]
    """`"<tier>/<model>"`, `"<tier>"` or `"*"` -> classifier names, for the input check."""
    output_classifiers: dict[str, list[str]]
    """The same, for the output check (the safety stage)."""
    rule_categories: dict[str, list[str]]
    """category -> regular expressions (case-insensitive)."""
    input_pii: list[str]
    output_pii: list[str]
    embedding_exemplars: dict[str, list[str]]
    embedding_threshold: float


@dataclass
class SafetyPolicy:
    input: dict[str, list[Classifier]] = field(default_factory=dict)
    output: dict[str, list[Classifier]] = field(default_factory=dict)

    def input_classifiers(self, tier: Tier | None, model: str) -> list[Classifier]:
        return _lookup(self.input, tier, model)

    def output_classifiers(self, tier: Tier | None, model: str) -> list[Classifier]:
        return _lookup(self.output, tier, model)

    def output_policy(self, tier: Tier | None, model: str) -> str:
        """The output check of an answer for `tier` and `model` (the classifiers the
        safety stage picks, in order, each with what it trips on), as a hex SHA-256: two
        requests get the same digest exactly when their answers are checked alike, so
        two tiers under one policy share it and a changed setting (a PII kind, a
        category's patterns, a threshold) changes it. One digest for every request that
        no output classifier checks."""
        described = [[c.name, c.settings] for c in self.output_classifiers(tier, model)]
        encoded = json.dumps(described, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(encoded.encode()).hexdigest()


def _lookup(table: dict[str, list[Classifier]], tier: Tier | None, model: str) -> list[Classifier]:
    for key in (f"{tier}/{model}", str(tier), "*"):
        if key in table:
            return table[key]
    return []


def build_policy(config: PolicyConfig, ask: Ask | None = None) -> SafetyPolicy:
    """Classifier instances are shared across keys; the embedding model loads only
    when some key names `embedding`, the judge only when one names `judge` (it then
    needs `ask`: prompt in, the judge model's answer out).

    The judge checks input only (ValueError for an output list that names it): its
    answer streams through `chat.tokens`, which the safety stage relays, so the output
    check asking it would wait on the consumer that waits on it."""
    for key, names in config.output_classifiers.items():
        if "judge" in names:
            raise ValueError(
                f"output classifiers {key!r} name the judge, which can check "
                "input only (its own answer passes through the output check)"
            )
    made: dict[tuple[str, str], Classifier] = {}

    def make(name: str, direction: str) -> Classifier:
        if (name, direction) in made:
            return made[(name, direction)]
        if name == "rules":
            pii = config.input_pii if direction == "input" else config.output_pii
            classifier: Classifier = RuleClassifier(config.rule_categories, pii)
        elif name == "embedding":
            from common.embeddings import SentenceEmbedder

            shared = made.get(("embedding", "any"))
            classifier = shared or EmbeddingClassifier(
                SentenceEmbedder(), config.embedding_exemplars, config.embedding_threshold
            )
            made[("embedding", "any")] = classifier
        elif name == "judge":
            if ask is None:
                raise ValueError(
                    "the judge classifier needs a way to ask its model (`ask`): "
                    "a judge model and a started request/reply client"
                )
            classifier = JudgeClassifier(ask, sorted(config.rule_categories))
        else:
            raise ValueError(f"unknown classifier {name!r}")
        made[(name, direction)] = classifier
        return classifier

    return SafetyPolicy(
        input={
            key: [make(n, "input") for n in names]
            for key, names in config.input_classifiers.items()
        },
        output={
            key: [make(n, "output") for n in names]
            for key, names in config.output_classifiers.items()
        },
    )
