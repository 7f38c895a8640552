"""The scheduler's decisions: pure, synchronous, no Kafka (STYLE 1).

It holds the waiting set and a registry of workers built from heartbeats, and
hands each request to a worker that serves its model and has a free slot,
highest tier first. Each engine's own queue stays short, so priority is
decided here, globally (DESIGN §5).
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from schemas.events import GenerationRequest, WorkerHeartbeat
from schemas.topics import Tier


@dataclass(frozen=True, slots=True)
class Dispatch:
    request: GenerationRequest
    worker_id: str
    partition: int


@dataclass(slots=True)
class _InFlight:
    partition: int
    offset: int | None = None  # known once the assignment is acknowledged


@dataclass(slots=True)
class WorkerState:
    worker_id: str
    model: str
    partitions: tuple[int, ...]
    max_slots: int
    last_seen: float
    active: frozenset[str] = frozenset()
    consumed: dict[int, int] = field(default_factory=dict)
    in_flight: dict[str, _InFlight] = field(default_factory=dict)
    stopping: bool = False
    _next_partition: Iterator[int] | None = None

    @property
    def load(self) -> int:
        return len(self.active | self.in_flight.keys())

    @property
    def free_slots(self) -> int:
        return 0 if self.stopping else max(0, self.max_slots - self.load)

    def next_partition(self) -> int:
        if self._next_partition is None:
            self._next_partition = itertools.cycle(self.partitions)
        return next(self._next_partition)

    def refresh(self, heartbeat: WorkerHeartbeat, now: float) -> None:
        if heartbeat.partitions != self.partitions:
            self._next_partition = None
        self.model = heartbeat.model
        self.partitions = heartbeat.partitions
        self.max_slots = heartbeat.max_slots
        self.active = frozenset(heartbeat.active)
        self.consumed = dict(heartbeat.consumed)
        self.stopping = heartbeat.stopping
        self.last_seen = now
        self._drop_consumed()

    def _drop_consumed(self) -> None:
        """An assignment the worker has read is counted through `active` from now on."""
        for request_id, flight in list(self.in_flight.items()):
            read_up_to = self.consumed.get(flight.partition, 0)
            if flight.offset is not None and flight.offset < read_up_to:
                del self.in_flight[request_id]


class Scheduler:
    """Waiting set + worker registry. `clock` is monotonic seconds; `wall` is epoch."""

    def __init__(
        self,
        worker_lost_after_s: float = 5.0,
        clock: Callable[[], float] | None = None,
        wall: Callable[[], float] | None = None,
    ) -> None:
        self._clock = clock or time.monotonic
        self._wall = wall or time.time
        self._lost_after = worker_lost_after_s
        self._waiting: dict[Tier, deque[GenerationRequest]] = {tier: deque() for tier in Tier}
        self._waiting_ids: set[str] = set()
        self.workers: dict[str, WorkerState] = {}

    # --- requests -------------------------------------------------------------------

    def add_request(self, request: GenerationRequest) -> bool:
        """Queue a request; False if it is already waiting (a redelivery)."""
        if request.request_id in self._waiting_ids:
            return False
        self._waiting[request.tier].append(request)
        self._waiting_ids.add(request.request_id)
        return True

    def cancel(self, request_id: str) -> GenerationRequest | None:
        """Drop a waiting request; returns it, or None if it is not waiting."""
        if request_id not in self._waiting_ids:
            return None
        for queue in self._waiting.values():
            for request in queue:
                if request.request_id == request_id:
                    queue.remove(request)
                    self._waiting_ids.discard(request_id)
                    return request
        return None

    @property
    def waiting_count(self) -> int:
        return len(self._waiting_ids)

    def waiting(self) -> list[GenerationRequest]:
        """Waiting requests in the order they would be dispatched."""
        return [request for tier in Tier for request in self._waiting[tier]]

    def expire(self) -> list[GenerationRequest]:
        """Drop and return waiting requests whose deadline has passed."""
        now = self._wall()
        expired = [r for r in self.waiting() if r.deadline is not None and r.deadline < now]
        for request in expired:
            self.cancel(request.request_id)
        return expired

    # --- workers --------------------------------------------------------------------

    def on_heartbeat(self, heartbeat: WorkerHeartbeat) -> None:
        now = self._clock()
        worker = self.workers.get(heartbeat.worker_id)
        if worker is None:
            worker = WorkerState(
                worker_id=heartbeat.worker_id,
                model=heartbeat.model,
                partitions=heartbeat.partitions,
                max_slots=heartbeat.max_slots,
                last_seen=now,
            )
            self.workers[heartbeat.worker_id] = worker
        worker.refresh(heartbeat, now)

    def on_dispatched(self, request_id: str, worker_id: str, offset: int) -> None:
        """The assignment is on `chat.work` at `offset`."""
        worker = self.workers.get(worker_id)
        if worker is not None and request_id in worker.in_flight:
            worker.in_flight[request_id].offset = offset

    def remove_lost_workers(self) -> list[str]:
        """Forget workers whose heartbeats stopped; returns their ids.

        Their unfinished assignments come back through Kafka: a worker commits
        a `chat.work` offset only when the request ends, so the partition's
        next owner reads them again.
        """
        deadline = self._clock() - self._lost_after
        lost = [w.worker_id for w in self.workers.values() if w.last_seen < deadline]
        for worker_id in lost:
            del self.workers[worker_id]
        return lost

    # --- decisions ------------------------------------------------------------------

    def schedule(self) -> list[Dispatch]:
        """Hand out as many waiting requests as free slots allow, highest tier first."""
        dispatches: list[Dispatch] = []
        for tier in Tier:
            queue = self._waiting[tier]
            skipped: list[GenerationRequest] = []
            while queue:
                request = queue.popleft()
                worker = self._pick_worker(request)
                if worker is None:
                    skipped.append(request)
                    continue
                partition = worker.next_partition()
                worker.in_flight[request.request_id] = _InFlight(partition)
                self._waiting_ids.discard(request.request_id)
                dispatches.append(Dispatch(request, worker.worker_id, partition))
            queue.extendleft(reversed(skipped))
        return dispatches

    def _pick_worker(self, request: GenerationRequest) -> WorkerState | None:
        candidates = [
            w
            for w in self.workers.values()
            if w.model == request.model and w.partitions and w.free_slots > 0
        ]
        return max(candidates, key=lambda w: w.free_slots, default=None)
