"""Which classifiers run where (`moderation.policy`), and the output policy as a digest:
equal for two requests exactly when the safety stage checks their answers alike."""

from __future__ import annotations

import dataclasses

import numpy as np

from moderation.classifiers import EmbeddingClassifier, RuleClassifier
from moderation.policy import PolicyConfig, SafetyPolicy, build_policy
from schemas.topics import Tier

CATEGORIES = {"weapons": [r"\bbomb\b"]}


def config(output: dict[str, list[str]], **changes: object) -> PolicyConfig:
    made = PolicyConfig(input_classifiers={"*": ["rules"]}, output_classifiers=output,
                        rule_categories=CATEGORIES, input_pii=[], output_pii=["email"],
                        embedding_exemplars={}, embedding_threshold=0.6)  # fmt: skip
    return dataclasses.replace(made, **changes)


def test_the_output_classifiers_of_a_tier_and_model_the_most_specific_key_winning() -> None:
    policy = build_policy(config({"*": ["rules"], "free": [], "free/big": ["rules"]}))
    assert [c.name for c in policy.output_classifiers(Tier.PRO, "tiny-random")] == ["rules"]
    assert policy.output_classifiers(Tier.FREE, "tiny-random") == []
    assert [c.name for c in policy.output_classifiers(Tier.FREE, "big")] == ["rules"]


def test_the_output_policy_differs_exactly_where_the_output_check_does() -> None:
    free_only = build_policy(config({"free": ["rules"]}))
    free = free_only.output_policy(Tier.FREE, "tiny-random")
    unchecked = free_only.output_policy(Tier.PRO, "tiny-random")
    assert len(free) == 64 and free != unchecked
    assert free_only.output_policy(Tier.ENTERPRISE, "tiny-random") == unchecked  # none: alike
    assert free_only.output_policy(Tier.FREE, "big") == free  # per tier: any model

    per_model = build_policy(config({"free/big": ["rules"]}))
    assert per_model.output_policy(Tier.FREE, "big") == free
    assert per_model.output_policy(Tier.FREE, "tiny-random") == unchecked

    everyone = build_policy(config({"*": ["rules"], "pro": ["rules"]}))
    assert everyone.output_policy(Tier.PRO, "tiny-random") == free, (
        "the same check, the same policy"
    )
    assert everyone.output_policy(Tier.FREE, "tiny-random") == free
    # made again (another gateway, a restart): the same digest, for the store they share
    assert build_policy(config({"free": ["rules"]})).output_policy(Tier.FREE, "tiny-random") == free


def test_a_changed_setting_of_a_classifier_changes_the_output_policy() -> None:
    base = build_policy(config({"*": ["rules"]})).output_policy(Tier.PRO, "tiny-random")
    changed = [
        config({"*": ["rules"]}, output_pii=["email", "phone"]),
        config({"*": ["rules"]}, output_pii=[]),
        config({"*": ["rules"]}, rule_categories={"weapons": [r"\bbombs?\b"]}),
        config({"*": ["rules"]}, rule_categories={**CATEGORIES, "violence": [r"\bkill\b"]}),
    ]
    digests = {build_policy(c).output_policy(Tier.PRO, "tiny-random") for c in changed}
    assert base not in digests and len(digests) == len(changed)
    # the input check's settings are not the output policy's
    same = build_policy(config({"*": ["rules"]}, input_pii=["card"], input_classifiers={}))
    assert same.output_policy(Tier.PRO, "tiny-random") == base


class Embedder:
    """Each text's vector: its length and 1, normalised (the classifier's model)."""

    name = "lengths"

    def embed(self, texts: list[str]) -> np.ndarray:
        vectors = np.array([[len(t), 1.0] for t in texts], dtype=np.float32)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_the_embedding_classifiers_model_exemplars_and_threshold_are_its_policy() -> None:
    def policy(threshold: float = 0.6, exemplars=None, classifiers=()) -> str:
        embedding = EmbeddingClassifier(Embedder(), exemplars or {"violence": ["hurt"]},
                                        threshold)  # fmt: skip
        made = SafetyPolicy(output={"*": [*classifiers, embedding]})
        return made.output_policy(Tier.PRO, "tiny-random")

    base = policy()
    assert policy() == base
    others = {policy(0.7), policy(exemplars={"violence": ["harm"]}),
              policy(classifiers=[RuleClassifier({})])}  # fmt: skip
    assert base not in others and len(others) == 3
