"""The safety stage's decisions: pure, synchronous, no Kafka.

`chat.tokens` events go in, in partition order, with their partition, offset and the
adapter's clock. Per generation the core keeps the one answer rule's log
(`schemas.answer.AnswerLog`: older attempts fenced, duplicates dropped) and one
`OutputGate` for every attempt, so a continuation's text joins the held-back window
where the earlier attempt left it. A chunk returns the text its classifiers must
see now (`Check`); once the adapter has the verdict, `checked` says what to send:

* passed — a `Delta` of the text the window releases (none while it holds it back);
* tripped — `Retract` of the message, `Cancel` of the generation and a
  `ModerationEvent`; the rest of the stream is dropped and it ends FINISHED_FILTERED.

Delivery ids (`seq`) are the stream's positions: a delta takes its chunk's, the text
left in the window at the end takes the end's, and the end event the one after, so
ids increase, never repeat, and are the same after a restart replays the stream.

Commit floor: per partition, the first offset of every generation still open; a
generation with no event for `idle_timeout_s` is given up (`expire`) so the floor
moves on. A record the adapter could not process ends its stream (`fail`).

Time is only what the adapter passes in (`now`, monotonic seconds); configuration is
a `SafetyConfig`. `records` says which topic each output goes to: the adapter
(`safety.stage`) sends them in order and does nothing else.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from moderation.classifiers import Verdict
from safety.output_gate import OutputGate
from schemas import topics
from schemas.answer import AnswerLog
from schemas.events import (
    Cancel,
    DeliveredToolCall,
    DeliveredToolResult,
    DeliveryDone,
    DeliveryError,
    Delta,
    Event,
    GenerationDone,
    GenerationError,
    Logprobs,
    ModerationEvent,
    Retract,
    StreamEvent,
    TokenChunk,
    ToolCallsMade,
    ToolDelivery,
    ToolResult,
    Usage,
)
from schemas.lifecycle import RequestStatus

RECENTLY_FINISHED = 10_000
SAFETY_ERROR = "safety_error"
SAFETY_ERROR_MESSAGE = "the answer could not be checked"
StreamEnd = GenerationDone | GenerationError


@dataclass(frozen=True, slots=True)
class SafetyConfig:
    """The safety stage's own settings (built in `chatpipe/wiring.py`)."""

    window_chars: int = 0
    """Output held back until checked and this old (`OutputGate`)."""
    overlap_chars: int = 64
    """Checked text looked at again with each chunk (a phrase split in two)."""
    sentences: bool = False
    """Release whole sentences instead of a character window."""
    idle_timeout_s: float = 120.0
    """A generation with no event for this long is given up (`expire`)."""

    def gate(self) -> OutputGate:
        return OutputGate(self.window_chars, self.overlap_chars, self.sentences)


def replacement(category: str) -> str:
    """What a retracted answer shows, and is stored as, instead of its text."""
    return f"[This answer was removed: {category}]"


@dataclass(frozen=True, slots=True)
class Deliver:
    """A delivery event for the gateway holding the stream (`reply_to`) and, for a
    stored answer, for `chat.answers`."""

    event: Delta | Retract | DeliveryDone | DeliveryError | ToolDelivery
    reply_to: str
    conversation_id: str
    store: bool


Output = Deliver | Cancel | ModerationEvent


@dataclass(frozen=True, slots=True)
class Check:
    """Text the chunk's classifiers must look at before `checked` is called."""

    chunk: TokenChunk
    text: str


@dataclass(slots=True)
class _Generation:
    partition: int
    first_offset: int
    last_seen: float
    gate: OutputGate
    log: AnswerLog = field(default_factory=AnswerLog)
    filtered: bool = False
    fed: bool = False
    """A chunk of it came: its first event for the client is out (or held back)."""
    logprobs: list[tuple[int, Logprobs]] = field(default_factory=list)
    """Held chunks' log probabilities, each with where its chunk's text ends in the gate."""

    def feed(self, chunk: TokenChunk) -> None:
        self.fed = True
        self.gate.feed(chunk.text)
        if chunk.logprobs:
            self.logprobs.append((len(self.gate.text), chunk.logprobs))

    def released_logprobs(self) -> Logprobs:
        """The log probabilities of the chunks whose text is now all released."""
        released = len(self.gate.released)
        taken = [lp for end, lp in self.logprobs if end <= released]
        self.logprobs = [(end, lp) for end, lp in self.logprobs if end > released]
        return tuple(entry for logprobs in taken for entry in logprobs)


