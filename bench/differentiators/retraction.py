"""Retraction latency: from the worker publishing the token that trips the output
check to the client's `retract` event, and what the client was shown before it.

Each answer is a scripted sim reply (`[[sim:reply=...]]`) with an e-mail address, PII
the output stage retracts by default, after a different number of plain words. The
offending chunk is the one the retraction names (the `retract` event's id is that
chunk's seq); its emission is its record timestamp on `chat.tokens`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from bench.differentiators.turns import Turn, native_turn
from bench.metrics import percentile
from bench.process_pipeline import Pipeline
from bench.topic_log import token_events
from schemas.events import TokenChunk

TARGET_P99_MS = 250.0
OFFENDING = "bob@example.com"
AFTER_WORDS = 150
"""Words the reply goes on with after the address (cut short by the retraction)."""


def tripping_reply(words_before: int) -> str:
    """A sim reply whose `words_before + 4`th word is an e-mail address."""
    before = " ".join(f"word{i}" for i in range(words_before))
    after = " ".join(f"more{i}" for i in range(AFTER_WORDS))
    return f"[[sim:reply={before} You can write to {OFFENDING} for the details. {after}]]"


@dataclass(frozen=True, slots=True)
class Retraction:
    emitted_ms: float
    """The offending chunk's record timestamp (epoch ms)."""
    retracted_ms: float
    """When the client's `retract` event arrived (epoch ms)."""
    tokens_shown: int
    """Tokens (sim words) of the deltas the client got before the retraction."""

    @property
    def latency_ms(self) -> float:
        return self.retracted_ms - self.emitted_ms


def retraction(turn: Turn, emitted_ms: dict[int, float]) -> Retraction | None:
    """The turn's retraction against the emission times of its chunks by seq; None
    when it was not retracted or its offending chunk was not found."""
    index = next((i for i, m in enumerate(turn.events) if m.event == "retract"), None)
    if index is None:
        return None
    retract = turn.events[index]
    if retract.id is None or int(retract.id) not in emitted_ms:
        return None
    shown = sum(len(m.json()["delta"].split()) for m in turn.events[:index] if m.event == "delta")
    return Retraction(emitted_ms[int(retract.id)], turn.wall(retract.at) * 1000, shown)


@dataclass(frozen=True)
class RetractionStats:
    offered: int
    retractions: list[Retraction] = field(default_factory=list)

    def latency_ms(self, q: float) -> float:
        return percentile([r.latency_ms for r in self.retractions], q)

    def shown(self, q: float) -> float:
        return percentile([r.tokens_shown for r in self.retractions], q)

    @property
    def met(self) -> bool:
        return len(self.retractions) == self.offered and self.latency_ms(99) <= TARGET_P99_MS


def chunk_times(found: list[tuple[int, Any]], request_ids: set[str]) -> dict[str, dict[int, float]]:
    """Per request, the record timestamp (ms) of each of its chunks among `found` (the
    events of `chat.tokens`) by seq (the first record of a seq: a later copy is a
    redelivery)."""
    times: dict[str, dict[int, float]] = {rid: {} for rid in request_ids}
    for at_ms, event in found:
        if isinstance(event, TokenChunk) and event.request_id in times:
            times[event.request_id].setdefault(event.seq, float(at_ms))
    return times


async def measure(pipe: Pipeline, count: int = 48, concurrency: int = 4) -> RetractionStats:
    """`count` tripping answers, `concurrency` at a time over both gateways, the
    address after 0 to 23 words."""
    pending = iter(range(count))
    turns: list[Turn] = []
    async with pipe.http("g1") as g1, pipe.http("g2") as g2:

        async def client(gateway: int) -> None:
            for i in pending:
                content = tripping_reply(i % 24)
                turns.append(
                    await native_turn(
                        (g1, g2)[gateway % 2], {"content": content, "max_tokens": 400}
                    )
                )

        await asyncio.gather(*(client(g) for g in range(concurrency)))
    ids = {rid for t in turns if t.first("retract") and (rid := t.request_id)}
    emitted = chunk_times(await token_events(pipe.kafka.bootstrap_servers, ids), ids)
    found = []
    for turn in turns:
        rid = turn.request_id
        if rid is not None and rid in emitted and (made := retraction(turn, emitted[rid])):
            found.append(made)
    return RetractionStats(offered=count, retractions=found)
