"""The recorder's pure core: `chat.tokens` events in, assistant messages out.

The Kafka adapter feeds every decoded token event to `Recorder.on_event`
with its partition and offset, persists each `NewMessage` it returns, and
commits per partition only below `commit_floor(partition)` so an unfinished
generation is read again after a restart.

How one message's text is put together (DESIGN §9):

* `seq` is a position in the request's output, shared by all attempts.
  Chunks take positions 0, 1, 2, … and the terminal event (done or error)
  takes the position after the last chunk, so the text is positions
  `0 .. terminal.seq - 1`.
* A redispatched attempt continues from the output already emitted, so its
  first event carries the first position it did not inherit. An attempt
  *owns* every position from its first seq upwards, until a newer attempt
  starts: each position takes its chunk from its owner only. An older
  attempt still running (a worker thought dead) can therefore never
  duplicate or interleave text, whatever order the events arrive in; an
  attempt that restarts from seq 0 simply owns everything.
* A terminal event counts only from the newest attempt seen, and only once
  every position below it has its owner's chunk; until then the request stays
  open and later (redelivered, out of order) chunks fill the gaps. The first
  terminal that completes wins; anything later for that request is dropped.
* Events are deduplicated by `(request_id, attempt, seq)`.
* The message keeps the finishing attempt's usage: prompt tokens and the
  cached part of them (the growing-history cost of the turn; 0 when the
  generation ended in an error).

The one order this cannot see through: if a newer attempt's *first* chunk
arrives after the rest of that attempt, an older attempt's chunk at that
position is used. Producers must keep per-partition order (one in-flight
batch, or idempotence) for that never to happen.

A request with no complete terminal for `idle_timeout_s` (its worker died and
nothing redispatched it, or a stray late duplicate reopened it) is closed by
`expire` as FINISHED_ERROR with its gap-free prefix; the store's idempotence on
message_id makes the stray case harmless.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from conversations.store import NewMessage
from schemas.events import GenerationDone, GenerationError, Role, TokenChunk
from schemas.lifecycle import RequestStatus

TokenStreamEvent = TokenChunk | GenerationDone | GenerationError


@dataclass(slots=True)
class _OpenRequest:
    partition: int
    first_offset: int
    last_seen: float
    latest: TokenStreamEvent
    chunks: dict[int, dict[int, TokenChunk]] = field(default_factory=dict)
    first_seq: dict[int, int] = field(default_factory=dict)
    terminal: GenerationDone | GenerationError | None = None

    @property
    def newest_attempt(self) -> int:
        return max(self.first_seq, default=-1)

    def add(self, event: TokenStreamEvent) -> bool:
        """Take the event in; False for a duplicate or a superseded terminal."""
        attempt, seq = event.attempt, event.seq
        if isinstance(event, TokenChunk):
            attempt_chunks = self.chunks.setdefault(attempt, {})
            if seq in attempt_chunks:
                return False
            attempt_chunks[seq] = event
        elif attempt < self.newest_attempt:
            return False
        elif self.terminal is not None and self.terminal.attempt == attempt:
            return False  # the same attempt ends once; keep the first end
        else:
            self.terminal = event
        self.first_seq[attempt] = min(seq, self.first_seq.get(attempt, seq))
        if self.terminal is not None and self.terminal.attempt < self.newest_attempt:
            self.terminal = None  # a newer attempt took over the generation
        self.latest = event
        return True

    def owner(self, position: int) -> int | None:
        """The newest attempt that started at or before `position`."""
        starters = [a for a, first in self.first_seq.items() if first <= position]
        return max(starters) if starters else None

    def chunk_at(self, position: int) -> TokenChunk | None:
        attempt = self.owner(position)
        return None if attempt is None else self.chunks.get(attempt, {}).get(position)

    def prefix(self, end: int | None) -> list[TokenChunk]:
        """The owners' chunks from position 0 up to `end` (if given) or the first gap."""
        found: list[TokenChunk] = []
        while end is None or len(found) < end:
            chunk = self.chunk_at(len(found))
            if chunk is None:
                break
            found.append(chunk)
        return found

    def complete(self) -> list[TokenChunk] | None:
        """The message's chunks if the terminal and every position below it are in."""
        if self.terminal is None:
            return None
        end = self.terminal.seq
        if end > sum(map(len, self.chunks.values())):
            return None  # cheap early out; also bounds the scan below
        chunks = self.prefix(end)
        return chunks if len(chunks) == end else None