class SafetyCore:
    def __init__(self, config: SafetyConfig = SafetyConfig()) -> None:
        self.config = config
        self.idle_timeout_s = config.idle_timeout_s
        self._open: dict[str, _Generation] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()

    def on_event(
        self,
        event: Event,
        partition: int,
        offset: int,
        now: float,
    ) -> Check | list[Output]:
        """Take one `chat.tokens` event; a chunk to classify comes back as a `Check`."""
        request_id = getattr(event, "request_id", None)
        if request_id is None or request_id in self._finished:
            return []
        generation = self._open.get(request_id)
        if generation is None:
            generation = _Generation(partition, offset, now, self.config.gate())
            self._open[request_id] = generation
        generation.last_seen = now
        if not generation.log.take(event):
            return []
        if isinstance(event, TokenChunk):
            if generation.filtered:
                return []
            generation.feed(event)
            return Check(event, generation.gate.to_check())
        if isinstance(event, GenerationDone | GenerationError):
            return self._end(event, generation)
        if isinstance(event, ToolCallsMade | ToolResult) and not generation.filtered:
            return _tool_step(event, generation)
        return []

    def checked(self, check: Check, verdict: Verdict | None) -> list[Output]:
        """What to send once `check`'s classifiers have answered."""
        chunk = check.chunk
        generation = self._open.get(chunk.request_id)
        if generation is None or generation.filtered:
            return []
        if verdict is not None:
            return self._retract(chunk, generation, verdict)
        released = generation.gate.passed()
        logprobs = generation.released_logprobs()
        if not released and not logprobs:
            return []
        return [
            _deliver(
                chunk,
                Delta(
                    request_id=chunk.request_id,
                    attempt=chunk.attempt,
                    seq=chunk.seq,
                    text=released,
                    logprobs=logprobs,
                ),
            )
        ]

    def fail(
        self, event: StreamEvent, code: str = SAFETY_ERROR, message: str = SAFETY_ERROR_MESSAGE
    ) -> list[Output]:
        """Processing `event` failed: end its stream with `code` and a fixed `message`
        (the cause stays in the adapter's log, never reaches the client), and stop its
        generation."""
        if event.request_id in self._finished:
            return []
        self._forget(event.request_id)
        end = DeliveryError(
            request_id=event.request_id,
            attempt=event.attempt,
            seq=event.seq + 1,
            code=code,
            message=message,
        )
        return [Cancel(request_id=event.request_id, reason=code), _deliver(event, end)]

    def expire(self, now: float) -> list[str]:
        """Give up generations idle for `idle_timeout_s`; returns their request ids."""
        idle = [rid for rid, g in self._open.items() if now - g.last_seen >= self.idle_timeout_s]
        for request_id in idle:
            self._forget(request_id)
        return idle

    def commit_floor(self, partition: int) -> int | None:
        """The first offset of a generation still open on `partition`, None if none."""
        return min(
            (g.first_offset for g in self._open.values() if g.partition == partition), default=None
        )

    def forget_partition(self, partition: int) -> None:
        """A revoked partition: its generations are read again by its next owner."""
        for request_id in [rid for rid, g in self._open.items() if g.partition == partition]:
            del self._open[request_id]

    @property
    def open_count(self) -> int:
        return len(self._open)

    @property
    def awaiting_first_chunk(self) -> bool:
        """An open generation has had no chunk yet (its attempt's marker came)."""
        return any(not generation.fed for generation in self._open.values())

    def _end(self, end: StreamEnd, generation: _Generation) -> list[Output]:
        self._forget(end.request_id)
        fields = {"request_id": end.request_id, "attempt": end.attempt, "seq": end.seq + 1}
        if generation.filtered:
            usage = end.usage if isinstance(end, GenerationDone) else Usage()
            return [
                _deliver(
                    end,
                    DeliveryDone(
                        **fields,
                        status=RequestStatus.FINISHED_FILTERED,
                        usage=usage,
                        model=end.model,
                    ),
                )
            ]
        outputs: list[Output] = []
        rest = generation.gate.finish()
        logprobs = generation.released_logprobs()
        if rest or logprobs:
            outputs.append(
                _deliver(
                    end,
                    Delta(
                        request_id=end.request_id,
                        attempt=end.attempt,
                        seq=end.seq,
                        text=rest,
                        logprobs=logprobs,
                    ),
                )
            )
        if isinstance(end, GenerationDone):
            final: DeliveryDone | DeliveryError = DeliveryDone(
                **fields,
                status=end.status,
                usage=end.usage,
                model=end.model,
                tool_calls=end.tool_calls,
            )
        else:
            final = DeliveryError(
                **fields, code=end.code, message=end.message, retry_after=end.retry_after
            )
        outputs.append(_deliver(end, final))
        return outputs

    def _retract(
        self, chunk: TokenChunk, generation: _Generation, verdict: Verdict
    ) -> list[Output]:
        generation.filtered = True
        shown = replacement(verdict.category)
        return [
            Cancel(request_id=chunk.request_id, reason="content_filter"),
            _deliver(
                chunk,
                Retract(
                    request_id=chunk.request_id,
                    attempt=chunk.attempt,
                    seq=chunk.seq,
                    message_id=chunk.message_id,
                    reason=verdict.category,
                    replacement=shown,
                ),
            ),
            ModerationEvent(
                request_id=chunk.request_id,
                conversation_id=chunk.conversation_id,
                message_id=chunk.message_id,
                action="retract",
                category=verdict.category,
                reason=f"{verdict.classifier}: {verdict.reason}",
                replacement=shown,
            ),
        ]

    def _forget(self, request_id: str) -> None:
        self._open.pop(request_id, None)
        self._finished[request_id] = None
        while len(self._finished) > RECENTLY_FINISHED:
            self._finished.popitem(last=False)


