"""Reading back what earlier attempts of a request streamed, so a new attempt
continues it: the client sees no gap and no repeat.

The scheduler wrote a marker on the request's `chat.tokens` partition before each
attempt (`GenerationRequest.stream`): a continuation reads from the first marker up
to its own, a known end, and takes the events the one answer rule
(`schemas.answer.AnswerLog`) takes (`workers.core.assemble`), exactly as every other
reader of the stream does.
"""

from __future__ import annotations

from bus.clients import KafkaConfig
from bus.replay import read_between
from schemas import topics
from schemas.codec import TOKEN_EVENT
from schemas.events import GenerationRequest
from workers.core import NOTHING, PriorOutput, assemble

READ_TIMEOUT_S = 30.0


async def read_prior_output(kafka: KafkaConfig, request: GenerationRequest) -> PriorOutput:
    """What attempts before `request.attempt` streamed: `chat.tokens` between the first
    marker and this attempt's own. Raises TimeoutError if that range cannot be read."""
    stream = request.stream
    if request.attempt == 0 or stream is None or stream.start_offset >= stream.attempt_offset:
        return NOTHING
    records = await read_between(
        kafka,
        topics.TOKENS,
        {stream.partition: (stream.start_offset, stream.attempt_offset)},
        TOKEN_EVENT,
        timeout_s=READ_TIMEOUT_S,
        key=request.conversation_id.encode(),
    )
    return assemble(request.answer_id, (event for _, _, event in records))
