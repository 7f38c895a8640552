"""The worker registry: what each worker runs and can still take, from its heartbeats,
and the last decision about each recent request (from the journal after a restart).

At scale (a thousand workers of up to 256 slots, thousands of decisions a second) no
decision scans the workers: each worker keeps its load as a count, the registry knows
which worker holds each request, `FreeSlots` finds the worker of a model with the
most free slots in logarithmic time, and `SlotTotals` keeps the sums over every worker
that the status and the wait estimates read after each batch.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections import OrderedDict
from collections.abc import Container, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from scheduler.shares import RunningShares
from schemas.events import (
    GenerationRequest,
    SchedulerClaim,
    Unserved,
    WorkAssignment,
    WorkerHeartbeat,
)

DECISION_MEMORY = 100_000
V = TypeVar("V")
_NONE: frozenset[str] = frozenset()
_dispatch_order = itertools.count()
_registration_order = itertools.count()


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
    order: int = field(default_factory=_dispatch_order.__next__)


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
    active: dict[str, None] = field(default_factory=dict)
    """What its last heartbeat lists as running, as dictionary keys: a dictionary of
    strings is out of the garbage collector's sight (a set is not), and a thousand
    workers' lists would otherwise make every young collection walk them."""
    consumed: dict[int, int] = field(default_factory=dict)
    in_flight: dict[str, InFlight] = field(default_factory=dict)
    engine_waiting: int = 0
    free_kv_blocks: int | None = None
    stopping: bool = False
    _next_partition: Iterator[int] | None = None
    load: int = 0
    """Requests it runs or has been handed: `active` and `in_flight` together."""
    registered: int = field(default_factory=_registration_order.__next__)
    _unstarted: set[str] = field(default_factory=set)

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

    def add_flight(self, flight: InFlight) -> None:
        request_id = flight.request_id
        if request_id not in self.in_flight and request_id not in self.active:
            self.load += 1
        self.in_flight[request_id] = flight
        if not flight.started:
            self._unstarted.add(request_id)

    def pop_flight(self, request_id: str) -> InFlight | None:
        flight = self.in_flight.pop(request_id, None)
        if flight is not None:
            self._unstarted.discard(request_id)
            if request_id not in self.active:
                self.load -= 1
        return flight

    def has_read(self, flight: InFlight) -> bool:
        """The worker has read `flight`'s assignment (its heartbeat says so)."""
        return flight.offset is not None and flight.offset < self.consumed.get(flight.partition, 0)

    def unread(self) -> Iterator[InFlight]:
        """Its flights whose assignment it has not read yet. Only a flight not started
        can be one (a flight it runs, it has read): O(flights not started), not
        O(flights), for the journal's commit after every batch."""
        for request_id in self._unstarted:
            flight = self.in_flight.get(request_id)
            if flight is not None and flight.offset is not None and not self.has_read(flight):
                yield flight

    def first_unread(self) -> dict[int, int]:
        """Per partition, the offset of its first assignment it has not read yet."""
        first: dict[int, int] = {}
        for flight in self.unread():
            partition, offset = flight.partition, flight.offset
            assert offset is not None
            if offset < first.get(partition, offset + 1):
                first[partition] = offset
        return first

    def knows_all_it_runs(self) -> bool:
        """Every request its last heartbeat lists is in flight here: O(1), from the
        counts. After a refresh, the flights it does not list are exactly those not
        started, and it lists none of those; a flight learned from the heartbeat since
        (listed, not started yet) makes this False, which only costs the full check."""
        return len(self.active) == len(self.in_flight) - len(self._unstarted)

    def refresh(self, heartbeat: WorkerHeartbeat, now: float) -> Settled:
        lost: list[InFlight] = []
        listed = self.active  # what the previous heartbeat listed
        if heartbeat.incarnation != self.incarnation:
            # Another process under this worker id: what the last one held is lost.
            if self.incarnation:
                lost, self.in_flight = list(self.in_flight.values()), {}
                self._unstarted.clear()
            self.incarnation = heartbeat.incarnation
        if heartbeat.partitions != self.partitions:
            self._next_partition = None
        self.model = heartbeat.model
        self.partitions = heartbeat.partitions
        self.max_slots = heartbeat.max_slots
        self.active = dict.fromkeys(heartbeat.active)
        self.consumed = dict(heartbeat.consumed)
        self.engine_waiting = heartbeat.waiting
        self.free_kv_blocks = heartbeat.free_kv_blocks
        self.stopping = heartbeat.stopping
        self.last_seen = now
        handed_back = self._handed_back(heartbeat) if heartbeat.handed_back else _NONE
        settled = self._settle(listed, handed_back)
        settled.lost = lost
        # What it runs and what it was handed and does not list yet (not started).
        self.load = len(self.active) + len(self._unstarted)
        return settled

    def _handed_back(self, heartbeat: WorkerHeartbeat) -> frozenset[str]:
        """The requests the heartbeat hands back, but for one whose attempt in flight here
        is a later one than the attempt handed back (it was dispatched again since)."""
        attempts = heartbeat.handed_back_attempts
        in_flight = self.in_flight

        def later(request_id: str) -> bool:
            flight = in_flight.get(request_id)
            given = attempts.get(request_id)
            return (
                given is not None
                and flight is not None
                and flight.request is not None
                and flight.request.attempt > given
            )

        return frozenset(r for r in heartbeat.handed_back if not later(r))

    def _settle(self, listed: dict[str, None], handed_back: frozenset[str]) -> Settled:
        """A loop only over the flights whose state changed (`_changed`: not running, or
        handed back), in dispatch order."""
        settled = Settled()
        in_flight = self.in_flight
        changed = self._changed(listed, handed_back)
        if not changed:
            return settled
        for flight in sorted((in_flight[r] for r in changed), key=_in_order):
            if flight.request_id in handed_back:
                settled.handed_back.append(flight)
            elif flight.started or (flight.offset is not None and self.has_read(flight)):
                settled.finished.append(flight)
            elif flight.offset is None or flight.partition in self.partitions:
                continue
            else:
                settled.orphaned.append(flight)
            del in_flight[flight.request_id]
            self._unstarted.discard(flight.request_id)
        return settled

    def _changed(self, listed: dict[str, None], handed_back: frozenset[str]) -> set[str]:
        """Mark the flights listed now started; return those not listed now or handed
        back, by set operations that never copy the whole running set.

        A flight is started, and then listed by the previous heartbeat (`listed`), or
        not started (`_unstarted`): so the flights not listed now are those listed before
        and not now, and those not started (none of which is listed now). A flight
        learned from a heartbeat is not started and listed: the next one settles it."""
        in_flight, unstarted, active = self.in_flight, self._unstarted, self.active
        if unstarted:
            started = unstarted & active.keys()
            for request_id in started:
                in_flight[request_id].started = True
            unstarted -= started
        changed = {r for r in listed.keys() - active.keys() if r in in_flight}
        changed |= unstarted
        if handed_back:
            changed.update(r for r in handed_back if r in in_flight)
        return changed


