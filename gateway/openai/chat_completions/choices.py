"""Several choices of one completion (`n` > 1): n generations in parallel.

The pipeline carries one answer per request: one stream on `chat.tokens`, one
position sequence the gateway resumes and deduplicates by, one usage record, one
cancel. So each choice is a request of its own (a fresh request id; with a seed,
seed + index, as vLLM seeds the choices of one `SamplingParams.n` request), and the
gateway joins their streams, each chunk carrying its choice's `index`. The choices
share the prompt: vLLM's prefix cache serves it to the choices a worker runs after
the first. Usage counts the prompt once, as OpenAI does, and every choice's
completion tokens; billing charges what each generation used (`chat.usage`), the
rate limits reserve `n` times `max_tokens` at admission, and the choices hold `n` of
their key's concurrent requests, each until its own answer ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing

from gateway.admission.leases import Leases
from gateway.openai.chat_completions.protocol import choice_sampling
from gateway.pipeline import Pipeline
from gateway.streaming.generation import Generation, LiveRequests, StreamTimers, start_generation
from schemas.events import DeliverEvent, GenerationRequest, Usage
from schemas.generation import new_id


def choice_requests(request: GenerationRequest, n: int) -> list[GenerationRequest]:
    """`request` and n - 1 others like it, one per choice."""
    return [
        request,
        *(
            request.model_copy(
                update={
                    "request_id": new_id(),
                    "message_id": new_id(),
                    "sampling": choice_sampling(request.sampling, index),
                }
            )
            for index in range(1, n)
        ),
    ]


async def start_choices(
    pipeline: Pipeline,
    requests: Sequence[GenerationRequest],
    live: LiveRequests | None,
    timers: StreamTimers,
    leases: Leases | None = None,
) -> list[Generation]:
    """One generation per choice, each holding one of `leases`; all of them or none
    (those started are cancelled)."""
    generations: list[Generation] = []
    try:
        for request in requests:
            lease = leases.claim() if leases is not None else None
            generations.append(
                await start_generation(pipeline, request, live, timers=timers, lease=lease)
            )
    except BaseException:
        await close_all(generations)
        raise
    return generations


async def close_all(generations: Sequence[Generation]) -> None:
    for generation in generations:
        await generation.close()


async def choice_batches(
    generations: Sequence[Generation],
) -> AsyncGenerator[tuple[int, list[DeliverEvent]]]:
    """Each choice's batches of events as they come, with the choice's index; ends when
    every choice's stream has. Leaving early closes every generation."""
    if len(generations) == 1:
        async with aclosing(generations[0].batches()) as batches:
            async for batch in batches:
                yield 0, batch
        return
    arrived: asyncio.Queue[tuple[int, list[DeliverEvent] | None]] = asyncio.Queue()

    async def relay(index: int, generation: Generation) -> None:
        try:
            async with aclosing(generation.batches()) as batches:
                async for batch in batches:
                    arrived.put_nowait((index, batch))
        finally:
            arrived.put_nowait((index, None))

    relays = [asyncio.create_task(relay(i, g)) for i, g in enumerate(generations)]
    running = len(relays)
    try:
        while running:
            index, arrival = await arrived.get()
            if arrival is None:
                running -= 1
            else:
                yield index, arrival
    finally:
        for task in relays:
            task.cancel()
        await asyncio.gather(*relays, return_exceptions=True)


def total_usage(usages: Sequence[Usage]) -> Usage:
    """The usage of a completion of several choices: the prompt once (the first
    choice's count), the completion tokens of all."""
    first = usages[0]
    if len(usages) == 1:
        return first
    return Usage(
        prompt_tokens=first.prompt_tokens,
        cached_tokens=first.cached_tokens,
        completion_tokens=sum(usage.completion_tokens for usage in usages),
    )
