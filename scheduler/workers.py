"""The worker registry: what each worker runs and can still take, from its heartbeats,
and the last decision about each recent request (from the journal after a restart)."""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Container, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from schemas.events import (
    GenerationRequest,
    SchedulerClaim,
    Unserved,
    WorkAssignment,
    WorkerHeartbeat,
)

DECISION_MEMORY = 100_000
V = TypeVar("V")


@dataclass(slots=True)
class InFlight:
    """A request handed to a worker and not yet known to have ended.

    `request` is None while only the worker's heartbeat told of it (after a scheduler
    restart): its assignment on `chat.work` at (`partition`, `offset`) says the rest."""

    request_id: str
    request: GenerationRequest | None
    partition: int
    dispatched_at: float
    offset: int | None = None  # known once the assignment is acknowledged
    started: bool = False
    """A heartbeat listed it running: once it is not, it has ended (wherever its
    partition went meanwhile)."""


@dataclass(slots=True)
class Settled:
    """What a heartbeat tells about earlier dispatches."""

    finished: list[InFlight] = field(default_factory=list)
    orphaned: list[InFlight] = field(default_factory=list)  # partition moved before it was read
    handed_back: list[InFlight] = field(default_factory=list)  # a draining worker gave it back
    lost: list[InFlight] = field(default_factory=list)  # its worker process restarted


@dataclass(slots=True)
class WorkerState:
    worker_id: str
    model: str
    partitions: tuple[int, ...]
    max_slots: int
    last_seen: float
    incarnation: str = ""
    active: frozenset[str] = frozenset()
    consumed: dict[int, int] = field(default_factory=dict)
    in_flight: dict[str, InFlight] = field(default_factory=dict)
    engine_waiting: int = 0
    free_kv_blocks: int | None = None
    stopping: bool = False
    _next_partition: Iterator[int] | None = None

    @property
    def load(self) -> int:
        return len(self.active | self.in_flight.keys())

    @property
    def free_slots(self) -> int:
        """Slots the scheduler may fill: none while the engine queues work of its own
        or its KV cache is exhausted, so priority stays decided here."""
        if self.stopping or not self.partitions or self.engine_waiting > 0:
            return 0
        if self.free_kv_blocks is not None and self.free_kv_blocks <= 0:
            return 0
        return max(0, self.max_slots - self.load)

    def next_partition(self) -> int:
        if self._next_partition is None:
            self._next_partition = itertools.cycle(self.partitions)
        return next(self._next_partition)

    def has_read(self, flight: InFlight) -> bool:
        """The worker has read `flight`'s assignment (its heartbeat says so)."""
        return flight.offset is not None and flight.offset < self.consumed.get(flight.partition, 0)

    def refresh(self, heartbeat: WorkerHeartbeat, now: float) -> Settled:
        lost: list[InFlight] = []
        if heartbeat.incarnation != self.incarnation:
            # Another process under this worker id: what the last one held is lost.
            if self.incarnation:
                lost, self.in_flight = list(self.in_flight.values()), {}
            self.incarnation = heartbeat.incarnation
        if heartbeat.partitions != self.partitions:
            self._next_partition = None
        self.model = heartbeat.model
        self.partitions = heartbeat.partitions
        self.max_slots = heartbeat.max_slots
        self.active = frozenset(heartbeat.active)
        self.consumed = dict(heartbeat.consumed)
        self.engine_waiting = heartbeat.waiting
        self.free_kv_blocks = heartbeat.free_kv_blocks
        self.stopping = heartbeat.stopping
        self.last_seen = now
        settled = self._settle(frozenset(heartbeat.handed_back))
        settled.lost = lost
        return settled

    def _settle(self, handed_back: frozenset[str]) -> Settled:
        settled = Settled()
        for request_id, flight in list(self.in_flight.items()):
            if request_id in handed_back:
                settled.handed_back.append(self.in_flight.pop(request_id))
            elif request_id in self.active:
                flight.started = True
            elif flight.started or (flight.offset is not None and self.has_read(flight)):
                settled.finished.append(self.in_flight.pop(request_id))
            elif flight.offset is None:
                continue
            elif flight.partition not in self.partitions:
                settled.orphaned.append(self.in_flight.pop(request_id))
        return settled


@dataclass(frozen=True, slots=True)
class Decision:
    """The last decision about a request: its `attempt` was handed out (`code` None) or
    ended without a worker with `code`. Learned from a heartbeat: attempt unknown, -1."""

    attempt: int
    code: str | None = None

    def __lt__(self, other: Decision) -> bool:
        """Older: an earlier attempt, or a hand-out before an end of the same attempt."""
        return (self.attempt, self.code is not None) < (other.attempt, other.code is not None)


