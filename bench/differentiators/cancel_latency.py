"""Cancel latency: from a client hanging up to the worker aborting the generation in
its engine, and the tokens generated after the hang-up.

Clients of the OpenAI API hang up after 2 to 16 content chunks (`bench.load.disconnects`).
The hang-up is the client's close of its connection; the abort is the worker's
`cancel <request id>` log line, written as it calls the engine's `abort` (no event
carries that instant). The attempt's aborted end on `chat.tokens`, published once the
engine has stopped, is measured too, as an upper bound read from the bus. Tokens after
the hang-up are counted as `bench/cancel.py` counts them: the usage event's completion
tokens less those published on `chat.tokens` by the hang-up (an upper bound: it also
counts the few the worker held for its next chunk).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from bench.cancel import HangUp
from bench.load import disconnects, fixed_prompts
from bench.metrics import percentile
from bench.process_pipeline import API_KEY, Pipeline
from bench.sse_client import StreamRecord, Target
from bench.topic_log import chunks_of, token_events, usage_events
from chatpipe.tiny_model import TINY_MODEL_DIR
from schemas.events import GenerationDone
from schemas.lifecycle import RequestStatus

TARGET_P99_MS = 100.0
_ABORT = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO workers\.stage cancel (\S+): (\S+)"
)


def abort_times(lines: Iterable[str]) -> dict[str, float]:
    """Request id -> when a worker aborted it for a client's hang-up (epoch seconds, the
    log's local time), from worker log lines; the first abort of each."""
    aborted: dict[str, float] = {}
    for line in lines:
        match = _ABORT.match(line)
        if match and match[3] == "client_disconnected":
            at = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            aborted.setdefault(match[2], at)
    return aborted


@dataclass(frozen=True, slots=True)
class CancelTiming:
    hung_up_at: float
    """The client's close (epoch seconds)."""
    aborted_at: float
    """The worker's abort (epoch seconds)."""
    ended_at: float | None
    """The aborted end's record timestamp on chat.tokens (epoch seconds)."""
    tokens: HangUp

    @property
    def latency_ms(self) -> float:
        return (self.aborted_at - self.hung_up_at) * 1000

    @property
    def end_ms(self) -> float | None:
        return None if self.ended_at is None else (self.ended_at - self.hung_up_at) * 1000


@dataclass(frozen=True)
class CancelLatencyStats:
    hang_ups: int
    timings: list[CancelTiming] = field(default_factory=list)

    def latency_ms(self, q: float) -> float:
        return percentile([t.latency_ms for t in self.timings], q)

    def end_ms(self, q: float) -> float:
        return percentile([ms for t in self.timings if (ms := t.end_ms) is not None], q)

    def generated_after(self, q: float) -> float:
        return percentile([t.tokens.generated_after for t in self.timings], q)

    def waste(self, q: float) -> float:
        """Tokens generated that the client never got (in flight, held, or after)."""
        return percentile([t.tokens.waste for t in self.timings], q)

    @property
    def met(self) -> bool:
        return bool(self.timings) and self.latency_ms(99) <= TARGET_P99_MS


def timing(
    record: StreamRecord,
    aborted_at: float,
    ended_at: float | None,
    published: list[tuple[float, int]],
    received: int,
    generated: int,
) -> CancelTiming:
    """One hang-up; `published`: (record timestamp s, completion tokens so far) of each
    chunk of the request on chat.tokens."""
    hung_up_at = record.wall(record.ended)
    before = max((tokens for at, tokens in published if at <= hung_up_at), default=0)
    return CancelTiming(hung_up_at, aborted_at, ended_at, HangUp(received, before, generated))


def aborted_ends(found: list[tuple[int, Any]], request_ids: set[str]) -> dict[str, float]:
    """Request id -> the record timestamp (s) of its aborted end among `found`, the
    events of `chat.tokens` (`bench.topic_log.token_events`)."""
    return {
        e.request_id: at_ms / 1000
        for at_ms, e in found
        if isinstance(e, GenerationDone)
        and e.request_id in request_ids
        and e.status is RequestStatus.FINISHED_ABORTED
    }


async def measure(pipe: Pipeline, count: int = 64, concurrency: int = 2) -> CancelLatencyStats:
    """`count` hang-ups, half on each gateway, `concurrency` at a time on each."""
    model = TINY_MODEL_DIR.name
    targets = [
        Target(name, int(pipe.stages[name].env["CHATPIPE_PORT"]), API_KEY, model)
        for name in ("g1", "g2")
    ]
    halves = await asyncio.gather(
        *(disconnects(t, count // 2, concurrency, fixed_prompts(), 400) for t in targets)
    )
    await asyncio.sleep(1.0)  # cancels travel, engines stop, usage is published
    records = [r for half in halves for r in half if r.request_id and r.disconnected]
    ids = {r.request_id for r in records if r.request_id}
    aborted: dict[str, float] = {}
    for stage in pipe.stages.values():
        if stage.stage == "worker":
            aborted |= abort_times(stage.log.read_text(errors="replace").splitlines())
    found = await token_events(pipe.kafka.bootstrap_servers, ids)
    chunks = chunks_of(found, ids)
    ends = aborted_ends(found, ids)
    usage = await usage_events(pipe.kafka.bootstrap_servers, ids)
    timings = []
    for record in records:
        rid = record.request_id
        if rid is None or rid not in aborted or rid not in usage:
            continue
        logged = chunks.get(rid, [])
        published = [(c.published_ms / 1000, c.completion_tokens) for c in logged]
        shown = sum(c.tokens for c in logged[: len(record.times)])
        generated = usage[rid].completion_tokens
        timings.append(timing(record, aborted[rid], ends.get(rid), published, shown, generated))
    return CancelLatencyStats(hang_ups=len(records), timings=timings)