def _deliver(
    source: StreamEvent, event: Delta | Retract | DeliveryDone | DeliveryError | ToolDelivery
) -> Deliver:
    return Deliver(event, source.reply_to, source.conversation_id, source.store)


def _tool_step(event: ToolCallsMade | ToolResult, generation: _Generation) -> list[Output]:
    """A server-tools turn's step, shown as it is: calls, after the text the window
    still held (their positions: `ToolCallsMade`), or a result."""
    ids = {"request_id": event.request_id, "attempt": event.attempt}
    if isinstance(event, ToolResult):
        return [
            _deliver(
                event,
                DeliveredToolResult(
                    **ids,
                    seq=event.seq,
                    call_id=event.call_id,
                    name=event.name,
                    content=event.content,
                    error=event.error,
                ),
            )
        ]
    outputs: list[Output] = []
    rest = generation.gate.finish()
    if rest:
        outputs.append(_deliver(event, Delta(**ids, seq=event.seq, text=rest)))
    outputs += [
        _deliver(event, DeliveredToolCall(**ids, seq=event.seq + 1 + index, call=call))
        for index, call in enumerate(event.calls)
    ]
    return outputs


def records(outputs: list[Output]) -> list[tuple[str, Event, str | None]]:
    """(topic, event, key) of each record the outputs make, in order: a delivery goes to
    its gateway and, for a stored answer, to `chat.answers`; a cancel to
    `chat.control`; a moderation decision to `chat.moderation`."""
    made: list[tuple[str, Event, str | None]] = []
    for output in outputs:
        match output:
            case Deliver():
                made.append((output.reply_to, output.event, output.conversation_id))
                if output.store:
                    made.append((topics.ANSWERS, output.event, output.conversation_id))
            case Cancel():
                made.append((topics.CONTROL, output, output.request_id))
            case ModerationEvent():
                made.append((topics.MODERATION, output, output.conversation_id))
    return made