def _in_order(flight: InFlight) -> int:
    return flight.order


@dataclass(frozen=True, slots=True)
class Decision:
    """The last decision about a request: its `attempt` was handed out (`code` None) or
    ended without a worker with `code`. Learned from a heartbeat: attempt unknown, -1."""

    attempt: int
    code: str | None = None

    def __lt__(self, other: Decision) -> bool:
        """Older: an earlier attempt, or a hand-out before an end of the same attempt."""
        return (self.attempt, self.code is not None) < (other.attempt, other.code is not None)


@functools.cache
def _handed_out(attempt: int) -> Decision:
    """`Decision(attempt)`, one per attempt (it is immutable)."""
    return Decision(attempt)


class Registry:
    """Every worker with the requests handed to it, and the last decision about each
    recent request, so a request is never handed out twice nor ended and then run."""

    def __init__(self) -> None:
        self.workers: dict[str, WorkerState] = {}
        self.decided: OrderedDict[str, Decision] = OrderedDict()
        self._claimed: dict[int, int] = {}
        self._holder: dict[str, WorkerState] = {}  # request id -> the worker it is in flight on
        self.shares = RunningShares()
        """Who holds each model's running slots (`scheduler.shares`)."""
        self._free = FreeSlots()
        self.totals = SlotTotals()
        """Free and busy slots over every worker, and the workers taking each model's work."""
        self._unread = _FirstUnread()
        self._seen_since = -math.inf
        """No worker was last heard of before this (`remove_lost` scans only after it)."""

    def worker(self, worker_id: str, model: str, now: float) -> WorkerState:
        """The worker's state; a new one has no partitions, hence no free slot, until
        its heartbeat says more."""
        worker = self.workers.get(worker_id)
        if worker is None:
            worker = self.workers[worker_id] = WorkerState(worker_id, model, (), 0, now)
            self._seen_since = min(self._seen_since, now)
        return worker

    def most_free(self, model: str) -> WorkerState | None:
        """The worker serving `model` with the most free slots (of equals, the one known
        longest); None if none has a free slot."""
        return self._free.most_free(model, self.workers)

    def hand_out(
        self,
        worker: WorkerState,
        request: GenerationRequest,
        partition: int,
        now: float,
        offset: int | None = None,
    ) -> None:
        request_id = request.request_id
        if request_id in self._holder:
            self.drop(request_id)
        self._add(worker, InFlight(request_id, request, partition, now, offset))
        self.decide(request_id, _handed_out(request.attempt))

    def _add(self, worker: WorkerState, flight: InFlight) -> None:
        worker.add_flight(flight)
        self._holder[flight.request_id] = worker
        if flight.request is not None:
            self.shares.add(flight.request)
        self._changed(worker)
        self._unread.stale(worker.worker_id)

    def _changed(self, worker: WorkerState) -> None:
        """Its load, slots or state may have changed."""
        self._free.changed(worker)
        self.totals.changed(worker)

    def acknowledged(self, worker_id: str, request: GenerationRequest, offset: int) -> None:
        """The assignment of `request` (as sent) is on `chat.work` at `offset`."""
        worker = self.workers.get(worker_id)
        flight = worker.in_flight.get(request.request_id) if worker is not None else None
        if flight is not None:
            if flight.request is None:  # learned from a heartbeat: not counted yet
                self.shares.add(request)
            flight.request, flight.offset = request, offset
            self._unread.stale(worker_id)

    def decide(self, request_id: str, decision: Decision) -> None:
        remember(self.decided, request_id, decision, DECISION_MEMORY)

    def flight(self, request_id: str) -> InFlight | None:
        worker = self._holder.get(request_id)
        return None if worker is None else worker.in_flight.get(request_id)

    def holder(self, request_id: str) -> WorkerState | None:
        """The worker `request_id` is in flight on, if any."""
        return self._holder.get(request_id)

    def knows(self, request_id: str) -> bool:
        """Decided, or in flight (a decision may have left the bounded memory)."""
        return request_id in self.decided or request_id in self._holder

    def drop(self, request_id: str) -> None:
        worker = self._holder.pop(request_id, None)
        if worker is not None:
            self.shares.remove(request_id)
            worker.pop_flight(request_id)
            self._changed(worker)
            self._unread.stale(worker.worker_id)

    def on_heartbeat(
        self, heartbeat: WorkerHeartbeat, now: float, waiting: Container[str]
    ) -> Settled:
        """Refresh the worker; learn what it runs, or hands back, that is not known here
        (after a restart): known only by its assignment's place on `chat.work`."""
        worker = self.worker(heartbeat.worker_id, heartbeat.model, now)
        settled = worker.refresh(heartbeat, now)
        self._seen_since = min(self._seen_since, now)
        for flights in (settled.finished, settled.orphaned, settled.handed_back, settled.lost):
            for flight in flights:
                self._forget(worker, flight.request_id)
        self._unread.stale(worker.worker_id)
        if self._may_tell_of_unknown(worker, heartbeat):
            self._learn(worker, heartbeat, now, waiting, settled)
        self._changed(worker)
        return settled

    def _may_tell_of_unknown(self, worker: WorkerState, heartbeat: WorkerHeartbeat) -> bool:
        """Whether the refreshed worker may run, or hand back, a request not in flight
        here: O(1), from the counts (`knows_all_it_runs`)."""
        return bool(heartbeat.handed_back) or not worker.knows_all_it_runs()

    def _learn(
        self,
        worker: WorkerState,
        heartbeat: WorkerHeartbeat,
        now: float,
        waiting: Container[str],
        settled: Settled,
    ) -> None:
        """What the worker runs (in flight on it now) or hands back (in `settled`) that is
        not known here, unless it waits here."""
        handed_back = set(heartbeat.handed_back)
        not_here = heartbeat.assignments.keys() - worker.in_flight.keys()
        for request_id in (
            [
                r
                for r in heartbeat.assignments
                if r in not_here and not (r in self.decided or r in self._holder)
            ]
            if not_here
            else ()
        ):
            if (request_id in worker.active or request_id in handed_back) and (
                request_id not in waiting
            ):
                partition, offset = heartbeat.assignments[request_id]
                flight = InFlight(request_id, None, partition, now, offset)
                self.decide(request_id, Decision(-1))
                if request_id in handed_back:
                    settled.handed_back.append(flight)
                else:
                    self._add(worker, flight)

    def _forget(self, worker: WorkerState, request_id: str) -> None:
        """`request_id` is no longer in flight on `worker`."""
        if self._holder.get(request_id) is worker:
            del self._holder[request_id]
            self.shares.remove(request_id)

    def remove_lost(self, deadline: float) -> list[WorkerState]:
        """Forget the workers last heard of before `deadline`; returns them. A worker's
        `last_seen` only moves on (a heartbeat), so no scan is needed until `deadline`
        passes the earliest one of the last scan."""
        if deadline <= self._seen_since:
            return []
        lost = [w for w in self.workers.values() if w.last_seen < deadline]
        self._seen_since = min(
            (w.last_seen for w in self.workers.values() if w.last_seen >= deadline),
            default=math.inf,
        )
        for worker in lost:
            del self.workers[worker.worker_id]
            self.totals.removed(worker.worker_id)
            self._unread.stale(worker.worker_id)
            for request_id in worker.in_flight:
                self._forget(worker, request_id)
        return lost

    def unread(self) -> dict[int, int]:
        """Per `chat.work` partition, the first assignment in flight that its worker has
        not read yet. Only the workers changed since the last call are looked at
        (`_FirstUnread`): O(changes), for the journal's commit after every batch."""
        return self._unread.first(self.workers)

    def restore(
        self,
        partition: int,
        offset: int,
        event: WorkAssignment | Unserved | SchedulerClaim,
        now: float,
    ) -> None:
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


