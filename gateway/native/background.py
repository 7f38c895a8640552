"""Generations the gateway asks for on its own behalf: conversation titles and
rolling summaries (prompts in `gateway.context.summaries`).

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
from dataclasses import dataclass
from typing import Any

from conversations.store import ApiKey, ConversationStore
from gateway.admission.limits import check_bus_size
from gateway.config import GatewayConfig
from gateway.context.builder import ContextBuilder
from gateway.context.summaries import SummaryJob, clean_title, title_request
from gateway.pipeline import Pipeline
from gateway.refusals import Refused
from gateway.streaming.generation import StreamTimers, start_generation
from schemas.answer import AnswerText
from schemas.events import (
    ChatMessage,
    DeliveryDone,
    GenerationRequest,
    SamplingOptions,
)
from schemas.generation import generation_request
from schemas.topics import Tier

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


@dataclass(frozen=True, slots=True)
class OwnRequests:
    """What the gateway's own generations need: the jobs they run as, the pipeline
    they go through, the store their titles and summaries go to, the context builder
    (which model summarises) and the gateway's configuration."""

    jobs: BackgroundJobs
    pipeline: Pipeline
    store: ConversationStore
    context: ContextBuilder
    config: GatewayConfig


def start_title(own: OwnRequests, owner: ApiKey, request: GenerationRequest,
                question: str) -> None:  # fmt: skip
    """Title the conversation of `request` (its first message, `question`) on the small
    model."""
    job = _write_title(own, owner, request, question)
    own.jobs.start(("title", request.conversation_id), job)


def start_summary(own: OwnRequests, owner: ApiKey, model: str, job: SummaryJob) -> None:
    """Summarise what `job` covers, for a conversation on `model`, unless one is running."""
    own.jobs.start(("summary", job.conversation_id), _write_summary(own, owner, model, job))


async def _write_title(own: OwnRequests, owner: ApiKey, request: GenerationRequest,
                       question: str) -> None:  # fmt: skip
    model = own.context.summary_model(request.model)
    text = await generate_text(own, own_request(
        own, owner, request.conversation_id, model, title_request(question),
        TITLE_MAX_TOKENS))  # fmt: skip
    title = clean_title(text or "", question)
    if title:
        await own.store.set_auto_title(request.conversation_id, title)


async def _write_summary(own: OwnRequests, owner: ApiKey, model: str, job: SummaryJob) -> None:
    summarizer = own.context.summary_model(model)
    text = await generate_text(own, own_request(
        own, owner, job.conversation_id, summarizer, job.messages,
        own.config.context.summary_max_tokens))  # fmt: skip
    if text and text.strip():
        await own.store.save_summary(job.conversation_id, job.through_message_id, text.strip())


def own_request(
    own: OwnRequests, owner: ApiKey, conversation_id: str, model: str,
    messages: tuple[ChatMessage, ...], max_tokens: int,
) -> GenerationRequest:  # fmt: skip
    """A lowest-priority, unstored request about `owner`'s conversation."""
    return generation_request(
        user_id=BACKGROUND_ACCOUNT,
        org_id=BACKGROUND_ACCOUNT,
        tier=Tier.FREE,
        cache_salt=owner.org_id,
        model=model,
        messages=messages,
        sampling=SamplingOptions(max_tokens=max_tokens, temperature=JOB_TEMPERATURE),
        reply_to=own.pipeline.reply_to,
        timeout_s=own.config.request_timeout_s,
        conversation_id=conversation_id,
    )


async def generate_text(own: OwnRequests, request: GenerationRequest) -> str | None:
    """The whole answer to `request`; None if it failed, was cut off or not taken
    (the free tier is shedding). Cancelling the caller cancels the generation."""
    if own.pipeline.overloaded(request.tier, request.model) is not None:
        return None
    try:
        check_bus_size(own.config.limits, request)
        generation = await start_generation(
            own.pipeline, request, timers=StreamTimers(own.config.stream_stall_s)
        )
    except Refused:
        log.warning(
            "background request %s not queued (too large for the bus, or the bus refused it)",
            request.request_id,
        )
        return None
    async with aclosing(generation.events()) as events:
        answer = await AnswerText().read(events)
    match answer.end:
        case DeliveryDone(status=status) if status.is_answered:
            return str(answer)
    return None
