"""The worker's decisions, as values: which assignments it runs (`WorkerBook`), what
its heartbeats say, and each attempt's events on `chat.tokens` (`Attempt`: chunks at
consecutive positions, then its end, then its usage).

No Kafka, no tasks, no clock of its own: `workers.stage` reads records and engine
outputs, passes them in with its clocks, and sends what comes back.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from schemas.answer import UNKNOWN_END_SEQ, AnswerLog
from schemas.events import (
    Cancel,
    Event,
    GenerationDone,
    GenerationError,
    GenerationRequest,
    TokenChunk,
    ToolCallsMade,
    ToolRound,
    Usage,
    UsageEvent,
    WorkAssignment,
    WorkerHeartbeat,
    calls_span,
    stream_fields,
)
from schemas.lifecycle import RequestStatus
from schemas.tools import RoundsHeld, ToolCalls
from workers.coalesce import ChunkPacing, Coalescer, Pending
from workers.engine import Continuation, EngineOutput, EngineStats

RECENT = 10_000
"""Finished attempts and cancels remembered, to skip a duplicate assignment."""

Clock = Callable[[], float]
Place = tuple[int, int]
"""Where an assignment lies: (chat.work partition, offset)."""


DEFAULT_PACING = ChunkPacing(0.05, 0.05, 0)


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """The worker stage's settings, built in `chatpipe.wiring`."""

    worker_id: str
    pacing: ChunkPacing = DEFAULT_PACING
    heartbeat_interval_s: float = 1.0
    ready_file: Path | None = None
    """Touched at every heartbeat while serving: liveness and readiness probes read its age."""
    shard: str = ""
    """The scheduler shard of its model: it reads that shard's `chat.work.<shard>`."""


TELL_HANDED_BACK = 3
"""Heartbeats that list a request handed back by a worker that goes on (preempted):
the scheduler requeues it on the first; the others cover a heartbeat it skipped as old."""


class Take(enum.Enum):
    """What the worker does with an assignment it reads."""

    SKIP = "skip"
    """Another worker's or process's, a fenced scheduler's, or one it runs or ran."""
    RUN = "run"
    HAND_BACK = "hand_back"
    """Its own, read while stopping: given back unrun in the next heartbeat."""
    SUPERSEDE = "supersede"
    """A later attempt of a request running here: stop the running attempt without an
    end (`supersede`), then take the assignment again: the later attempt runs here,
    continuing it. The scheduler took this worker for lost (its heartbeats did not
    reach it for a while) and dispatched the request again, back to this worker."""


