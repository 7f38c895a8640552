"""Admission of a generation request: cheap gates first, then the
expensive input safety check.

`admit` runs before any expensive work (store polling, the prompt's build, the
classifiers): shedding (in memory), then token budgets (a ledger read, charging
nothing, so a request refused for its budget is not charged to the rate limits),
then the rate limits, charged at once from an estimate of the request's tokens.
A request refused after that (its prompt does not fit, its input is blocked, it is
too large for the bus) stays charged: it cost the work that refused it.

The rate-limit headers of an admitted request are noted for its response, whatever
response that turns out to be (an SSE stream, a JSON answer, a later error):
`ResponseHeaders` adds them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conversations.store import ApiKey
from gateway.admission.quotas import QuotaGate
from gateway.admission.rate_limits import RateLimiter
from gateway.errors import ApiError
from gateway.pipeline import Pipeline
from gateway.refusals import Unacceptable, Unavailable, safety_unavailable
from moderation.classifiers import ClassifierFailed, first_verdict
from moderation.policy import SafetyPolicy
from ops.metrics import admission_rejected
from schemas.events import ModerationEvent

ASKS_A_MODEL = frozenset({"judge"})
"""Classifiers that cost a generation each: run once per request."""

_noted_headers: ContextVar[dict[str, str] | None] = ContextVar("noted_headers", default=None)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Gates:
    """What admission asks: the pipeline (is the tier shedding; where a blocked input is
    reported), the budgets and rate limits, the input classifiers (None: that gate is off)."""

    pipeline: Pipeline
    rate_limiter: RateLimiter | None = None
    quotas: QuotaGate | None = None
    safety: SafetyPolicy | None = None


async def admit(gates: Gates, owner: ApiKey, tokens: int, model: str) -> None:
    """Return if the request for `model` may run (charged `tokens` against the token
    limits); else refuse it `overloaded` (the scheduler shard of `model` sheds its tier),
    or raise 429 `quota_exceeded` or `rate_limited`, with Retry-After and the rate-limit
    headers."""
    retry_after = gates.pipeline.overloaded(owner.tier, model)
    if retry_after is not None:
        admission_rejected(owner.tier, "overloaded")
        raise Unavailable(
            "overloaded",
            f"the {owner.tier} tier is overloaded; retry in {retry_after:.0f} s",
            retry_after_s=math.ceil(retry_after),
        )
    limiter = gates.rate_limiter
    if gates.quotas is not None:
        try:
            await gates.quotas.check(owner)
        except ApiError as refused:
            admission_rejected(owner.tier, refused.code)
            if limiter is not None:
                refused.headers = {**await limiter.headers(owner), **(refused.headers or {})}
            raise
    if limiter is not None:
        try:
            headers = await limiter.acquire(owner, tokens)
        except ApiError as refused:
            admission_rejected(owner.tier, refused.code)
            raise
        note_response_headers(headers)


async def charge_rest(gates: Gates, owner: ApiKey, estimated: int, actual: int) -> None:
    """Charge what an admitted request costs beyond the estimate it was admitted with."""
    if gates.rate_limiter is not None and actual > estimated:
        await gates.rate_limiter.charge_tokens(owner, actual - estimated)


async def check_input(gates: Gates, owner: ApiKey, model: str, texts: Sequence[str]) -> None:
    """Classify every message the caller wrote, with the classifiers for its tier and
    model, before anything is queued or stored: a blocked one is refused `content_blocked`
    naming the category, and the decision goes to chat.moderation.

    Each distinct text is classified on its own, newest first (a blocked phrase hidden
    among long harmless messages must not be diluted); the first verdict stops it. A
    classifier that asks a model (the judge) runs once, over the texts joined: a request
    of many messages costs one judge generation, not one per message."""
    if gates.safety is None:
        return
    classifiers = gates.safety.input_classifiers(owner.tier, model)
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
        await gates.pipeline.moderate(
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


def note_response_headers(headers: dict[str, str]) -> None:
    """Headers for the response to the current request (needs `ResponseHeaders`)."""
    noted = _noted_headers.get()
    if noted is not None:
        noted.update(headers)


class ResponseHeaders:
    """ASGI middleware: adds the headers noted while handling a request to its response.

    Routes build their own responses; this lets admission add headers to any of
    them without each route passing them along. A header the response already
    has is kept.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        noted: dict[str, str] = {}
        token = _noted_headers.set(noted)

        async def send_with_noted(message: Message) -> None:
            if message["type"] == "http.response.start" and noted:
                message.setdefault("headers", [])
                headers = MutableHeaders(scope=message)
                for name, value in noted.items():
                    if name not in headers:
                        headers[name] = value
            await send(message)

        try:
            await self.app(scope, receive, send_with_noted)
        finally:
            _noted_headers.reset(token)
