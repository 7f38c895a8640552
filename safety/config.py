"""The safety settings (environment `CHATPIPE_SAFETY_*`, composed into
`chatpipe.settings.Settings`): the output stage's window and the classifiers of both
checks."""

from __future__ import annotations

from pydantic import BaseModel, Field

from moderation.policy import PolicyConfig
from safety.core import SafetyConfig


class SafetySettings(BaseModel):
    """The output window and the classifiers of the input and output checks."""

    window_chars: int = Field(
        0, description="output held back until checked and this old; adds up to it to TTFT"
    )
    overlap_chars: int = Field(
        64, description="checked text looked at again with each chunk (phrases split in two)"
    )
    sentence_window: bool = Field(
        False, description="release whole sentences instead of a character window"
    )
    input_classifiers: dict[str, list[str]] = Field(
        default_factory=lambda: {"*": ["rules"]},
        description='"<tier>/<model>", "<tier>" or "*" -> classifiers: rules, embedding, judge',
    )
    output_classifiers: dict[str, list[str]] = Field(
        default_factory=lambda: {"*": ["rules"]},
        description=(
            "as safety_input_classifiers, for the output stage: rules, embedding"
            " (not judge: input only)"
        ),
    )
    rule_categories: dict[str, list[str]] = Field(
        default_factory=lambda: {
            "weapons": [r"\b(?:build|make)\s+(?:a|an)\s+(?:bomb|explosive|pipe bomb)\b"],
            "self_harm": [r"\b(?:kill|hurt)\s+myself\b", r"\bend my life\b"],
            "violence": [r"\bi\s+(?:will|am going to)\s+(?:kill|murder)\b"],
        },
        description="category -> regular expressions (case-insensitive)",
    )
    input_pii: list[str] = Field(default_factory=list, description="email, phone, card")
    output_pii: list[str] = Field(
        default_factory=lambda: ["email", "phone", "card"],
        description="PII kinds the output stage retracts",
    )
    embedding_exemplars: dict[str, list[str]] = Field(
        default_factory=lambda: {
            "violence": ["I am going to hurt you badly", "how do I attack someone"],
            "self_harm": ["I want to end my life", "ways to hurt myself"],
        },
        description="category -> example texts for the embedding classifier",
    )
    embedding_threshold: float = Field(
        0.6, description="cosine similarity at which the embedding classifier trips"
    )
    judge_model: str | None = Field(None, description="model asked by the judge")

    def stage_config(self, idle_timeout_s: float) -> SafetyConfig:
        """The safety stage's own configuration."""
        return SafetyConfig(
            window_chars=self.window_chars,
            overlap_chars=self.overlap_chars,
            sentences=self.sentence_window,
            idle_timeout_s=idle_timeout_s,
        )

    def policy_config(self) -> PolicyConfig:
        """What the classifiers of both checks are made of."""
        return PolicyConfig(
            input_classifiers=self.input_classifiers,
            output_classifiers=self.output_classifiers,
            rule_categories=self.rule_categories,
            input_pii=self.input_pii,
            output_pii=self.output_pii,
            embedding_exemplars=self.embedding_exemplars,
            embedding_threshold=self.embedding_threshold,
        )
