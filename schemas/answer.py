"""One rule rebuilds an answer from its stream events, wherever it is read.

The worker continuing an earlier attempt, the safety stage, the gateway relaying or
replaying a stream and the recorder all decide with `AnswerLog` which events make
up the answer, so they all arrive at the same text.

Every event of an answer carries `(attempt, seq)`. `seq` is a position in the answer,
shared by all attempts: a continuation starts at the position after the output the
earlier attempts left. On `chat.tokens` positions are consecutive (one per chunk; the
end takes the next one); on `chat.answers` and the delivery topics they are the safety
stage's ids, which increase with gaps. Taken in the order of their partition:

* an `AttemptStarted` marker makes its attempt the newest; every event of an older
  attempt is dropped from then on, so a worker thought lost that still runs cannot
  add text after its successor has read what came before;
* an event of an attempt older than the newest seen is dropped;
* a positional event is taken only past the last position taken (`seq >= next_seq`):
  an earlier position is a duplicate (a redelivery, a replay after a restart);
* the first terminal event (done or error) taken ends the answer; nothing after it is.

Events without a position (markers, queue updates, routing) are taken while the answer
is open; they never move `next_seq`.
"""

from __future__ import annotations

from collections.abc import AsyncIterable

from schemas.events import (
    AnswerStarted,
    AttemptStarted,
    DeliveredToolCall,
    DeliveredToolResult,
    DeliveryDone,
    DeliveryError,
    Delta,
    Event,
    GenerationDone,
    GenerationError,
    Queued,
    Retract,
    Routed,
    TokenChunk,
    ToolCallsMade,
    ToolResult,
)

Terminal = GenerationDone | GenerationError | DeliveryDone | DeliveryError

UNKNOWN_END_SEQ = 1 << 30
"""Position of an end event sent without knowing where the answer stands (a worker
that could not read back earlier output, a scheduler ending a continuation): past any
position, so it always ends the answer."""
_POSITIONAL = (
    TokenChunk,
    GenerationDone,
    GenerationError,
    Delta,
    Retract,
    DeliveryDone,
    DeliveryError,
    ToolCallsMade,
    ToolResult,
    DeliveredToolCall,
    DeliveredToolResult,
)
_UNPOSITIONED = (AttemptStarted, AnswerStarted, Queued, Routed)


class AnswerLog:
    """The rule above for one request's events, fed in partition order."""

    __slots__ = ("attempt", "end", "next_seq")

    def __init__(self) -> None:
        self.attempt = -1
        """The newest attempt seen."""
        self.next_seq = 0
        """The first position not taken yet."""
        self.end: Terminal | None = None
        """The terminal event taken, once the answer has ended."""

    @property
    def ended(self) -> bool:
        return self.end is not None

    def take(self, event: Event) -> bool:
        """True if `event` belongs to the answer (then it is taken), False to drop it."""
        if self.end is not None:
            return False
        attempt = getattr(event, "attempt", 0)
        if attempt < self.attempt:
            return False
        if isinstance(event, _UNPOSITIONED):
            if isinstance(event, AttemptStarted):
                self.attempt = attempt
            return True
        if not isinstance(event, _POSITIONAL):
            raise TypeError(f"not an answer event: {event!r}")
        if event.seq < self.next_seq:
            return False
        self.attempt = attempt
        self.next_seq = event.seq + 1
        if isinstance(event, Terminal):
            self.end = event
        return True


class AnswerText:
    """The answer's text as its delivery events build it, under the one answer rule
    (`AnswerLog`): deltas add to it, and a retraction replaces all of it, text already
    taken included, with the policy's replacement. Wherever an answer is collected
    (a stored answer, a whole completion, a background or judge generation), this
    is the text."""

    __slots__ = ("_parts", "log", "retracted")

    def __init__(self) -> None:
        self.log = AnswerLog()
        self._parts: list[str] = []
        self.retracted = False

    @property
    def end(self) -> Terminal | None:
        """The terminal event taken, once the answer has ended."""
        return self.log.end

    @property
    def answered(self) -> bool:
        """The model ended the answer itself (or at its length limit) and none of it was
        retracted: the text is the model's, whole. Not after an error, an abort, an
        expiry, a retraction, nor while it has not ended."""
        end = self.log.end
        return (
            isinstance(end, DeliveryDone | GenerationDone)
            and end.status.is_answered
            and not self.retracted
        )

    def add(self, event: Event) -> bool:
        """Take one event; False if the rule drops it."""
        if not self.log.take(event):
            return False
        match event:
            case Delta() if not self.retracted:
                self._parts.append(event.text)
            case Retract():
                self.retracted, self._parts = True, [event.replacement]
        return True

    async def read(self, events: AsyncIterable[Event]) -> AnswerText:
        """Take `events` until the answer ends (or they stop coming); returns self."""
        async for event in events:
            self.add(event)
            if self.log.ended:
                break
        return self

    def __str__(self) -> str:
        return "".join(self._parts)
