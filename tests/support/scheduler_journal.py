"""Requests submitted to scheduler processes, and the journal of what each ran."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

from bench.process_pipeline import Pipeline
from bus.replay import read_to_end
from schemas import topics
from schemas.answer import AnswerLog
from schemas.codec import TOKEN_EVENT
from schemas.events import (
    GenerationDone,
    GenerationError,
    GenerationRequest,
    TokenChunk,
    Unserved,
    WorkAssignment,
)
from workers.sim_engine import plan_reply

REPLY_TO = topics.deliver_topic("faults", "journal")


async def submit(pipe: Pipeline, *requests: GenerationRequest) -> None:
    for request in requests:
        await pipe.send(topics.requests_topic(request.tier), request, key=request.conversation_id)


@dataclass
class Stream:
    """One request's events on chat.tokens, as every reader takes them (`AnswerLog`)."""

    log: AnswerLog = field(default_factory=AnswerLog)
    text: str = ""
    ends: Counter = field(default_factory=Counter)  # (type, attempt, seq) -> copies

    def add(self, event: object) -> None:
        if isinstance(event, GenerationDone | GenerationError):
            self.ends[(event.type, event.attempt, event.seq)] += 1
        if self.log.take(event) and isinstance(event, TokenChunk):
            self.text += event.text


async def streams(
    pipe: Pipeline, requests: list[GenerationRequest], timeout_s: float = 30.0
) -> dict[str, Stream]:
    """Each request's stream, once every one has ended (then once more, for late copies)."""
    deadline = time.monotonic() + timeout_s
    ended_at = None
    while True:
        found = {r.request_id: Stream() for r in requests}
        for _, _, event in await read_to_end(
            pipe.kafka.bootstrap_servers, topics.TOKENS, TOKEN_EVENT
        ):
            if event.request_id in found:
                found[event.request_id].add(event)
        if all(s.log.ended for s in found.values()):
            if ended_at is not None and time.monotonic() - ended_at > 1.0:
                return found
            ended_at = ended_at or time.monotonic()
        elif time.monotonic() > deadline:
            open_ = [rid for rid, s in found.items() if not s.log.ended]
            raise AssertionError(f"streams not ended after {timeout_s}s: {open_}")
        await asyncio.sleep(0.3)


@dataclass
class Journal:
    """chat.work as workers read it: an assignment runs only if its epoch is at least
    the highest claim or assignment epoch before it on its partition."""

    runnable: list[WorkAssignment] = field(default_factory=list)
    fenced: list[WorkAssignment] = field(default_factory=list)
    unserved: list[Unserved] = field(default_factory=list)

    def of(self, request: GenerationRequest) -> list[WorkAssignment]:
        """The request's runnable assignments, first attempt first."""
        return sorted(
            (a for a in self.runnable if a.request.request_id == request.request_id),
            key=lambda a: (a.request.attempt, a.dispatched_at),
        )


def assert_each_ran_once(
    found: dict[str, Stream], work: Journal, requests: list[GenerationRequest]
) -> None:
    runs = Counter((a.request.request_id, a.request.attempt) for a in work.runnable)
    assert max(runs.values()) == 1, [key for key, n in runs.items() if n > 1]
    for request in requests:
        stream = found[request.request_id]
        assert len(stream.ends) == 1, (request.request_id, stream.ends)
        plan = plan_reply(request)
        assert isinstance(stream.log.end, GenerationDone), stream.log.end
        assert stream.log.end.status == plan.status
        assert stream.text == "".join(plan.tokens), f"{request.request_id}: gap or repeat"