class WorkerBook:
    """What this worker holds: the assignments it runs and those it handed back (where
    each lies on chat.work), what it finished or was told to cancel lately, and each
    partition's newest scheduler epoch. `wall` stamps heartbeats (epoch seconds)."""

    def __init__(self, worker_id: str, incarnation: str, wall: Clock) -> None:
        self.worker_id = worker_id
        self.incarnation = incarnation
        """This process: assignments for another one under the same worker id are not ours."""
        self.partitions: tuple[int, ...] = ()
        self.running: dict[str, Place] = {}
        self.handed_back: dict[str, Place] = {}
        """Requests given back unfinished: the scheduler dispatches them again."""
        self._attempts: dict[str, int] = {}
        """The attempt of each request running or handed back here."""
        self._unreleased: set[str] = set()
        """Handed back, but what it streamed is not on the bus yet: listed as running."""
        self._told: dict[str, int] = {}
        """Heartbeats that handed a request back, while this worker goes on."""
        self.stopping = False
        self._wall = wall
        self._epochs: dict[int, int] = {}
        self._superseded: dict[str, Place] = {}
        """Running attempts a later attempt of theirs replaces here."""
        self._finished: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._cancelled: OrderedDict[str, None] = OrderedDict()
        self._rounds = RoundsHeld()

    def claimed(self, partition: int, epoch: int) -> None:
        """A scheduler's claim on `partition`: assignments of older epochs are fenced."""
        self._epochs[partition] = max(self._epochs.get(partition, 0), epoch)

    def take(self, assignment: WorkAssignment, partition: int, offset: int) -> Take:
        """Run it? Only this worker's, from an unfenced scheduler, and only once; while
        stopping, hand it back unrun."""
        if not self._ours(assignment, partition):
            return Take.SKIP
        request = assignment.request
        request_id = request.request_id
        if request_id in self.running:
            if request.attempt > self._attempts.get(request_id, request.attempt):
                return Take.SUPERSEDE
            return Take.SKIP  # a copy of the attempt running
        self._attempts[request_id] = request.attempt
        if self.stopping:
            self.handed_back[request_id] = (partition, offset)
            return Take.HAND_BACK
        self._forget_handed_back(request_id)  # a later attempt of one handed back runs here
        self.running[request_id] = (partition, offset)
        self._rounds.hold(request)
        return Take.RUN

    def _ours(self, assignment: WorkAssignment, partition: int) -> bool:
        request = assignment.request
        if assignment.epoch < self._epochs.get(partition, 0):
            return False  # dispatched by a fenced scheduler
        self._epochs[partition] = assignment.epoch
        if assignment.worker_id != self.worker_id:
            return False  # read after its partition moved: it belongs to another worker
        if assignment.incarnation and assignment.incarnation != self.incarnation:
            return False  # for this worker's previous process: the scheduler redispatches it
        return (request.request_id, request.attempt) not in self._finished

    def ended(self, request: GenerationRequest) -> None:
        """The attempt ended (or found its answer ended already): a copy is skipped."""
        self.running.pop(request.request_id, None)
        if request.request_id not in self.handed_back:
            self._attempts.pop(request.request_id, None)
        self._rounds.release(request)
        _remember(self._finished, (request.request_id, request.attempt))

    def hand_back(
        self, request_id: str, *, attempt: int | None = None, until_released: bool = False
    ) -> bool:
        """Give a running request back unfinished (draining, stopping, preempted); False
        when it is not running (or runs another `attempt`). It stays running until its
        attempt has stopped (`stopped`); `until_released`: and until `released` says what
        it streamed is on the bus, so its next attempt continues from all of it."""
        place = self.running.get(request_id)
        if place is None or (attempt is not None and self._attempts.get(request_id) != attempt):
            return False
        self.handed_back[request_id] = place
        if until_released:
            self._unreleased.add(request_id)
        return True

    def released(self, request_id: str) -> None:
        """What the handed-back request streamed is on the bus: hand it back now."""
        self._unreleased.discard(request_id)

    def _forget_handed_back(self, request_id: str) -> None:
        if self.handed_back.pop(request_id, None) is not None:
            self._unreleased.discard(request_id)
            self._told.pop(request_id, None)

    def supersede(self, request_id: str) -> None:
        """The running attempt of `request_id` stops for a later one (`Take.SUPERSEDE`):
        once stopped, its assignment is done here, and it is not handed back."""
        place = self.running.get(request_id)
        if place is not None:
            self._superseded[request_id] = place

    def stopped(self, request_id: str) -> Place | None:
        """An attempt stopped without an end: where its assignment lies when it was
        handed back or superseded (so it is done here), None when the process is going
        away."""
        self.running.pop(request_id, None)
        superseded = self._superseded.pop(request_id, None)
        return superseded if superseded is not None else self.handed_back.get(request_id)

    def cancel(self, cancel: Cancel) -> str | None:
        """A cancel read on chat.control: the id of its request running here (abort it),
        or None. A cancel names the answer: for a server-tools turn, the round running
        here is aborted. A conditional cancel (`held_by`) is the scheduler's to pass on."""
        if cancel.held_by is not None:
            return None
        _remember(self._cancelled, cancel.request_id)
        request_id = self._rounds.named(cancel.request_id)
        return request_id if request_id in self.running else None

    def cancelled(self, answer_id: str) -> bool:
        """A cancel named the answer (`GenerationRequest.answer_id`)."""
        return answer_id in self._cancelled

    def heartbeat(
        self,
        model: str,
        max_slots: int,
        stats: EngineStats,
        peak_running: int,
        consumed: dict[int, int],
    ) -> WorkerHeartbeat:
        """The capacity report: what runs, where each assignment lies, what was handed
        back; `consumed` is each partition's next offset to read."""
        unreleased = self._unreleased
        handed_back = tuple(r for r in self.handed_back if r not in unreleased)
        heartbeat = WorkerHeartbeat(
            worker_id=self.worker_id,
            incarnation=self.incarnation,
            model=model,
            partitions=self.partitions,
            max_slots=max_slots,
            active=(*self.running, *(r for r in unreleased if r not in self.running)),
            consumed=consumed,
            assignments={**self.handed_back, **self.running},
            handed_back=handed_back,
            handed_back_attempts={r: self._attempts[r] for r in handed_back if r in self._attempts},
            running=stats.running,
            waiting=stats.waiting,
            peak_running=peak_running,
            free_kv_blocks=stats.free_kv_blocks,
            stopping=self.stopping,
            sent_at=self._wall(),
        )
        if not self.stopping:
            self._told_once_more(handed_back)
        return heartbeat

    def _told_once_more(self, handed_back: tuple[str, ...]) -> None:
        """A worker that goes on lists a request it handed back in `TELL_HANDED_BACK`
        heartbeats, then forgets it (the scheduler has read the first)."""
        for request_id in handed_back:
            told = self._told[request_id] = self._told.get(request_id, 0) + 1
            if told >= TELL_HANDED_BACK:
                self._forget_handed_back(request_id)
                self._attempts.pop(request_id, None)


