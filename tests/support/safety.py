"""A safety stage fed by hand, and what it publishes."""

from __future__ import annotations

from aiokafka.structs import ConsumerRecord

from moderation.classifiers import (
    RuleClassifier,
)
from moderation.policy import SafetyPolicy
from safety.core import SafetyConfig
from safety.stage import SafetyStage
from schemas import topics
from schemas.codec import encode
from schemas.events import (
    GenerationDone,
    TokenChunk,
    Usage,
)
from schemas.lifecycle import RequestStatus

STREAM = dict(
    request_id="r",
    conversation_id="c",
    message_id="m",
    model="tiny-random",
    reply_to="chat.deliver.gw",
)


class RecordingPublisher:
    def __init__(self) -> None:
        self.sent: list[tuple[str, object]] = []

    async def send(self, topic, event, key=None, partition=None):
        self.sent.append((topic, event))

    async def flush(self) -> None:
        pass


def record(event, offset: int) -> ConsumerRecord:
    return ConsumerRecord(topics.TOKENS, 0, offset, 0, 0, None, encode(event), None, 0, 0, [])


def stage_with(window: int = 0) -> tuple[SafetyStage, RecordingPublisher]:
    rules = RuleClassifier({}, pii=["email"])
    stage = SafetyStage(
        kafka=None,
        policy=SafetyPolicy(output={"*": [rules]}),
        config=SafetyConfig(window_chars=window, overlap_chars=16),
    )
    stage.runner.publisher = RecordingPublisher()  # type: ignore[assignment]
    return stage, stage.runner.publisher  # type: ignore[return-value]


def stream_records(texts: list[str], done: bool = True) -> list[ConsumerRecord]:
    """A stream's `chat.tokens` records from offset 0: a chunk per text, then its end."""
    events: list[object] = [
        TokenChunk(**STREAM, seq=seq, text=text, token_count=1, completion_tokens=seq + 1)
        for seq, text in enumerate(texts)
    ]
    if done:
        events.append(
            GenerationDone(
                **STREAM,
                seq=len(texts),
                status=RequestStatus.FINISHED_STOPPED,
                usage=Usage(completion_tokens=len(texts)),
            )
        )
    return [record(event, offset) for offset, event in enumerate(events)]


async def feed(stage: SafetyStage, texts: list[str], done: bool = True) -> None:
    for each in stream_records(texts, done):
        await stage.handle(each)


def to_gateway(out: RecordingPublisher) -> list[object]:
    return [event for topic, event in out.sent if topic == "chat.deliver.gw"]


def chunk_of(seq: int, text: str, attempt: int = 0) -> TokenChunk:
    return TokenChunk(
        **STREAM, seq=seq, attempt=attempt, text=text, token_count=1, completion_tokens=seq + 1
    )
