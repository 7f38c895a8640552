"""The engine interface a worker drives: one engine per worker process.

Adapters: `workers.vllm_engine.VllmEngine` (vLLM AsyncLLM in process) and
`workers.sim_engine.SimEngine` (deterministic text at a set token rate).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from schemas.events import GenerationRequest, Logprobs
from schemas.lifecycle import RequestStatus
from schemas.tools import ToolCalls


@dataclass(frozen=True, slots=True)
class EngineOutput:
    """One step's new output for one request.

    `text` is the new text since the previous output (a delta) and `token_ids` its
    tokens, where the engine has them; `completion_tokens` counts every output token
    so far; `status` is set on the last output only (a terminal `RequestStatus`), and
    with it `tool_calls`: the tools the whole answer called, where it called any.
    """

    text: str
    new_tokens: int
    completion_tokens: int
    prompt_tokens: int
    cached_tokens: int = 0
    status: RequestStatus | None = None
    token_ids: tuple[int, ...] = ()
    tool_calls: ToolCalls | None = None
    logprobs: Logprobs = ()
    """The new tokens' log probabilities, when the request asked for them."""


@dataclass(frozen=True, slots=True)
class Continuation:
    """Output an earlier attempt already streamed: the engine continues after it.

    `token_ids` are those tokens exactly, when every chunk carried them: an engine
    continues from them rather than from the text, whose tokens may differ once
    encoded again (so a greedy continuation is the uninterrupted answer)."""

    text: str
    tokens: int
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class EngineStats:
    running: int
    waiting: int
    free_kv_blocks: int | None = None


class Engine(Protocol):
    model: str

    @property
    def max_slots(self) -> int:
        """Requests it runs at once (the scheduler's slots for it); known once started."""
        ...

    async def start(self) -> None:
        """Load the model; returns when the engine accepts requests."""

    async def stop(self) -> None: ...

    def generate(
        self, request: GenerationRequest, continuation: Continuation | None = None
    ) -> AsyncIterator[EngineOutput]:
        """Submit at once and stream outputs; many calls run concurrently.

        Ends after the output with a terminal status. `abort(request_id)`
        makes it end (status FINISHED_ABORTED) within one engine step. With a
        `continuation` the answer goes on after that text: `completion_tokens`
        and `max_tokens` count its tokens too.
        """

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...
