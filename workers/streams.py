"""One attempt's events on `chat.tokens`: chunks at consecutive positions, then its end."""

from __future__ import annotations

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

    def _fields(self) -> dict[str, object]:
        seq, self.seq = self.seq, self.seq + 1
        return stream_fields(self.request, seq)

    async def _send(self, event: TokenChunk | GenerationDone | GenerationError) -> None:
        await self.publisher.send(topics.TOKENS, event, key=self.request.conversation_id)

    async def chunk(self, text: str, tokens: int, completion_tokens: int,
                    token_ids: list[int] | tuple[int, ...] = ()) -> None:
        await self._send(TokenChunk(**self._fields(), text=text, token_count=tokens,
                                    completion_tokens=completion_tokens,
                                    token_ids=tuple(token_ids)))

    async def done(self, status: RequestStatus, usage: Usage) -> None:
        await self._send(GenerationDone(**self._fields(), status=status, usage=usage))

    async def error(self, code: str, message: str) -> None:
        await self._send(GenerationError(**self._fields(), code=code, message=message))


def usage_of(last: EngineOutput | None, prior_tokens: int = 0) -> Usage:
    """The answer's usage after `last`: its completion tokens count what earlier attempts
    streamed too (`prior_tokens` when this attempt produced nothing)."""
    if last is None:
        return Usage(completion_tokens=prior_tokens)
    return Usage(prompt_tokens=last.prompt_tokens, completion_tokens=last.completion_tokens,
                 cached_tokens=last.cached_tokens)