K = TypeVar("K", bound=Hashable)


def _remember(recent: OrderedDict[K, None], key: K) -> None:
    recent[key] = None
    while len(recent) > RECENT:
        recent.popitem(last=False)


# --- one attempt ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PriorOutput:
    """What earlier attempts of a request streamed (`workers.resume` reads it)."""

    text: str
    tokens: int
    next_seq: int
    finished: bool  # an earlier attempt already ended the stream
    token_ids: tuple[int, ...] = ()
    """The tokens themselves, when every chunk carried all of its own."""

    @property
    def streamed(self) -> bool:
        return self.next_seq > 0


NOTHING = PriorOutput("", 0, 0, False)


class ToolCallInterrupted(RuntimeError):
    """A constrained tool call an earlier attempt started cannot be continued."""


class JsonOutputInterrupted(ToolCallInterrupted):
    """An answer held to a JSON format (`response_format`) an earlier attempt started
    cannot be continued, for the same reason."""


def assemble(request_id: str, events: Iterable[Event]) -> PriorOutput:
    """The output earlier attempts left, from the stream's events in partition order."""
    log = AnswerLog()
    text: list[str] = []
    token_ids: list[int] = []
    tokens = 0
    for event in events:
        if getattr(event, "request_id", None) != request_id or not log.take(event):
            continue
        if isinstance(event, TokenChunk):
            text.append(event.text)
            token_ids += event.token_ids
            tokens = event.completion_tokens
    exact = tuple(token_ids) if len(token_ids) == tokens else ()
    return PriorOutput("".join(text), tokens, log.next_seq, log.ended, exact)


def usage_of(last: EngineOutput | None, prior_tokens: int = 0) -> Usage:
    """The answer's usage after `last`: its completion tokens count what earlier attempts
    streamed too (`prior_tokens` when this attempt produced nothing)."""
    if last is None:
        return Usage(completion_tokens=prior_tokens)
    return Usage(
        prompt_tokens=last.prompt_tokens,
        completion_tokens=last.completion_tokens,
        cached_tokens=last.cached_tokens,
    )


