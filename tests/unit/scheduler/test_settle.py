"""The registry's fast paths (`scheduler/workers.py`) against the full computations they
replace, through randomized runs: a heartbeat settled from what changed since the last
one against set operations over everything it lists; the unknown flights a heartbeat
tells of looked for only when the counts say one may be there; the journal's unread
floors kept per changed worker against a walk over every worker's flights not
started; lost workers found without a scan until one can be lost. Each must leave the
registry exactly as the full computation does."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from scheduler.fair_queue import FairQueue
from scheduler.workers import Registry, Settled, WorkerState
from schemas.events import GenerationRequest, WorkerHeartbeat
from tests.support.scheduler import make_request


class FullSettleWorker(WorkerState):
    """The settle without fast paths: set operations over all that a heartbeat lists
    and every flight (the refresh around it is the registry's own)."""

    __slots__ = ()

    def _changed(self, listed: dict[str, None], handed_back: frozenset[str]) -> set[str]:
        """Over every flight and everything listed (not only what changed since `listed`)."""
        active = set(self.active)
        for request_id in self._unstarted & active:
            self.in_flight[request_id].started = True
        self._unstarted -= active
        return set(self.in_flight.keys() - (active - handed_back))


class FullRegistry(Registry):
    """The registry without fast paths: every heartbeat looks for unknown flights, the
    unread floors and the lost workers are scans."""

    def worker(self, worker_id: str, model: str, now: float) -> WorkerState:
        worker = self.workers.get(worker_id)
        if worker is None:
            worker = self.workers[worker_id] = FullSettleWorker(worker_id, model, (), 0, now)
        return worker

    def _may_tell_of_unknown(self, worker: WorkerState, heartbeat: WorkerHeartbeat) -> bool:
        return True  # every heartbeat's assignments are looked through

    def unread(self) -> dict[int, int]:
        """Every worker's flights not started (a flight it runs, it has read)."""
        scan: dict[int, int] = {}
        for worker in self.workers.values():
            for flight in worker.unread():
                scan[flight.partition] = min(
                    scan.get(flight.partition, flight.offset), flight.offset
                )
        return scan

    def remove_lost(self, deadline: float) -> list[WorkerState]:
        lost = [w for w in self.workers.values() if w.last_seen < deadline]
        for worker in lost:
            del self.workers[worker.worker_id]
            for request_id in worker.in_flight:
                self._forget(worker, request_id)
        return lost


@dataclass
class Engine:
    """A worker process as its heartbeats tell of it."""

    worker_id: str
    partitions: tuple[int, ...]
    incarnation: str = "i0"
    slots: int = 6
    stopping: bool = False
    consumed: dict[int, int] = field(default_factory=dict)
    running: dict[str, tuple[int, int]] = field(default_factory=dict)
    unread: list[tuple[int, int, str]] = field(default_factory=list)  # (partition, offset, id)
    handed_back: dict[str, tuple[int, int]] = field(default_factory=dict)
    listed_too: set[str] = field(default_factory=set)  # handed back and still listed

    def heartbeat(self) -> WorkerHeartbeat:
        active = tuple(self.running) + tuple(self.listed_too)
        return WorkerHeartbeat(
            worker_id=self.worker_id,
            incarnation=self.incarnation,
            model="big",
            partitions=self.partitions,
            max_slots=self.slots,
            active=active,
            consumed=dict(self.consumed),
            assignments={**self.handed_back, **self.running},
            handed_back=tuple(self.handed_back),
            stopping=self.stopping,
        )


class Run:
    """The two registries driven alike by random dispatches, acknowledgements (late or
    never), reads, ends, hand-backs, restarts, partition moves, unknown flights, drops
    and lost workers."""

    def __init__(self, seed: int, workers: int = 4) -> None:
        self.rng = random.Random(seed)
        self.fast, self.full = Registry(), FullRegistry()
        self.engines = {f"w{i}": Engine(f"w{i}", (2 * i,)) for i in range(workers)}
        self.ends: dict[int, int] = {}  # partition -> next offset on chat.work
        self.now = 0.0
        self.serial = 0
        self.unacknowledged: list[tuple[str, GenerationRequest, int]] = []
        self.seen = {
            "finished": 0,
            "orphaned": 0,
            "handed_back": 0,
            "lost": 0,
            "learned": 0,
            "unread": 0,
            "workers lost": 0,
        }

    def step(self) -> None:
        self.now += self.rng.uniform(0.0, 0.3)
        action = self.rng.choices(
            [
                self.dispatch,
                self.acknowledge,
                self.read,
                self.end,
                self.hand_back,
                self.restart,
                self.move,
                self.unknown,
                self.drop,
                self.beat,
                self.lose,
            ],
            [20, 6, 10, 10, 2, 1, 1, 2, 2, 25, 1],
        )[0]
        action()

    def both(self) -> tuple[Registry, Registry]:
        return self.fast, self.full

    def dispatch(self) -> None:
        engine = self.rng.choice(list(self.engines.values()))
        if engine.worker_id not in self.fast.workers:
            return
        self.serial += 1
        request = make_request(f"r{self.serial}")
        offset = None
        for registry in self.both():
            worker = registry.workers[engine.worker_id]
            partition = worker.next_partition() if worker.partitions else engine.partitions[0]
            registry.hand_out(worker, request, partition, self.now)
        offset = self.ends.get(partition, 0)
        self.ends[partition] = offset + 1
        engine.unread.append((partition, offset, request.request_id))
        self.unacknowledged.append((engine.worker_id, request, offset))
        if self.rng.random() < 0.6:  # else acknowledged later, or never
            self.acknowledge()

    def acknowledge(self) -> None:
        """A write not acknowledged yet is now (its worker may have read it already)."""
        if self.unacknowledged:
            worker_id, request, offset = self.unacknowledged.pop(
                self.rng.randrange(len(self.unacknowledged))
            )
            for registry in self.both():
                registry.acknowledged(worker_id, request, offset)

    def read(self) -> None:
        engine = self.rng.choice(list(self.engines.values()))
        count = self.rng.randint(0, len(engine.unread))
        for partition, offset, request_id in engine.unread[:count]:
            if partition in engine.partitions:
                engine.running[request_id] = (partition, offset)
            engine.consumed[partition] = max(engine.consumed.get(partition, 0), offset + 1)
        del engine.unread[:count]

    def end(self) -> None:
        engine = self.rng.choice(list(self.engines.values()))
        for request_id in self.rng.sample(
            list(engine.running), min(len(engine.running), self.rng.randint(1, 3))
        ):
            del engine.running[request_id]

    def hand_back(self) -> None:
        engine = self.rng.choice(list(self.engines.values()))
        engine.stopping = True
        for request_id in list(engine.running)[:2]:
            engine.handed_back[request_id] = engine.running.pop(request_id)
            if self.rng.random() < 0.3:
                engine.listed_too.add(request_id)

    def restart(self) -> None:
        engine = self.rng.choice(list(self.engines.values()))
        engine.incarnation = f"i{self.now}"
        engine.running.clear()
        engine.unread.clear()
        engine.handed_back.clear()
        engine.listed_too.clear()
        engine.stopping = False

    def move(self) -> None:
        engine = self.rng.choice(list(self.engines.values()))
        engine.partitions = (self.rng.randrange(12),)

    def unknown(self) -> None:
        """The engine runs a request this scheduler never handed out (a restart)."""
        engine = self.rng.choice(list(self.engines.values()))
        self.serial += 1
        partition = engine.partitions[0]
        engine.running[f"x{self.serial}"] = (partition, self.ends.get(partition, 0))
        self.ends[partition] = self.ends.get(partition, 0) + 1

    def drop(self) -> None:
        held = list(self.fast._holder)
        if held:
            request_id = self.rng.choice(held)
            for registry in self.both():
                registry.drop(request_id)

    def beat(self) -> None:
        engine = self.rng.choice(list(self.engines.values()))
        heartbeat = engine.heartbeat()
        fast = self.fast.on_heartbeat(heartbeat, self.now, ())
        full = self.full.on_heartbeat(heartbeat, self.now, ())
        assert _ids(fast) == _ids(full)
        for name, ids in zip(
            ("finished", "orphaned", "handed_back", "lost"), _ids(fast), strict=True
        ):
            self.seen[name] += len(ids)
        self.seen["learned"] += sum(
            f.request is None for f in self.fast.workers[engine.worker_id].in_flight.values()
        )
        engine.handed_back.clear()
        engine.listed_too.clear()
        engine.stopping = False

    def lose(self) -> None:
        deadline = self.now - self.rng.uniform(0.0, 3.0)
        fast = [w.worker_id for w in self.fast.remove_lost(deadline)]
        assert fast == [w.worker_id for w in self.full.remove_lost(deadline)]
        self.seen["workers lost"] += len(fast)

    def check(self) -> None:
        assert _state(self.fast) == _state(self.full)
        for worker in self.fast.workers.values():  # the load kept as a count
            assert worker.load == len(worker.active.keys() | worker.in_flight.keys())
        unread = self.fast.unread()
        assert unread == self.full.unread()
        self.seen["unread"] += bool(unread)
        fast, full = self.fast.most_free("big"), self.full.most_free("big")
        assert (fast and fast.worker_id) == (full and full.worker_id)


def _ids(settled: Settled) -> tuple[list[str], ...]:
    return tuple(
        [f.request_id for f in flights]
        for flights in (settled.finished, settled.orphaned, settled.handed_back, settled.lost)
    )


def _state(registry: Registry) -> object:
    workers = {
        worker_id: (
            sorted(
                (r, f.started, f.offset, f.partition, f.request is None)
                for r, f in w.in_flight.items()
            ),
            sorted(w._unstarted),
            w.load,
            w.free_slots,
            sorted(w.active),
            w.incarnation,
            w.partitions,
            w.last_seen,
        )
        for worker_id, w in registry.workers.items()
    }
    holders = sorted((r, w.worker_id) for r, w in registry._holder.items())
    return workers, holders, list(registry.decided.items())


@pytest.mark.parametrize("seed", range(6))
def test_the_fast_paths_leave_the_registry_as_the_full_settle_does(seed: int) -> None:
    run = Run(seed)
    for _ in range(1500):
        run.step()
        run.check()
    assert min(run.seen.values()) > 0, run.seen  # every kind of change was there to settle


def test_a_heartbeat_that_changes_nothing_leaves_the_registry_as_it_was() -> None:
    run = Run(seed=99)
    for _ in range(400):
        run.step()
    for engine in run.engines.values():
        run.fast.on_heartbeat(engine.heartbeat(), run.now, ())
        run.full.on_heartbeat(engine.heartbeat(), run.now, ())
    before = _state(run.fast)
    for engine in run.engines.values():
        assert _ids(run.fast.on_heartbeat(engine.heartbeat(), run.now, ())) == ([], [], [], [])
    assert _state(run.fast) == before
    run.check()


def test_a_flight_learned_from_a_heartbeat_settles_on_the_next_one() -> None:
    """A flight only a heartbeat told of is listed and not started: the count check
    then says a listed flight may be unknown, and the next heartbeat settles it."""
    run = Run(seed=3, workers=1)
    engine = run.engines["w0"]
    run.beat()
    run.unknown()
    run.beat()
    run.check()
    worker = run.fast.workers["w0"]
    assert len(worker.in_flight) == 1 and not worker.knows_all_it_runs()
    run.beat()
    assert worker.knows_all_it_runs()
    engine.running.clear()
    run.beat()
    run.check()
    assert run.fast.workers["w0"].in_flight == {}


@pytest.mark.parametrize("seed", range(20))
def test_the_queue_head_is_the_start_of_the_walk(seed: int) -> None:
    rng = random.Random(seed)
    queue = FairQueue()
    orgs = rng.choice([3, 20, 40, 200])
    for i in range(rng.randint(0, 300)):
        user = int(50 * rng.paretovariate(1.2)) % 50
        queue.push(
            make_request(f"r{i}", user=f"u{user}", org=f"o{user % orgs}"), front=rng.random() < 0.1
        )
        if rng.random() < 0.2:
            queue.pop()
    for count in (0, 1, 5, 32, 400):
        assert [r.request_id for r in queue.first(count)] == [
            r.request_id for r, _ in zip(queue, range(count), strict=False)
        ]
