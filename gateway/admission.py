"""Admission of a generation request: load shedding, token budgets, then rate limits
(DESIGN §5).

Shedding comes first, then the input safety check: while the scheduler reports that the caller's tier waits
longer than its bound, the request is refused with 503 and Retry-After before
anything is stored or charged.

The quota check only reads the ledger and comes first, so a request refused
for its budget is not charged to the rate limits. The rate-limit headers of an
admitted request are noted for its response, whatever response that turns out
to be (an SSE stream, a JSON answer, a later error): `ResponseHeaders` adds them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextvars import ContextVar

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conversations.store import ApiKey
from gateway.deps import GatewayDeps
from gateway.errors import ApiError
from gateway.rate_limits import admission_tokens
from safety.classifiers import first_verdict
from schemas.events import ChatMessage, ModerationEvent, Role

_noted_headers: ContextVar[dict[str, str] | None] = ContextVar("noted_headers", default=None)


async def admit(
    deps: GatewayDeps, owner: ApiKey, messages: Sequence[ChatMessage], max_tokens: int
) -> None:
    """Return if the request may run (its rate-limit charge made); else raise 503
    `overloaded`, or 429 `quota_exceeded` or `rate_limited`, with Retry-After and the
    rate-limit headers."""
    retry_after = deps.pipeline.overloaded(owner.tier)
    if retry_after is not None:
        raise ApiError(503, "overloaded",
                       f"the {owner.tier} tier is overloaded; retry in {retry_after:.0f} s",
                       headers={"Retry-After": str(math.ceil(retry_after))})
    if deps.safety is not None:
        await check_input(deps, owner, messages)
    limiter = deps.rate_limiter
    if deps.quotas is not None:
        try:
            await deps.quotas.check(owner)
        except ApiError as refused:
            if limiter is not None:
                refused.headers = {**await limiter.headers(owner), **(refused.headers or {})}
            raise
    if limiter is not None:
        note_response_headers(await limiter.acquire(owner, admission_tokens(messages, max_tokens)))


async def check_input(deps: GatewayDeps, owner: ApiKey, messages: Sequence[ChatMessage]) -> None:
    """Classify the new user message before anything is queued: a blocked one gets 400
    `content_blocked` naming the category, and the decision goes to chat.moderation."""
    assert deps.safety is not None
    text = next((m.content for m in reversed(messages) if m.role == Role.USER), "")
    verdict = await first_verdict(deps.safety.input_classifiers(owner.tier, "*"), text)
    if verdict is None:
        return
    await deps.pipeline.moderate(ModerationEvent(
        user_id=owner.user_id, action="block_input", category=verdict.category,
        reason=f"{verdict.classifier}: {verdict.reason}"))
    raise ApiError(400, "content_blocked",
                   f"the message was blocked by the {verdict.category} policy", param="content")


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
