"""What the pipeline itself recorded: token chunks on `chat.tokens`, usage on `chat.usage`,
and any events a test or benchmark looks for (`find_events`).

Both topics are read from offset 0 (the embedded broker cannot seek to the
end) until every request asked about has its terminal event.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from bus.clients import KafkaConfig
from bus.replay import replay
from schemas import topics
from schemas.codec import CONTROL_EVENT, TOKEN_EVENT
from schemas.events import Cancel, GenerationDone, GenerationError, TokenChunk, UsageEvent


@dataclass(frozen=True, slots=True)
class LoggedChunk:
    """A `TokenChunk` as the worker published it."""

    published_ms: int
    """The Kafka record timestamp (the producer's clock at send)."""
    tokens: int
    completion_tokens: int
    has_text: bool


async def read_events(
    bootstrap: str,
    topic: str,
    kind: Any,
    wanted: set[str],
    ends: Callable[[Any], bool],
    timeout_s: float = 30,
) -> list[tuple[int, Any]]:
    """(record timestamp ms, event) of every decodable event of `topic`, read until every
    request in `wanted` has had an event that `ends` it, or the timeout."""
    found: list[tuple[int, Any]] = []
    waiting = set(wanted)
    if not waiting:
        return found
    async with aclosing(replay(bootstrap, topic, kind, timeout_s)) as replayed:
        async for at_ms, event in replayed:
            found.append((at_ms, event))
            if ends(event):
                waiting.discard(event.request_id)
                if not waiting:
                    break
    return found


async def find_events(
    kafka: KafkaConfig,
    topic: str,
    kind: Any,
    match: Callable[[Any], bool],
    count: int = 1,
    timeout_s: float = 30.0,
) -> list[Any]:
    """Read `topic` from the start until `count` decodable events satisfy `match`."""
    found: list[Any] = []
    async with aclosing(replay(kafka.bootstrap_servers, topic, kind, timeout_s)) as events:
        async for _, event in events:
            if match(event):
                found.append(event)
                if len(found) == count:
                    break
    return found


async def token_events(
    bootstrap: str, request_ids: Iterable[str], timeout_s: float = 30
) -> list[tuple[int, Any]]:
    """(record timestamp ms, event) of each event on `chat.tokens`, read until every
    request in `request_ids` has its end (done or error)."""
    return await read_events(
        bootstrap,
        topics.TOKENS,
        TOKEN_EVENT,
        set(request_ids),
        lambda e: isinstance(e, GenerationDone | GenerationError),
        timeout_s,
    )


def chunks_of(
    found: list[tuple[int, Any]], request_ids: Iterable[str]
) -> dict[str, list[LoggedChunk]]:
    """Per request, its token chunks among `found` (`token_events`), in stream order,
    duplicates dropped."""
    wanted = set(request_ids)
    chunks: dict[str, dict[tuple[int, int], LoggedChunk]] = {rid: {} for rid in wanted}
    for at_ms, event in found:
        if isinstance(event, TokenChunk) and event.request_id in wanted:
            chunks[event.request_id].setdefault(
                (event.attempt, event.seq),
                LoggedChunk(at_ms, event.token_count, event.completion_tokens, bool(event.text)),
            )
    return {rid: [by_seq[key] for key in sorted(by_seq)] for rid, by_seq in chunks.items()}


async def token_chunks(
    bootstrap: str, request_ids: Iterable[str], timeout_s: float = 30
) -> dict[str, list[LoggedChunk]]:
    """Per request, its token chunks in stream order (duplicates dropped)."""
    wanted = set(request_ids)
    return chunks_of(await token_events(bootstrap, wanted, timeout_s), wanted)


def content_chunk_tokens(chunks: list[LoggedChunk]) -> list[int]:
    """Token counts of the chunks a client sees, in order.

    A chunk whose text is empty (a token that decodes to nothing yet) reaches
    no client as a content chunk; its tokens count with the next chunk that
    does, which is when the client sees them.
    """
    counts: list[int] = []
    carried = 0
    for chunk in chunks:
        carried += chunk.tokens
        if chunk.has_text:
            counts.append(carried)
            carried = 0
    return counts


async def cancels(
    bootstrap: str, request_ids: Iterable[str], timeout_s: float = 5
) -> dict[str, float]:
    """When the gateway published a Cancel on `chat.control`, per request (epoch seconds)."""
    wanted = set(request_ids)
    found = await read_events(
        bootstrap, topics.CONTROL, CONTROL_EVENT, wanted, lambda e: isinstance(e, Cancel), timeout_s
    )
    return {
        e.request_id: at_ms / 1000
        for at_ms, e in found
        if isinstance(e, Cancel) and e.request_id in wanted
    }


async def usage_events(
    bootstrap: str, request_ids: Iterable[str], timeout_s: float = 30
) -> dict[str, UsageEvent]:
    wanted = set(request_ids)
    found = await read_events(
        bootstrap, topics.USAGE, UsageEvent, wanted, lambda e: True, timeout_s
    )
    return {e.request_id: e for _, e in found if e.request_id in wanted}