class Registry:
    """Every worker with the requests handed to it, and the last decision about each
    recent request, so a request is never handed out twice nor ended and then run."""

    def __init__(self) -> None:
        self.workers: dict[str, WorkerState] = {}
        self.decided: OrderedDict[str, Decision] = OrderedDict()
        self._claimed: dict[int, int] = {}

    def worker(self, worker_id: str, model: str, now: float) -> WorkerState:
        """The worker's state; a new one has no partitions, hence no free slot, until
        its heartbeat says more."""
        worker = self.workers.get(worker_id)
        if worker is None:
            worker = self.workers[worker_id] = WorkerState(worker_id, model, (), 0, now)
        return worker

    def hand_out(self, worker: WorkerState, request: GenerationRequest, partition: int,
                 now: float, offset: int | None = None) -> None:
        self.drop(request.request_id)
        worker.in_flight[request.request_id] = InFlight(request.request_id, request, partition,
                                                        now, offset)
        self.decide(request.request_id, Decision(request.attempt))

    def decide(self, request_id: str, decision: Decision) -> None:
        remember(self.decided, request_id, decision, DECISION_MEMORY)

    def flight(self, request_id: str) -> InFlight | None:
        for worker in self.workers.values():
            if request_id in worker.in_flight:
                return worker.in_flight[request_id]
        return None

    def knows(self, request_id: str) -> bool:
        """Decided, or in flight (a decision may have left the bounded memory)."""
        return request_id in self.decided or self.flight(request_id) is not None

    def drop(self, request_id: str) -> None:
        for worker in self.workers.values():
            worker.in_flight.pop(request_id, None)

    def on_heartbeat(self, heartbeat: WorkerHeartbeat, now: float,
                     waiting: Container[str]) -> Settled:
        """Refresh the worker; learn what it runs, or hands back, that is not known here
        (after a restart): known only by its assignment's place on `chat.work`."""
        worker = self.worker(heartbeat.worker_id, heartbeat.model, now)
        settled = worker.refresh(heartbeat, now)
        handed_back = set(heartbeat.handed_back)
        for request_id, (partition, offset) in heartbeat.assignments.items():
            if (request_id in heartbeat.active or request_id in handed_back) and not (
                    request_id in waiting or self.knows(request_id)):
                flight = InFlight(request_id, None, partition, now, offset)
                self.decide(request_id, Decision(-1))
                if request_id in handed_back:
                    settled.handed_back.append(flight)
                else:
                    worker.in_flight[request_id] = flight
        return settled

    def remove_lost(self, deadline: float) -> list[WorkerState]:
        """Forget the workers last heard of before `deadline`; returns them."""
        lost = [w for w in self.workers.values() if w.last_seen < deadline]
        for worker in lost:
            del self.workers[worker.worker_id]
        return lost

    def unread(self) -> dict[int, int]:
        """Per `chat.work` partition, the first assignment in flight that its worker has
        not read yet."""
        unread: dict[int, int] = {}
        for worker in self.workers.values():
            for flight in worker.in_flight.values():
                if flight.offset is not None and not worker.has_read(flight):
                    unread[flight.partition] = min(unread.get(flight.partition, flight.offset),
                                                   flight.offset)
        return unread

    def restore(self, partition: int, offset: int,
                event: WorkAssignment | Unserved | SchedulerClaim, now: float) -> None:
        """Replay one journal record (`chat.work`, in partition order) after a restart:
        a request handed out is in flight again on its worker, one ended stays ended.
        An assignment after a newer claim was fenced: no worker ran it. Of several
        records of one request the latest decision counts."""
        match event:
            case SchedulerClaim():
                self._claimed[partition] = max(self._claimed.get(partition, 0), event.epoch)
            case WorkAssignment() if event.epoch >= self._claimed.get(partition, 0):
                request = event.request
                if self._later(request.request_id, Decision(request.attempt)):
                    worker = self.worker(event.worker_id, request.model, now)
                    self.hand_out(worker, request, partition, now, offset)
            case Unserved():
                decision = Decision(event.attempt, event.code)
                if self._later(event.request_id, decision):
                    self.drop(event.request_id)
                    self.decide(event.request_id, decision)

    def _later(self, request_id: str, decision: Decision) -> bool:
        known = self.decided.get(request_id)
        return known is None or known < decision


def remember(memory: OrderedDict[str, V], key: str, value: V, limit: int) -> None:
    """Set `key` as the newest entry of a memory of at most `limit` entries."""
    memory[key] = value
    memory.move_to_end(key)
    while len(memory) > limit:
        memory.popitem(last=False)
