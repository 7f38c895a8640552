"""One attempt's events on `chat.tokens`: chunks at consecutive positions, then its end."""

from __future__ import annotations

from collections.abc import Callable

from bus.clients import Publisher
from schemas import topics
from schemas.events import (
    GenerationDone,
    GenerationError,
    GenerationRequest,
    TokenChunk,
    Usage,
    stream_fields,
)
from schemas.lifecycle import RequestStatus
from workers.engine import EngineOutput


class StreamWriter:
    """Publishes one attempt's events with consecutive seq numbers from `first_seq`."""

    def __init__(self, publisher: Publisher, request: GenerationRequest, first_seq: int) -> None:
        self.publisher = publisher
        self.request = request
        self.seq = first_seq  # gapless; the done/error event takes the next one

    async def _send(self, event: Callable[..., TokenChunk | GenerationDone | GenerationError],
                    **fields: object) -> None:
        """Send the next event; its position is taken only once the bus has it, so an
        event the bus refuses leaves no gap before the error that ends the stream."""
        await self.publisher.send(topics.TOKENS, event(**stream_fields(self.request, self.seq),
                                                       **fields),
                                  key=self.request.conversation_id)
        self.seq += 1

    async def chunk(self, text: str, tokens: int, completion_tokens: int,
                    token_ids: list[int] | tuple[int, ...] = ()) -> None:
        await self._send(TokenChunk, text=text, token_count=tokens,
                         completion_tokens=completion_tokens, token_ids=tuple(token_ids))

    async def done(self, status: RequestStatus, usage: Usage) -> None:
        await self._send(GenerationDone, status=status, usage=usage)

    async def error(self, code: str, message: str) -> None:
        await self._send(GenerationError, code=code, message=message)


def usage_of(last: EngineOutput | None, prior_tokens: int = 0) -> Usage:
    """The answer's usage after `last`: its completion tokens count what earlier attempts
    streamed too (`prior_tokens` when this attempt produced nothing)."""
    if last is None:
        return Usage(completion_tokens=prior_tokens)
    return Usage(prompt_tokens=last.prompt_tokens, completion_tokens=last.completion_tokens,
                 cached_tokens=last.cached_tokens)
