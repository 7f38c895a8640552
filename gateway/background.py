"""Generations the gateway asks for on its own behalf: conversation titles and
rolling summaries (prompts in `gateway.summaries`).

They go through the pipeline like any request, but at the lowest priority
(`Tier.FREE`), on the small model, unstored (`store=False`), and never hold
up the user's answer: each runs as a task of `BackgroundJobs`, at most one
per kind and conversation. Closing the jobs (the app's shutdown, or deleting
the conversation) cancels the tasks and, through their streams, their
generations. A job that fails leaves things as they were: the fallback title
stays, the next turn asks for the summary again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

from conversations.store import ApiKey
from gateway.core import Refused
from gateway.generation import StreamTimers, start_generation
from gateway.limits import check_bus_size
from gateway.summaries import SummaryJob, clean_title, title_request
from schemas.answer import AnswerText
from schemas.events import (
    ChatMessage,
    DeliveryDone,
    GenerationRequest,
    SamplingOptions,
)
from schemas.generation import generation_request
from schemas.topics import Tier

if TYPE_CHECKING:
    from gateway.deps import GatewayDeps

log = logging.getLogger(__name__)

TITLE_MAX_TOKENS = 24
JOB_TEMPERATURE = 0.3

BACKGROUND_ACCOUNT = "chatpipe-background"
"""User and org of every background request: never billed to a user's budget, and
fair-shared in the free tier as one org, so titles and summaries cannot crowd
out users' requests. `cache_salt` stays the owner's org (tenant isolation)."""

JobKey = tuple[str, str]
"""(kind, conversation_id)."""


class BackgroundJobs:
    """Tasks the gateway runs beside the requests it serves, one per key at a time."""

    def __init__(self) -> None:
        self._tasks: dict[JobKey, asyncio.Task[None]] = {}

    def start(self, key: JobKey, job: Coroutine[Any, Any, None]) -> bool:
        """Run `job` unless a job with this key is still running (then drop it)."""
        if key in self._tasks:
            job.close()
            return False
        task = asyncio.create_task(job, name=f"{key[0]}:{key[1]}")
        self._tasks[key] = task
        task.add_done_callback(lambda done: self._finished(key, done))
        return True

    def __len__(self) -> int:
        return len(self._tasks)

    async def cancel(self, conversation_id: str | None = None) -> None:
        """Cancel the jobs of one conversation (None: every job) and wait for them."""
        tasks = [task for (_, cid), task in self._tasks.items()
                 if conversation_id is None or cid == conversation_id]  # fmt: skip
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        await self.cancel()

    def _finished(self, key: JobKey, task: asyncio.Task[None]) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]
        if not task.cancelled() and task.exception() is not None:
            log.warning("%s job failed", task.get_name(), exc_info=task.exception())


def start_title(deps: GatewayDeps, owner: ApiKey, request: GenerationRequest,
                question: str, answer: str) -> None:  # fmt: skip
    """Title the conversation of `request` (its first exchange) on the small model."""
    job = _write_title(deps, owner, request, question, answer)
    deps.background.start(("title", request.conversation_id), job)


def start_summary(deps: GatewayDeps, owner: ApiKey, model: str, job: SummaryJob) -> None:
    """Summarise what `job` covers, for a conversation on `model`, unless one is running."""
    deps.background.start(("summary", job.conversation_id), _write_summary(deps, owner, model, job))


async def _write_title(deps: GatewayDeps, owner: ApiKey, request: GenerationRequest,
                       question: str, answer: str) -> None:  # fmt: skip
    model = deps.context.summary_model(request.model)
    text = await generate_text(deps, own_request(
        deps, owner, request.conversation_id, model, title_request(question, answer),
        TITLE_MAX_TOKENS))  # fmt: skip
    title = clean_title(text or "")
    if title:
        await deps.store.set_auto_title(request.conversation_id, title)


async def _write_summary(deps: GatewayDeps, owner: ApiKey, model: str, job: SummaryJob) -> None:
    summarizer = deps.context.summary_model(model)
    text = await generate_text(deps, own_request(
        deps, owner, job.conversation_id, summarizer, job.messages,
        deps.config.context.summary_max_tokens))  # fmt: skip
    if text and text.strip():
        await deps.store.save_summary(job.conversation_id, job.through_message_id, text.strip())


def own_request(
    deps: GatewayDeps, owner: ApiKey, conversation_id: str, model: str,
    messages: tuple[ChatMessage, ...], max_tokens: int,
) -> GenerationRequest:  # fmt: skip
    """A lowest-priority, unstored request about `owner`'s conversation."""
    return generation_request(
        user_id=BACKGROUND_ACCOUNT, org_id=BACKGROUND_ACCOUNT, tier=Tier.FREE,
        cache_salt=owner.org_id, model=model, messages=messages,
        sampling=SamplingOptions(max_tokens=max_tokens, temperature=JOB_TEMPERATURE),
        reply_to=deps.pipeline.reply_to, timeout_s=deps.config.request_timeout_s,
        conversation_id=conversation_id,
    )


async def generate_text(deps: GatewayDeps, request: GenerationRequest) -> str | None:
    """The whole answer to `request`; None if it failed, was cut off or not taken
    (the free tier is shedding). Cancelling the caller cancels the generation."""
    if deps.pipeline.overloaded(request.tier) is not None:
        return None
    try:
        check_bus_size(deps.config.limits, request)
        generation = await start_generation(deps.pipeline, request,
                                            timers=StreamTimers(deps.config.stream_stall_s))
    except Refused:
        log.warning("background request %s not queued (too large for the bus, or the bus refused it)", request.request_id)
        return None
    async with aclosing(generation.events()) as events:
        answer = await AnswerText().read(events)
    match answer.end:
        case DeliveryDone(status=status) if status.is_answered:
            return str(answer)
    return None
