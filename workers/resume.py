"""Reading back what earlier attempts of a request streamed, so a new attempt
continues it: the client sees no gap and no repeat (DESIGN §9).

The scheduler wrote a marker on the request's `chat.tokens` partition before each
attempt (`GenerationRequest.stream`): a continuation reads from the first marker up
to its own, a known end, and takes the events the one answer rule
(`schemas.answer.AnswerLog`) takes, exactly as every other reader of the stream does.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from bus.clients import KafkaConfig
from bus.replay import read_between
from schemas import topics
from schemas.answer import AnswerLog
from schemas.codec import TOKEN_EVENT
from schemas.events import Event, GenerationRequest, TokenChunk

READ_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class PriorOutput:
    text: str
    tokens: int
    next_seq: int
    finished: bool  # an earlier attempt already ended the stream
    token_ids: tuple[int, ...] = ()
    """The tokens themselves, when every chunk carried all of its own."""

    @property
    def streamed(self) -> bool:
        return self.next_seq > 0


NOTHING = PriorOutput("", 0, 0, False)


def assemble(request_id: str, events: Iterable[Event]) -> PriorOutput:
    """The output earlier attempts left, from the stream's events in partition order."""
    log = AnswerLog()
    text: list[str] = []
    token_ids: list[int] = []
    tokens = 0
    for event in events:
        if getattr(event, "request_id", None) != request_id or not log.take(event):
            continue
        if isinstance(event, TokenChunk):
            text.append(event.text)
            token_ids += event.token_ids
            tokens = event.completion_tokens
    exact = tuple(token_ids) if len(token_ids) == tokens else ()
    return PriorOutput("".join(text), tokens, log.next_seq, log.ended, exact)


async def read_prior_output(kafka: KafkaConfig, request: GenerationRequest) -> PriorOutput:
    """What attempts before `request.attempt` streamed: `chat.tokens` between the first
    marker and this attempt's own. Raises TimeoutError if that range cannot be read."""
    stream = request.stream
    if request.attempt == 0 or stream is None or stream.start_offset >= stream.attempt_offset:
        return NOTHING
    records = await read_between(
        kafka, topics.TOKENS,
        {stream.partition: (stream.start_offset, stream.attempt_offset)}, TOKEN_EVENT,
        timeout_s=READ_TIMEOUT_S, key=request.conversation_id.encode())
    return assemble(request.request_id, (event for _, _, event in records))