class Recorder:
    """Turns a generation's token events into the assistant message to store.

    `max_finished` bounds how many finished request ids are remembered to drop
    late duplicates; older ones are forgotten (oldest first).
    """

    def __init__(self, *, max_finished: int = 10_000, idle_timeout_s: float = 300.0) -> None:
        self._max_finished = max_finished
        self._idle_timeout_s = idle_timeout_s
        self._open: dict[str, _OpenRequest] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()

    def on_event(
        self, event: TokenStreamEvent, *, partition: int = 0, offset: int = 0, now: float = 0.0
    ) -> NewMessage | None:
        """Take one event; returns the message to persist when its generation ends.

        `partition` and `offset` locate the event on `chat.tokens`; `now` is the
        adapter's clock (monotonic seconds), the same one `expire` is given.
        """
        if not event.store or event.request_id in self._finished:
            return None
        request = self._open.get(event.request_id)
        if request is None:
            request = _OpenRequest(partition, offset, now, event)
            self._open[event.request_id] = request
        request.first_offset = min(request.first_offset, offset)
        request.last_seen = now
        if not request.add(event):
            return None
        chunks = request.complete()
        if chunks is None:
            return None
        assert request.terminal is not None
        return self._finish(request, chunks, request.terminal)

    def expire(self, now: float) -> list[NewMessage]:
        """Close requests idle for `idle_timeout_s`: FINISHED_ERROR with their gap-free text."""
        idle = [r for r in self._open.values() if now - r.last_seen >= self._idle_timeout_s]
        messages = []
        for request in idle:
            end = request.terminal.seq if request.terminal else None
            messages.append(self._finish(request, request.prefix(end), None))
        return messages

    def commit_floor(self, partition: int) -> int | None:
        """The lowest offset of an unfinished request on `partition`, None if none.

        Commit `min(floor, next offset to read)`: everything of an open request
        is then read again after a restart.
        """
        offsets = [r.first_offset for r in self._open.values() if r.partition == partition]
        return min(offsets, default=None)

    def open_requests(self) -> list[str]:
        """Ids of generations started and not yet finished, oldest first."""
        return list(self._open)

    def forget_partition(self, partition: int) -> None:
        """Drop open requests of a revoked partition; its next owner reads them again."""
        for request_id in [k for k, r in self._open.items() if r.partition == partition]:
            del self._open[request_id]

    def _finish(
        self,
        request: _OpenRequest,
        chunks: list[TokenChunk],
        terminal: GenerationDone | GenerationError | None,
    ) -> NewMessage:
        last = terminal or request.latest
        del self._open[last.request_id]
        self._finished[last.request_id] = None
        while len(self._finished) > self._max_finished:
            self._finished.popitem(last=False)
        tokens = chunks[-1].completion_tokens if chunks else 0
        prompt_tokens = cached_tokens = 0
        if isinstance(terminal, GenerationDone):
            # a resumed attempt's usage may count only its own tokens;
            # its chunks count the whole message's
            tokens = max(tokens, terminal.usage.completion_tokens)
            prompt_tokens = terminal.usage.prompt_tokens
            cached_tokens = terminal.usage.cached_tokens
            status = terminal.status
        else:
            status = RequestStatus.FINISHED_ERROR
        return NewMessage(
            message_id=last.message_id,
            conversation_id=last.conversation_id,
            role=Role.ASSISTANT,
            content="".join(chunk.text for chunk in chunks),
            parent_id=last.parent_id,
            model=last.model,
            tokens=tokens,
            status=status,
            request_id=last.request_id,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached_tokens,
        )
