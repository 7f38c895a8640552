"""The worker registry: what each worker runs and can still take, from its heartbeats."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

from schemas.events import GenerationRequest, WorkerHeartbeat


@dataclass(slots=True)
class InFlight:
    """A request handed to a worker and not yet known to have ended."""

    request: GenerationRequest
    partition: int
    dispatched_at: float
    offset: int | None = None  # known once the assignment is acknowledged


@dataclass(slots=True)
class Settled:
    """What a heartbeat tells about earlier dispatches."""

    finished: list[InFlight] = field(default_factory=list)
    orphaned: list[InFlight] = field(default_factory=list)  # partition moved before it was read


@dataclass(slots=True)
class WorkerState:
    worker_id: str
    model: str
    partitions: tuple[int, ...]
    max_slots: int
    last_seen: float
    active: frozenset[str] = frozenset()
    consumed: dict[int, int] = field(default_factory=dict)
    progress: dict[str, tuple[int, int]] = field(default_factory=dict)
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

    def refresh(self, heartbeat: WorkerHeartbeat, now: float) -> Settled:
        if heartbeat.partitions != self.partitions:
            self._next_partition = None
        self.model = heartbeat.model
        self.partitions = heartbeat.partitions
        self.max_slots = heartbeat.max_slots
        self.active = frozenset(heartbeat.active)
        self.consumed = dict(heartbeat.consumed)
        self.progress = dict(heartbeat.progress)
        self.engine_waiting = heartbeat.waiting
        self.free_kv_blocks = heartbeat.free_kv_blocks
        self.stopping = heartbeat.stopping
        self.last_seen = now
        return self._settle()

    def _settle(self) -> Settled:
        settled = Settled()
        for request_id, flight in list(self.in_flight.items()):
            if flight.offset is None or request_id in self.active:
                continue
            if flight.offset < self.consumed.get(flight.partition, 0):
                settled.finished.append(self.in_flight.pop(request_id))
            elif flight.partition not in self.partitions:
                settled.orphaned.append(self.in_flight.pop(request_id))
        return settled
