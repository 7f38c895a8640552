"""The input safety check: the last step of admission, once the prompt is built.

It runs after the cheap gates (`gateway.admission.gates`) because it may cost a
generation (the judge); a request it blocks stays charged to the rate limits.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from conversations.store import ApiKey
from gateway.pipeline import Pipeline
from gateway.refusals import Unacceptable, safety_unavailable
from moderation.classifiers import ClassifierFailed, first_verdict
from moderation.policy import SafetyPolicy
from schemas.events import ModerationEvent

ASKS_A_MODEL = frozenset({"judge"})
"""Classifiers that cost a generation each: run once per request."""

log = logging.getLogger(__name__)


async def check_input(
    safety: SafetyPolicy, pipeline: Pipeline, owner: ApiKey, model: str, texts: Sequence[str]
) -> None:
    """Classify every message the caller wrote, with the classifiers for its tier and
    model, before anything is queued or stored: a blocked one is refused `content_blocked`
    naming the category, and the decision goes to chat.moderation (through `pipeline`).

    Each distinct text is classified on its own, newest first (a blocked phrase hidden
    among long harmless messages must not be diluted); the first verdict stops it. A
    classifier that asks a model (the judge) runs once, over the texts joined: a request
    of many messages costs one judge generation, not one per message."""
    classifiers = safety.input_classifiers(owner.tier, model)
    if not classifiers:
        return
    per_text = [c for c in classifiers if c.name not in ASKS_A_MODEL]
    once = [c for c in classifiers if c.name in ASKS_A_MODEL]
    distinct = [text for text in dict.fromkeys(reversed(texts)) if text.strip()]
    checks = [(per_text, text) for text in distinct]
    if once and distinct:
        checks.append((once, "\n\n".join(reversed(distinct))))
    for chosen, text in checks:
        try:
            verdict = await first_verdict(chosen, text) if chosen else None
        except ClassifierFailed as exc:
            log.warning("input check failed for %s: %s", owner.key_id, exc)
            raise safety_unavailable() from exc
        if verdict is None:
            continue
        await pipeline.moderate(
            ModerationEvent(
                user_id=owner.user_id,
                action="block_input",
                category=verdict.category,
                reason=f"{verdict.classifier}: {verdict.reason}",
            )
        )
        raise Unacceptable(
            "content_blocked",
            f"the message was blocked by the {verdict.category} policy",
            param="content",
        )