class _FirstUnread:
    """`Registry.unread`, kept up to date: every change to a worker's flights, their
    offsets or what it consumed marks the worker stale, and a call recomputes only the
    stale workers' first unread offsets (each over its flights not started)."""

    def __init__(self) -> None:
        self._stale: set[str] = set()
        self.stale = self._stale.add
        """Mark a worker (by id) stale."""
        self._of: dict[str, dict[int, int]] = {}  # worker id -> partition -> offset
        self._by: dict[int, dict[str, int]] = {}  # partition -> worker id -> offset
        self._first: dict[int, int] = {}  # partition -> the lowest of `_by`

    def first(self, workers: dict[str, WorkerState]) -> dict[int, int]:
        for worker_id in self._stale:
            worker = workers.get(worker_id)
            now = worker.first_unread() if worker is not None else {}
            before = self._of.pop(worker_id, {})
            if now:
                self._of[worker_id] = now
            for partition in before.keys() - now.keys():
                by = self._by[partition]
                del by[worker_id]
                self._set(partition, by)
            for partition, offset in now.items():
                if before.get(partition) != offset:
                    by = self._by.setdefault(partition, {})
                    by[worker_id] = offset
                    self._set(partition, by)
        self._stale.clear()
        return dict(self._first)

    def _set(self, partition: int, by: dict[str, int]) -> None:
        if by:
            self._first[partition] = min(by.values())
        else:
            del self._by[partition]
            self._first.pop(partition, None)


