"""The recorder's pure core: `chat.answers` events in, finished answers to store out.

The gateway that relays an answer's end stores it itself before the client sees
the end (read your writes); the recorder stores every answer whose gateway did not
(it died, the client left): it reads `chat.answers`, where the safety stage puts
every event a stored answer's client may see, and builds each answer by the same
rule (`conversations.answers.AnswerBuilder`). The store finishes an answer only
while it is in progress, so the two writers never disagree and a replay changes
nothing.

The Kafka adapter feeds each decoded event with its partition, offset and clock,
stores each `NewMessage` returned, and commits per partition only below
`commit_floor(partition)`: an answer still open is read again whole, from its
`AnswerStarted` marker, after a restart — its retraction included, so retracted
text never reaches the store. An answer with no event for `idle_timeout_s` is
closed by `expire` as FINISHED_ERROR with the text it had.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from conversations.answers import AnswerBuilder
from conversations.store import NewMessage
from schemas.events import AnswerStarted, Event


@dataclass(slots=True)
class _Open:
    partition: int
    first_offset: int
    last_seen: float
    answer: AnswerBuilder


class Recorder:
    """`max_finished` bounds how many finished request ids are remembered to drop late
    events (oldest forgotten first)."""

    def __init__(self, *, max_finished: int = 10_000, idle_timeout_s: float = 120.0) -> None:
        self._max_finished = max_finished
        self.idle_timeout_s = idle_timeout_s
        self._open: dict[str, _Open] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()

    def on_event(
        self,
        event: Event,
        *,
        partition: int = 0,
        offset: int = 0,
        now: float = 0.0,
    ) -> NewMessage | None:
        """Take one event; returns the message to store when its answer ends.

        Events of an answer whose `AnswerStarted` marker was not read are ignored (an
        answer is read whole from its marker, which the commit floor keeps)."""
        request_id = getattr(event, "request_id", None)
        if request_id is None or request_id in self._finished:
            return None
        current = self._open.get(request_id)
        if current is None:
            if not isinstance(event, AnswerStarted):
                return None
            current = _Open(partition, offset, now, AnswerBuilder(event))
            self._open[request_id] = current
            return None
        current.last_seen = now
        if not current.answer.add(event) or not current.answer.ended:
            return None
        return self._finish(request_id)

    def expire(self, now: float) -> list[NewMessage]:
        """Close answers idle for `idle_timeout_s`: FINISHED_ERROR with the text they had."""
        idle = [rid for rid, o in self._open.items() if now - o.last_seen >= self.idle_timeout_s]
        return [self._finish(request_id) for request_id in idle]

    def waited(self, seconds: float) -> None:
        """The stage could not read for `seconds` (the store was down): no answer went
        idle meanwhile, so none is given up for it."""
        for answer in self._open.values():
            answer.last_seen += seconds

    def commit_floor(self, partition: int) -> int | None:
        """The lowest offset of an open answer on `partition`, None if none.

        Commit `min(floor, next offset to read)`: everything of an open answer is then
        read again after a restart."""
        return min(
            (o.first_offset for o in self._open.values() if o.partition == partition), default=None
        )

    def open_requests(self) -> list[str]:
        """Ids of answers started and not yet finished, oldest first."""
        return list(self._open)

    def forget_partition(self, partition: int) -> None:
        """Drop open answers of a revoked partition; its next owner reads them again."""
        for request_id in [k for k, o in self._open.items() if o.partition == partition]:
            del self._open[request_id]

    def _finish(self, request_id: str) -> NewMessage:
        message = self._open.pop(request_id).answer.message()
        self._finished[request_id] = None
        while len(self._finished) > self._max_finished:
            self._finished.popitem(last=False)
        return message
