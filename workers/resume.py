"""Reading back what earlier attempts of a request streamed, so a new attempt
continues it: the client sees no gap and no repeat (DESIGN §9)."""

from __future__ import annotations

from dataclasses import dataclass

from aiokafka.structs import TopicPartition

from bus.clients import KafkaConfig
from schemas import topics
from schemas.codec import TOKEN_EVENT, EventDecodeError, decode
from schemas.events import GenerationDone, GenerationError, GenerationRequest, TokenChunk

IDLE_POLLS = 3  # empty fetches in a row: caught up with the partition


@dataclass(frozen=True, slots=True)
class PriorOutput:
    text: str
    tokens: int
    next_seq: int
    finished: bool  # an earlier attempt already ended the stream


def assemble(request_id: str, attempt: int, events: list[object]) -> PriorOutput:
    """The gap-free output of attempts before `attempt`: per seq, the newest attempt's
    chunk, up to the first missing seq."""
    chunks: dict[int, TokenChunk] = {}
    finished = False
    for event in events:
        if getattr(event, "request_id", None) != request_id or event.attempt >= attempt:
            continue
        if isinstance(event, GenerationDone | GenerationError):
            finished = True
        elif isinstance(event, TokenChunk):
            held = chunks.get(event.seq)
            if held is None or held.attempt < event.attempt:
                chunks[event.seq] = event
    text, tokens, seq = [], 0, 0
    while seq in chunks:
        text.append(chunks[seq].text)
        tokens = chunks[seq].completion_tokens
        seq += 1
    return PriorOutput("".join(text), tokens, seq, finished)


async def read_prior_output(kafka: KafkaConfig, request: GenerationRequest) -> PriorOutput:
    """Read `chat.tokens` from the resume point until caught up."""
    resume = request.resume
    if resume is None:
        return PriorOutput("", 0, 0, False)
    consumer = kafka.consumer()
    await consumer.start()
    try:
        tp = TopicPartition(topics.TOKENS, resume.tokens_partition)
        consumer.assign([tp])
        consumer.seek(tp, resume.from_offset)
        events: list[object] = []
        idle = 0
        while idle < IDLE_POLLS:
            batch = await consumer.getmany(tp, timeout_ms=100)
            records = batch.get(tp, [])
            idle = 0 if records else idle + 1
            for record in records:
                try:
                    events.append(decode(TOKEN_EVENT, record.value))
                except EventDecodeError:
                    continue
        return assemble(request.request_id, request.attempt, events)
    finally:
        await consumer.stop()