class SlotTotals:
    """Sums over every worker, kept as each one changes (`changed`, `removed`): its free
    slots, its busy ones (its load, up to its slots) and, per model, the workers taking
    its work now (heartbeating, holding chat.work partitions, not draining)."""

    def __init__(self) -> None:
        self._of: dict[str, tuple[int, int, str | None]] = {}
        self.free = 0
        self.busy = 0
        self._live: dict[str, int] = {}

    def changed(self, worker: WorkerState) -> None:
        live = worker.model if worker.partitions and not worker.stopping else None
        now = (worker.free_slots, min(worker.load, worker.max_slots), live)
        before = self._of.get(worker.worker_id)
        if now == before:
            return
        self._of[worker.worker_id] = now
        self._add(before, -1)
        self._add(now, 1)

    def removed(self, worker_id: str) -> None:
        self._add(self._of.pop(worker_id, None), -1)

    def live(self) -> dict[str, int]:
        """Model -> the workers taking its work now."""
        return dict(self._live)

    def _add(self, of: tuple[int, int, str | None] | None, sign: int) -> None:
        if of is None:
            return
        free, busy, live = of
        self.free += sign * free
        self.busy += sign * busy
        if live is not None:
            count = self._live.get(live, 0) + sign
            if count:
                self._live[live] = count
            else:
                del self._live[live]