class Attempt:
    """One attempt of `request` on this worker, from the engine's outputs to its events.

    Events come out at consecutive positions: `sent()` takes a position once the bus has
    the event, so one the bus refuses leaves no gap before the error that ends the
    stream. Until the earlier output is read (`resume`) the position is unknown, and an
    end goes past any (`UNKNOWN_END_SEQ`). `clock` is monotonic seconds (chunk pacing,
    engine time), `wall` epoch seconds."""

    def __init__(
        self,
        request: GenerationRequest,
        worker_id: str,
        pacing: ChunkPacing,
        clock: Clock,
        wall: Clock,
    ) -> None:
        self.request = request
        self.worker_id = worker_id
        self.seq = UNKNOWN_END_SEQ
        self.status = RequestStatus.FINISHED_ABORTED
        self.prior_tokens = 0
        self._pacing = pacing
        self._clock = clock
        self._wall = wall
        self._started = clock()
        self._coalescer = Coalescer(pacing.interval_s)
        self._coalescer.held = self.holds_output
        self._latest: EngineOutput | None = None
        self._counted: EngineOutput | None = None
        """The output the usage counts: the last one, once the attempt ended whole."""

    def resume(self, prior: PriorOutput) -> Continuation | None:
        """Continue after what earlier attempts streamed: what the engine goes on from.

        Raises `ToolCallInterrupted` for an answer held to a JSON schema (a required or
        named tool choice; `JsonOutputInterrupted` for a `response_format`) that an
        earlier attempt started: vLLM holds only what it generates to the schema, never a
        prompt's tail, so the rest could not be held."""
        turn = self.request.server_tools
        self.seq = max(prior.next_seq, turn.first_seq if turn else 0)
        self.prior_tokens = prior.tokens
        if not prior.streamed:
            return None
        tool_use = self.request.tool_use
        if tool_use is not None and tool_use.constrained:
            raise ToolCallInterrupted(self.request.request_id)
        if self.request.sampling.structured:
            raise JsonOutputInterrupted(self.request.request_id)
        return Continuation(prior.text, prior.tokens, prior.token_ids)

    @property
    def holds_output(self) -> bool:
        """A server-tools round that may call tools: its text is held to its end, when
        the tool parser decides whether it is a call (as OpenAI's streamed `auto`)."""
        return self.request.server_tools is not None and self.request.tool_use is not None

    def pause(self) -> ToolCalls | None:
        """The calls a server-tools round ended in, or None (it ends as any answer).
        The held text is the calls' own: it is dropped, only `content` is shown. From
        now on the usage counts what the engine produced."""
        latest = self._latest
        if not self.holds_output or latest is None or latest.tool_calls is None:
            return None
        self._coalescer.flush(self._clock())
        self._counted = latest
        return latest.tool_calls

    def content(self, calls: ToolCalls) -> TokenChunk | None:
        """The text a paused round wrote beside its calls, as a chunk; None if none."""
        if not calls.content:
            return None
        return TokenChunk(
            **stream_fields(self.request, self.seq),
            text=calls.content,
            token_count=0,
            completion_tokens=self._completion_tokens(),
        )

    def calls_made(self, calls: ToolCalls) -> ToolCallsMade:
        """The end of a paused round (after its `content`, once that is sent)."""
        return ToolCallsMade(
            **stream_fields(self.request, self.seq),
            calls=calls.calls,
            completion_tokens=self._completion_tokens(),
        )

    def _completion_tokens(self) -> int:
        return self._latest.completion_tokens if self._latest else 0

    def tool_round(self, calls: ToolCalls, made: ToolCallsMade) -> ToolRound:
        """What `chat.tools` runs for the paused round whose calls lie at `made.seq`
        (sent). An end this attempt still sends (the round could not be handed on) goes
        past the positions the calls' deliveries take."""
        self.seq = max(self.seq, made.seq + calls_span(len(made.calls)))
        return ToolRound(
            request=self.request,
            calls=calls,
            seq=made.seq,
            completion_tokens=made.completion_tokens,
            created_at=self._wall(),
        )

    def output(self, output: EngineOutput, streams: int) -> TokenChunk | None:
        """Take one engine output (`streams` answers run on this worker now): the chunk
        to send now, or None while it is held to travel with the next ones."""
        self._latest = output
        self.status = output.status or self.status
        self._coalescer.interval_s = self._pacing.interval(streams)
        pending = self._coalescer.add(
            output.text, output.new_tokens, self._clock(), output.token_ids, output.logprobs
        )
        return None if pending is None else self._chunk(pending, output.completion_tokens)

    def tail(self) -> TokenChunk | None:
        """The engine has finished: what is still held, or None."""
        pending = self._coalescer.flush(self._clock())
        if pending is None or self._latest is None:
            return None
        return self._chunk(pending, self._latest.completion_tokens)

    def _chunk(self, pending: Pending, completion_tokens: int) -> TokenChunk:
        return TokenChunk(
            **stream_fields(self.request, self.seq),
            text=pending.text,
            token_count=pending.tokens,
            completion_tokens=completion_tokens,
            token_ids=tuple(pending.token_ids),
            logprobs=tuple(pending.logprobs),
        )

    def done(self) -> GenerationDone:
        """The end of an attempt that ran whole (or was cancelled before it started);
        from now on its usage counts what the engine produced."""
        self._counted = self._latest
        return GenerationDone(
            **stream_fields(self.request, self.seq),
            status=self.status,
            usage=usage_of(self._counted, self.prior_tokens),
            tool_calls=self._latest.tool_calls if self._latest else None,
        )

    def error(self, code: str, message: str) -> GenerationError:
        """The end of an attempt that failed. Its usage counts no output of its own
        (unless its end was built already): the client got an error, not an answer."""
        self.status = RequestStatus.FINISHED_ERROR
        return GenerationError(**stream_fields(self.request, self.seq), code=code, message=message)

    def sent(self) -> None:
        """The bus has the event at `seq`: the next one takes the next position."""
        self.seq += 1

    def usage(self) -> UsageEvent:
        """What the attempt used, for billing: tokens earlier attempts streamed are
        `prior_completion_tokens`, not this attempt's; `gpu_ms` its time on the engine."""
        request = self.request
        inherited = self.prior_tokens
        usage = usage_of(self._counted, inherited)
        return UsageEvent(
            request_id=request.request_id,
            attempt=request.attempt,
            conversation_id=request.conversation_id,
            user_id=request.user_id,
            org_id=request.org_id,
            tier=request.tier,
            model=request.model,
            requested_model=request.requested_model,
            alias=request.alias,
            worker_id=self.worker_id,
            status=self.status,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=max(0, usage.completion_tokens - inherited),
            prior_completion_tokens=inherited,
            cached_tokens=usage.cached_tokens,
            gpu_ms=(self._clock() - self._started) * 1000,
            created_at=self._wall(),
        )
