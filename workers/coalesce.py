"""Coalescing engine outputs into token chunks: the first at once, then every interval."""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas.events import Logprobs, TokenLogprob

SLACK_S = 0.005
"""An output this much before the interval is over is in time: the engine's steps come
a little early or late, and waiting for the next one would add a whole step."""


@dataclass(slots=True)
class Pending:
    text: str = ""
    tokens: int = 0
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)


class Coalescer:
    """Buffers text deltas; `add` returns what to send now, or None to keep waiting.

    The first output goes out at once (time to first token); later ones are
    held until `interval_s` has passed since the last send, so one Kafka event
    carries several tokens. Sends keep to a schedule, one every `interval_s`: a send
    that had to wait for the engine's next output (a step after the interval) does not
    push the ones after it back, so chunks average one per interval.
    """

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        """May change between outputs (the worker widens it under load)."""
        self.held = False
        """Nothing goes out until `flush` (a server-tools round's text, which may be a call)."""
        self._pending = Pending()
        self._sent_at: float | None = None
        """When the last send was due (at most half an interval before it went)."""

    def add(
        self,
        text: str,
        tokens: int,
        now: float,
        token_ids: tuple[int, ...] = (),
        logprobs: Logprobs = (),
    ) -> Pending | None:
        self._pending.text += text
        self._pending.tokens += tokens
        self._pending.token_ids += token_ids
        self._pending.logprobs += logprobs
        if self.held or (
            self._sent_at is not None and now - self._sent_at < self.interval_s - SLACK_S
        ):
            return None
        return self._take(now)

    def flush(self, now: float) -> Pending | None:
        """Whatever is held (at the end of the stream); None when nothing is."""
        if not self._pending.text and not self._pending.tokens:
            return None
        return self._take(now)

    def _take(self, now: float) -> Pending | None:
        if not self._pending.text and not self._pending.tokens:
            return None
        taken, self._pending = self._pending, Pending()
        if self._sent_at is None:
            self._sent_at = now
        else:
            self._sent_at = min(
                now, max(self._sent_at + self.interval_s, now - self.interval_s / 2)
            )
        return taken


@dataclass(frozen=True, slots=True)
class ChunkPacing:
    """The coalescing interval for a worker with `streams` streams running.

    Every chunk is an event through the broker, safety and the gateway, so a
    worker keeps its chunk rate under `max_chunks_per_s`: with many streams the
    interval widens from `interval_s` up to `max_interval_s`. Tokens are not
    delayed more than that; they travel more per event. 0 switches widening off.
    """

    interval_s: float
    max_interval_s: float
    max_chunks_per_s: float

    def interval(self, streams: int) -> float:
        if self.max_chunks_per_s <= 0:
            return self.interval_s
        wanted = streams / self.max_chunks_per_s
        return min(max(self.interval_s, wanted), max(self.interval_s, self.max_interval_s))