class FreeSlots:
    """Per model, a heap of (free slots, worker) with lazy deletion: every change of a
    worker's free slots pushes its new count, and an entry that no longer matches its
    worker is dropped when it comes to the top. Rebuilt when stale entries pile up."""

    def __init__(self) -> None:
        self._heaps: dict[str, list[tuple[int, int, str]]] = {}
        self._entries = 0

    def changed(self, worker: WorkerState) -> None:
        free = worker.free_slots
        if free > 0:
            heapq.heappush(
                self._heaps.setdefault(worker.model, []),
                (-free, worker.registered, worker.worker_id),
            )
            self._entries += 1

    def most_free(self, model: str, workers: dict[str, WorkerState]) -> WorkerState | None:
        if self._entries > 4 * len(workers) + 64:
            self._rebuild(workers)
        heap = self._heaps.get(model)
        while heap:
            negative_free, registered, worker_id = heap[0]
            worker = workers.get(worker_id)
            if (
                worker is not None
                and worker.registered == registered
                and worker.model == model
                and worker.free_slots == -negative_free
            ):
                return worker
            heapq.heappop(heap)
            self._entries -= 1
        return None

    def _rebuild(self, workers: dict[str, WorkerState]) -> None:
        self._heaps, self._entries = {}, 0
        for worker in workers.values():
            self.changed(worker)


def remember(memory: OrderedDict[str, V], key: str, value: V, limit: int) -> None:
    """Set `key` as the newest entry of a memory of at most `limit` entries."""
    if key in memory:
        memory.move_to_end(key)
    memory[key] = value
    while len(memory) > limit:
        memory.popitem(last=False)
