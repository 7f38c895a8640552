"""What one client stream shows of an answer: the gateway's stream core, pure.

Events come from this gateway's delivery topic (a stream it started) or from
`chat.answers` (a stream it resumes, read from the answer's marker). The one answer
rule decides which belong to the answer; events the client already has (id up to
its `Last-Event-ID`) still build the answer's text but are not shown again. A stored
answer's `AnswerBuilder` gives the message the gateway stores before it shows the end.
"""

from __future__ import annotations

from conversations.answers import AnswerBuilder
from conversations.store import NewMessage
from schemas.answer import AnswerLog
from schemas.events import AnswerStarted, DeliverEvent, DeliveryError, Event, Queued, Routed

STALLED_MESSAGE = "the answer stopped arriving; it was cancelled"
LOST_MESSAGE = "the pipeline's broker restarted and lost this answer; send the message again"
LOST_RETRY_AFTER_S = 5.0


class StreamRelay:
    def __init__(
        self,
        started: AnswerStarted | None = None,
        after_id: int | None = None,
    ) -> None:
        self.builder = AnswerBuilder(started) if started is not None else None
        self._log = self.builder.log if self.builder is not None else AnswerLog()
        self.after_id = after_id

    @property
    def ended(self) -> bool:
        return self._log.ended

    def add(self, event: Event) -> DeliverEvent | None:
        """Take one event; returns it if the client should see it now."""
        if isinstance(event, AnswerStarted):
            if self.builder is None:
                self.builder = AnswerBuilder(event)
                self._log = self.builder.log
            return None
        taken = self.builder.add(event) if self.builder is not None else self._log.take(event)
        if not taken:
            return None
        if isinstance(event, Queued | Routed):
            return event if self._log.next_seq == 0 else None
        if self.after_id is not None and event.seq <= self.after_id:  # type: ignore[attr-defined]
            return None
        return event  # type: ignore[return-value]

    def stall(self, request_id: str) -> DeliveryError:
        """Nothing came for too long: the end the client gets (it takes the next id)."""
        return self._end_here(request_id, "stalled", STALLED_MESSAGE)

    def lost(self, request_id: str) -> DeliveryError:
        """The bus lost the answer: the end the client gets; it may send it again."""
        return self._end_here(request_id, "answer_lost", LOST_MESSAGE, LOST_RETRY_AFTER_S)

    def _end_here(self, request_id: str, code: str, message: str,
                  retry_after: float | None = None) -> DeliveryError:  # fmt: skip
        end = DeliveryError(
            request_id=request_id,
            attempt=max(self._log.attempt, 0),
            seq=self._log.next_seq,
            code=code,
            message=message,
            retry_after=retry_after,
        )
        # the newest attempt's: an end from an older one would be dropped by the answer rule
        self.add(end)
        return end

    def answer(self) -> NewMessage | None:
        """The stored answer as it stands (final once ended), None if none is stored."""
        return self.builder.message() if self.builder is not None else None
